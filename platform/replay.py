"""The replay benchmark: re-issue recorded agent requests (prompt token ids + sampling) to every arm.

All arms decode the same prompts with the same per-request seeds, passes interleaved by run (run 0 of every
arm, then run 1 ...) so drift of the machine hits every arm alike. Rates are pooled as the paper pools them:
total generated tokens over total decode seconds; acceptance as vLLM counts it (length = 1 + accepted /
drafts; the per-position rate = accepted at depth d / drafts). Untimed warm-up passes come first, so one-time
costs of a first pass (compilation, graph capture) stay out of the timed runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lumotree.agents.protocols import DecodeStats


@dataclass
class CorpusRequest:
    """One recorded model call, enough to issue it again."""

    id: str
    """Where it came from (``sweep:3/attempt:17/request:4``) or the corpus file's own id."""
    prompt_token_ids: list[int]
    """The exact prompt the arm saw."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling parameters as recorded (temperature, top_p, top_k, min_p, presence penalty, ...)."""

    def __post_init__(self) -> None:
        assert self.prompt_token_ids, f"request {self.id} has no prompt token ids"


def export_corpus(requests: Iterable[CorpusRequest], path: str | Path) -> int:
    """Write JSONL (one request per line); returns how many."""
    lines = [json.dumps(asdict(r)) for r in requests]
    Path(path).write_text("".join(line + "\n" for line in lines))
    return len(lines)


def import_corpus(path: str | Path) -> list[CorpusRequest]:
    """Read a JSONL corpus; errors name the line."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(
                CorpusRequest(
                    str(row["id"]), [int(t) for t in row["prompt_token_ids"]], row.get("sampling", {})
                )
            )
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise ValueError(f"{path} line {n}: not a corpus request ({exc})") from None
    return out


def corpus_from_sweep(
    store: Any, sweep_id: int, arm: str | None = None, limit: int | None = None
) -> list[CorpusRequest]:
    """The recorded requests of a sweep's finished attempts (of one arm when given), in attempt/request order.
    Requests recorded without prompt token ids (external servers) are skipped."""
    from sqlalchemy import select

    from lumotree.db import models as m

    query = (
        select(m.Request.attempt_id, m.Request.index, m.Request.prompt_token_ids, m.Request.sampling_params)
        .join(m.Attempt, m.Attempt.id == m.Request.attempt_id)
        .join(m.Arm, m.Arm.id == m.Attempt.arm_id)
        .where(m.Attempt.sweep_id == sweep_id, m.Attempt.status == m.DONE)
        .order_by(m.Request.attempt_id, m.Request.index)
    )
    if arm is not None:
        query = query.where(m.Arm.name == arm)
    out: list[CorpusRequest] = []
    with store.session() as s:
        for attempt_id, index, ids, sampling in s.execute(query):
            if ids:
                out.append(
                    CorpusRequest(f"sweep:{sweep_id}/attempt:{attempt_id}/request:{index}", ids, sampling)
                )
            if limit is not None and len(out) >= limit:
                break
    return out


class ReplayTarget(Protocol):
    """An arm generating from token ids: ``ArmHost`` in-process, or a Ray actor in an ``ActorTarget``."""

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]: ...

    def reset_shared_caches(self) -> None: ...


class ActorTarget:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        import ray

        return ray.get(self.handle.generate.remote(prompt_token_ids, sampling))

    def reset_shared_caches(self) -> None:
        import ray

        ray.get(self.handle.reset_shared_caches.remote())


@dataclass
class RunResult:
    """One arm's pass over the corpus."""

    arm: str
    run_index: int
    stats: DecodeStats
    requests: int
    wall_seconds: float

    def as_row(self) -> dict[str, Any]:
        s = self.stats
        return {
            "requests": self.requests,
            "completion_tokens": s.tokens,
            "decode_seconds": s.decode_seconds,
            "pooled_tok_s": s.tok_s,
            "acceptance_length": s.acceptance_length if s.drafts else None,
            "per_position": per_position_rates(s),
            "spans": dict(s.spans),
            "extra": {
                "steps": s.steps,
                "drafts": s.drafts,
                "draft_tokens": s.draft_tokens,
                "accepted_tokens": s.accepted_tokens,
                "wall_seconds": self.wall_seconds,
            },
        }


def per_position_rates(s: DecodeStats) -> list[float]:
    """vLLM's per-position acceptance rate: accepted at depth d / drafts."""
    return [a / s.drafts for a in s.accepted_per_position] if s.drafts else []


def replay_sampling(recorded: dict[str, Any], max_tokens: int, seed: int, ignore_eos: bool) -> dict[str, Any]:
    """The recorded sampling with the benchmark's budget and a fixed seed (the same for every arm)."""
    keys = ("temperature", "top_p", "top_k", "min_p", "presence_penalty")
    params = {k: recorded[k] for k in keys if recorded.get(k) is not None}
    params.update(max_tokens=max_tokens, seed=seed)
    if ignore_eos:
        params["ignore_eos"] = True
    return params


def run_replay(
    corpus: list[CorpusRequest],
    targets: dict[str, ReplayTarget],
    *,
    runs: int = 3,
    warmup: int = 1,
    max_tokens: int = 1024,
    ignore_eos: bool = False,
    seed: int = 0,
    on_request: Callable[[str, int, int], None] | None = None,
    on_warmup: Callable[[str, int, int], None] | None = None,
) -> list[RunResult]:
    """Every arm over the whole corpus ``runs`` times, interleaved by run; results in (run, arm) order.

    First ``warmup`` untimed passes per arm (same requests, same seeds), whose results are dropped: the first
    pass over a corpus pays one-time costs (kernel compilation, graph capture of new shapes) that would
    otherwise land in run 0 and skew the pooled rates and the ratios between arms. Every pass starts with
    the arms' cross-request caches cleared, as the recorded sweep started: a pass re-issues the same requests
    with the same seeds, so a cache kept from an earlier pass would hold the very outputs being drafted.
    ``on_warmup`` and ``on_request`` get ``(arm, pass or run index, request index)`` after each request."""
    import time

    assert corpus and targets and runs >= 1
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, not {warmup}")

    def one_pass(arm: str, index: int, done: Callable[[str, int, int], None] | None) -> DecodeStats:
        total = DecodeStats()
        targets[arm].reset_shared_caches()
        for i, req in enumerate(corpus):
            out = targets[arm].generate(
                req.prompt_token_ids, replay_sampling(req.sampling, max_tokens, seed + i, ignore_eos)
            )
            total = total + DecodeStats.from_dict(out["stats"])
            if done:
                done(arm, index, i)
        return total

    for w in range(warmup):
        for arm in targets:
            one_pass(arm, w, on_warmup)
    results = []
    for run in range(runs):
        for arm in targets:
            start = time.monotonic()
            stats = one_pass(arm, run, on_request)
            results.append(RunResult(arm, run, stats, len(corpus), time.monotonic() - start))
    return results


def summarize_replay(results: list[RunResult], reference: str | None = None) -> dict[str, Any]:
    """Per arm: pooled tok/s over all runs, per-run range, acceptance length, per-position acceptance, spans
    (seconds per phase, pooled) and the rate relative to every other arm."""
    arms: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(r.arm for r in results):
        mine = [r for r in results if r.arm == arm]
        pooled = DecodeStats()
        for r in mine:
            pooled = pooled + r.stats
        per_run = [r.stats.tok_s for r in mine]
        arms[arm] = {
            "runs": len(mine),
            "requests": mine[0].requests,
            "completion_tokens": pooled.tokens,
            "decode_seconds": pooled.decode_seconds,
            "pooled_tok_s": pooled.tok_s,
            "run_tok_s": per_run,
            "tok_s_min": min(per_run),
            "tok_s_max": max(per_run),
            "steps": pooled.steps,
            "tokens_per_step": pooled.tokens / pooled.steps if pooled.steps else None,
            "ms_per_step": 1000 * pooled.decode_seconds / pooled.steps if pooled.steps else None,
            "acceptance_length": pooled.acceptance_length if pooled.drafts else None,
            "acceptance_rate": pooled.acceptance_rate if pooled.draft_tokens else None,
            "per_position": per_position_rates(pooled),
            "spans": dict(pooled.spans),
        }
    names = list(arms)
    ratios = {
        f"{a}/{b}": (arms[a]["pooled_tok_s"] / arms[b]["pooled_tok_s"] if arms[b]["pooled_tok_s"] else None)
        for a in names
        for b in names
        if a != b
    }
    return {"arms": arms, "ratios": ratios, "reference": reference or names[0]}
