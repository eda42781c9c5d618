"""Full-model continuation audit: tree verify + commit against native continuation of the same tokens.

Protocol (after the paper's, with our own native controls): per prefix three schedules of ``cycles``
cycles - *cold* (fresh caches), *resumed* (the cold sequence continues) and *primed* (the cold sequence is
freed and the same prefix runs again in the caches it dirtied); the last cycle of each schedule accepts only
the root. A cycle drafts a random tree rooted at the pending token, verifies it in one tree-mode forward,
forces an accepted path (a random node's root path, so KV remapping is exercised) and commits it. The same
accepted tokens then advance the native controls and the float64 reference (``ref64``):
- ``decode``: plain decoding token by token (the sequential reference process);
- ``prefill``: the accepted tokens as one chunked-prefill chain (the native packed kernels);
- ``capacity``: plain decoding in caches with another block size and pool row (a cache-capacity variant).
Surfaces (errors against float64, relative L2): GDN state, conv history, KV at this cycle's new positions,
KV at earlier positions; and the next-token KL(p64 || p). Per cycle the envelope of a surface is the largest
control error, floored at ``state_floor`` (0.15 nats for KL); the candidate must stay within ``ratio_bound``
times it. Greedy: the candidate's argmax must equal the reference's unless the reference's top-two margin is
within max(0.25, 2 x the controls' largest logit error). The next pending token is the reference's argmax.
Faults (``faults.model_fault``) run short cold schedules on designed trees and must fail a check.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .capture import Loaded, Sequence1, load, prefixes
from .faults import MODEL_FAULTS, PendingBox, model_fault
from .ref64 import Reference64
from .report import AuditReport

SURFACES = ("gdn_state", "conv", "kv_new", "kv_old", "kl")
# A tree whose accepted branch [0, 4, 5] leaves the spine (KV must move) and ends beside a sibling (6).
FAULT_TREE = [-1, 0, 1, 2, 0, 4, 4, 5, 1]
FAULT_PATH = [0, 4, 5]


@dataclass
class ModelAuditConfig:
    """What the continuation audit runs."""

    model: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    """Model dtype (default: the checkpoint's)."""
    prefixes: int = 6
    cycles: int = 7
    """Cycles per schedule (three schedules per prefix)."""
    prefix_len: int = 24
    max_tree: int = 16
    seed: int = 0
    ratio_bound: float = 2.0
    state_floor: float = 0.02
    """Envelope floor for state and KV surfaces (relative L2), as the paper."""
    kl_floor: float = 0.15
    """Envelope floor for next-token KL (nats), as the paper."""
    faults: tuple[str, ...] = MODEL_FAULTS
    fault_prefixes: int = 2
    fault_cycles: int = 2


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30))


def kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    lp = torch.log_softmax(ref_logits.double().cpu(), -1)
    lq = torch.log_softmax(logits.double().cpu(), -1)
    return float((lp.exp() * (lp - lq)).sum())


class Lane:
    """A native control: one sequence advanced by decode steps or one prefill chain per cycle."""

    def __init__(self, loaded: Loaded, kind: str, capacity: int) -> None:
        self.kind = kind
        block = 4 if kind == "capacity" else 16
        self.seq = Sequence1(loaded, capacity, block_size=block, seq_id=1 if kind == "capacity" else 0)
        if kind == "capacity":  # a different pool row and different blocks than the candidate's
            self.seq.caches.free(1)
            self.seq.caches.allocate("pad", 8)
            self.seq.caches.allocate(1, capacity)

    def advance(self, tokens: list[int]) -> torch.Tensor:
        if self.kind == "prefill":
            return self.seq.prefill(tokens)
        out = None
        for t in tokens:
            out = self.seq.decode(t)
        assert out is not None
        return out


def surface_errors(
    seq: Sequence1,
    ref: Reference64,
    new: list[int],
    old: list[int],
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
) -> dict[str, float]:
    k, v = seq.kv_at(new)
    k64, v64 = ref.kv(new)
    out = {
        "gdn_state": rel_l2(seq.gdn_state(), ref.S),
        "conv": rel_l2(seq.conv_state(), ref.conv),
        "kv_new": rel_l2(torch.stack([k, v]), torch.stack([k64, v64])),
        "kl": kl(ref_logits, logits),
    }
    if old:
        k, v = seq.kv_at(old)
        k64, v64 = ref.kv(old)
        out["kv_old"] = rel_l2(torch.stack([k, v]), torch.stack([k64, v64]))
    else:
        out["kv_old"] = 0.0
    return out


def random_tree(rng: random.Random, n: int) -> list[int]:
    return [-1] + [rng.randrange(0, i) for i in range(1, n)]


def root_path(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@dataclass
class Track:
    """Candidate, controls and reference of one sequence, advanced in lockstep."""

    cand: Sequence1
    lanes: list[Lane]
    ref: Reference64
    pending: int


def start(loaded: Loaded, prefix: list[int], cand: Sequence1, ref0: Reference64, capacity: int) -> Track:
    lanes = [Lane(loaded, k, capacity) for k in ("decode", "prefill", "capacity")]
    body = prefix[:-1]
    cand.prefill(body)
    for lane in lanes:
        lane.seq.prefill(body)
    ref = ref0.clone()
    for t in body:
        ref.step(t)
    return Track(cand, lanes, ref, prefix[-1])


def cycle(
    tr: Track, cfg: ModelAuditConfig, rng: random.Random, parents: list[int], path: list[int]
) -> dict[str, Any]:
    """One draft / verify / commit cycle and its measurements."""
    vocab = tr.ref.c.vocab_size
    tokens = [tr.pending] + [rng.randrange(vocab) for _ in parents[1:]]
    before = tr.cand.ctx
    logits, record, _ = tr.cand.tree(tokens, parents)
    acc_tokens = [tokens[i] for i in path]
    ref_logits = None
    for t in acc_tokens:
        ref_logits = tr.ref.step(t)
    assert ref_logits is not None
    PendingBox.token = int(torch.argmax(ref_logits))
    tr.cand.model.commit(record, torch.tensor([path]), tr.cand.caches)
    tr.cand.ctx += len(path)
    cand_logits = logits[path[-1]]
    new, old = list(range(before, tr.cand.ctx)), list(range(before))
    row: dict[str, Any] = {"nodes": len(parents), "accepted": len(path)}
    errs = surface_errors(tr.cand, tr.ref, new, old, cand_logits, ref_logits)
    ctrl: dict[str, float] = {s: 0.0 for s in SURFACES}
    logit_err = 0.0
    for lane in tr.lanes:
        lg = lane.advance(acc_tokens)
        e = surface_errors(lane.seq, tr.ref, new, old, lg, ref_logits)
        for s in SURFACES:
            ctrl[s] = max(ctrl[s], e[s])
        logit_err = max(logit_err, float((lg.double().cpu() - ref_logits).abs().max()))
    for s in SURFACES:
        env = max(ctrl[s], cfg.kl_floor if s == "kl" else cfg.state_floor)
        row[s] = errs[s]
        row[f"{s}_ratio"] = errs[s] / env
        row[f"{s}_raw_ratio"] = errs[s] / ctrl[s] if ctrl[s] > 0 else (0.0 if errs[s] == 0 else float("inf"))
    top2 = torch.topk(ref_logits, 2).values
    margin = float(top2[0] - top2[1])
    agree = int(torch.argmax(cand_logits.double().cpu())) == PendingBox.token
    row["greedy_agree"] = agree
    row["greedy_ok"] = agree or margin <= max(0.25, 2 * logit_err)
    tr.pending = PendingBox.token
    return row


def cycle_ok(row: dict[str, Any], cfg: ModelAuditConfig) -> bool:
    return row["greedy_ok"] and all(row[f"{s}_ratio"] <= cfg.ratio_bound for s in SURFACES)


def run_prefix(
    loaded: Loaded,
    prefix: list[int],
    cfg: ModelAuditConfig,
    ref0: Reference64,
    seed: int,
    progress: Callable[[int], None] | None,
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    capacity = len(prefix) + 3 * cfg.cycles * cfg.max_tree + 32
    cand = Sequence1(loaded, capacity, seq_id=0)
    rows = []

    def schedule(name: str, tr: Track) -> None:
        for c in range(cfg.cycles):
            parents = random_tree(rng, rng.randint(2, cfg.max_tree))
            path = [0] if c == cfg.cycles - 1 else root_path(parents, rng.randrange(1, len(parents)))
            rows.append({"schedule": name, "cycle": c, **cycle(tr, cfg, rng, parents, path)})
            if progress:
                progress(1)

    tr = start(loaded, prefix, cand, ref0, capacity)
    schedule("cold", tr)
    schedule("resumed", tr)
    cand.caches.free(0)
    primed = Sequence1(loaded, capacity, seq_id=2, caches=cand.caches)
    schedule("primed", start(loaded, prefix, primed, ref0, capacity))
    return rows


def run_fault(
    loaded: Loaded, name: str, prefix: list[int], cfg: ModelAuditConfig, ref0: Reference64, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    capacity = len(prefix) + cfg.fault_cycles * len(FAULT_TREE) + 32
    tr = start(loaded, prefix, Sequence1(loaded, capacity), ref0, capacity)
    rows = []
    with model_fault(name, loaded.model):
        for _ in range(cfg.fault_cycles):
            rows.append(cycle(tr, cfg, rng, FAULT_TREE, FAULT_PATH))
    failed = [s for s in SURFACES if any(r[f"{s}_ratio"] > cfg.ratio_bound for r in rows)]
    if not all(r["greedy_ok"] for r in rows):
        failed.append("greedy")
    worst = {s: max(r[f"{s}_ratio"] for r in rows) for s in SURFACES}
    return {
        "fault": name,
        "detected": bool(failed),
        "by": ", ".join(failed),
        **{f"max_{s}_ratio": worst[s] for s in SURFACES},
    }


def run_model_audit(
    cfg: ModelAuditConfig, loaded: Loaded | None = None, progress: Callable[[int], None] | None = None
) -> AuditReport:
    loaded = loaded or load(cfg.model, cfg.device, cfg.dtype)
    ref0 = Reference64(loaded.model)
    rep = AuditReport("model", {**asdict(cfg), "dtype_run": str(loaded.model.dtype)})
    pre = prefixes(loaded, max(cfg.prefixes, cfg.fault_prefixes), cfg.prefix_len, cfg.seed)
    rows: list[dict[str, Any]] = []
    for i in range(cfg.prefixes):
        for r in run_prefix(loaded, pre[i], cfg, ref0, cfg.seed * 1000 + i, progress):
            rows.append({"prefix": i, **r})
    n = len(rows)
    summary = []
    for s in SURFACES:
        worst = max(r[f"{s}_ratio"] for r in rows)
        raw = max(r[f"{s}_raw_ratio"] for r in rows)
        summary.append(
            {
                "surface": s,
                "max_error": max(r[s] for r in rows),
                "max_ratio": worst,
                "max_unfloored_ratio": raw,
                "bound": cfg.ratio_bound,
            }
        )
        rep.check(
            f"{s}: max ratio to the native envelope",
            worst <= cfg.ratio_bound,
            worst,
            cfg.ratio_bound,
            f"{n} cycles; max error {max(r[s] for r in rows):.3g}; unfloored ratio to the worst control "
            f"{raw:.3g}",
        )
    agree = sum(r["greedy_agree"] for r in rows)
    ok = sum(r["greedy_ok"] for r in rows)
    rep.check(
        "greedy tokens agree (mismatches only at ties)",
        ok == n,
        f"{agree}/{n} agree, {ok}/{n} ok",
        n,
        "tie: reference top-two margin <= max(0.25, 2 x controls' max logit error)",
    )
    rep.tables["surfaces"] = summary
    rep.tables["schedules"] = [
        {
            "schedule": sch,
            "cycles": len(rs),
            **{f"max_{s}_ratio": max(r[f"{s}_ratio"] for r in rs) for s in SURFACES},
            "greedy_agree": sum(r["greedy_agree"] for r in rs),
        }
        for sch in ("cold", "resumed", "primed")
        if (rs := [r for r in rows if r["schedule"] == sch])
    ]
    frows = []
    for f in cfg.faults:
        for p in range(cfg.fault_prefixes):
            frows.append({"prefix": p, **run_fault(loaded, f, pre[p], cfg, ref0, 7 + p)})
            if progress:
                progress(1)
    rep.tables["faults"] = frows
    det = sum(r["detected"] for r in frows)
    rep.check("injected faults detected", det == len(frows), f"{det}/{len(frows)}", len(frows))
    rep.tables["cycles"] = [{k: v for k, v in r.items() if not k.endswith("raw_ratio")} for r in rows]
    return rep
