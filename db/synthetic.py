"""A synthetic sweep written through the Store's own functions: for dashboard tests, demos and the benchmark.

Numbers are drawn around the paper's agent study (AR ~10 tok/s, MTP-5 ~25, EAGLE ~28, LumoTree ~27) so pages
look like a real sweep; nothing here claims to be a measurement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lumotree.db.store import AttemptResult, RequestRecord, Store

# name -> (decode tok/s, solve probability, mean accepted drafts per step or 0 for AR)
DEFAULT_ARMS: dict[str, tuple[float, float, float]] = {
    "ar": (10.5, 0.7, 0.0),
    "mtp": (25.0, 0.6, 3.2),
    "eagle": (28.5, 0.5, 3.6),
    "lumotree": (26.6, 0.55, 4.3),
}

PATCH = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-x = {attempt_id}\n+x = 0\n"


@dataclass
class SyntheticSweep:
    """Shape of a synthetic sweep."""

    name: str = "synthetic"
    arms: dict[str, tuple[float, float, float]] = field(default_factory=lambda: dict(DEFAULT_ARMS))
    tasks: int = 5
    attempts: int = 2
    # Requests and agent steps (message + command events) per attempt; 0 keeps big sweeps quick to fill.
    requests_per_attempt: int = 3
    # Attempts left pending (not run), to show a sweep in progress.
    leave_pending: int = 0
    suite: str = "synthetic"
    seed: int = 0


def fill_synthetic_sweep(store: Store, spec: SyntheticSweep) -> int:
    """Create, plan and run the synthetic sweep; returns its id."""
    rng = random.Random(spec.seed)
    sweep_id = store.create_sweep(
        spec.name, {"suite": spec.suite, "arms": list(spec.arms), "attempts": spec.attempts}
    )
    arm_ids = {
        name: store.upsert_arm(sweep_id, name, model="tiny", config={"arm": name}, git_commit="0" * 12)
        for name in spec.arms
    }
    task_ids = [
        store.upsert_task(
            spec.suite, f"synthetic__task-{i:05d}", {"problem_statement": f"Fix bug number {i}."}
        )
        for i in range(spec.tasks)
    ]
    names = {v: k for k, v in arm_ids.items()}
    cells = [(a, t, i) for a in arm_ids.values() for t in task_ids for i in range(spec.attempts)]
    run, pending = cells[: len(cells) - spec.leave_pending], cells[len(cells) - spec.leave_pending :]
    if spec.requests_per_attempt == 0:
        # No per-request rows: write the results in one transaction (10,000 claims would take minutes).
        rows = [(a, t, i, _result(rng, *spec.arms[names[a]], totals=None)) for a, t, i in run]
        store.import_attempts(sweep_id, rows, owner="synthetic")
        store.plan_attempts(sweep_id, list(arm_ids.values()), task_ids, spec.attempts)
    else:
        store.plan_attempts(sweep_id, list(arm_ids.values()), task_ids, spec.attempts)
        for arm_id, task_id, index in run:
            claim = store.start_attempt(sweep_id, arm_id, task_id, index, owner="synthetic")
            assert claim is not None
            tok_s, p_solve, per_step = spec.arms[names[arm_id]]
            totals = _run_requests(store, claim.attempt_id, rng, tok_s, per_step, spec.requests_per_attempt)
            result = _result(rng, tok_s, p_solve, per_step, totals, spec.requests_per_attempt)
            result.patch = PATCH.format(attempt_id=claim.attempt_id)
            store.finish_attempt(claim.attempt_id, "synthetic", result)
    assert len(pending) == spec.leave_pending
    store.set_sweep_status(sweep_id, "done" if spec.leave_pending == 0 else "running")
    return sweep_id


def _run_requests(
    store: Store, attempt_id: int, rng: random.Random, tok_s: float, per_step: float, n: int
) -> dict[str, float]:
    """Record n requests with their message and command events; returns the attempt's totals."""
    totals = dict.fromkeys(("completion", "prompt", "seconds", "drafts", "draft_tokens", "accepted"), 0.0)
    depth = 5 if per_step else 0
    for i in range(n):
        completion = rng.randint(40, 400)
        rate = tok_s * rng.uniform(0.85, 1.15)
        steps = max(1, round(completion / (1 + per_step))) if per_step else completion
        drafts = steps if per_step else 0
        accepted = min(completion - steps, drafts * depth) if per_step else 0
        record = RequestRecord(
            index=i,
            prompt_tokens=1000 + 300 * i,
            completion_tokens=completion,
            steps=steps,
            drafts=drafts,
            draft_tokens=drafts * depth,
            accepted_tokens=accepted,
            accepted_per_position=_per_position(accepted, drafts, depth),
            spans={"draft": 0.2 * completion / rate, "verify": 0.7 * completion / rate} if per_step else {},
            timings={"ttft": 0.05, "decode_seconds": completion / rate},
            decode_seconds=completion / rate,
            prompt_token_ids=list(range(8)),
            sampling_params={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "presence_penalty": 1.0},
            text=f"THOUGHT: step {i}\n```bash\nls -la\n```",
            finish_reason="stop",
        )
        store.record_request(attempt_id, record)
        store.record_event(attempt_id, "message", {"role": "assistant", "content": record.text})
        command = {"command": "ls -la", "exit_code": 0, "output": "total 0\n"}
        store.record_event(attempt_id, "command", command)
        for key, value in zip(
            totals,
            (completion, record.prompt_tokens, completion / rate, drafts, drafts * depth, accepted),
            strict=True,
        ):
            totals[key] += value
    return totals


def _result(
    rng: random.Random,
    tok_s: float,
    p_solve: float,
    per_step: float,
    totals: dict[str, float] | None,
    requests: int = 0,
) -> AttemptResult:
    """An attempt's result from its request totals, or drawn directly when there are no request rows."""
    if totals is None:
        completion = rng.randint(2000, 20000)
        drafts = round(completion / (1 + per_step)) if per_step else 0
        totals = {
            "completion": completion,
            "prompt": 20 * completion,
            "seconds": completion / (tok_s * rng.uniform(0.85, 1.15)),
            "drafts": drafts,
            "draft_tokens": 5 * drafts,
            "accepted": completion - drafts if per_step else 0,
        }
    seconds = totals["seconds"]
    resolved = rng.random() < p_solve
    return AttemptResult(
        resolved=resolved,
        exit_status="submitted" if resolved or rng.random() < 0.5 else "step_limit",
        patch=PATCH.format(attempt_id=0),
        requests=requests,
        prompt_tokens=int(totals["prompt"]),
        completion_tokens=int(totals["completion"]),
        decode_tok_s=totals["completion"] / seconds if seconds else None,
        decode_seconds=seconds,
        drafts=int(totals["drafts"]),
        draft_tokens=int(totals["draft_tokens"]),
        accepted_tokens=int(totals["accepted"]),
        wall_seconds=seconds * 1.3 + 5,
        agent_seconds=seconds * 1.2,
        eval_seconds=4.0,
    )


def _per_position(accepted: int, drafts: int, depth: int) -> list[int]:
    """Accepted counts per draft position, decreasing with depth, summing to ``accepted``."""
    if not drafts or not depth:
        return []
    out, left = [], accepted
    for _ in range(depth):
        take = min(drafts, left)
        out.append(take)
        left -= take
    return out
