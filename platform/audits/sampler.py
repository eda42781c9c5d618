"""Sampler audit: Monte Carlo walks on captured steps against the exact target, with injected faults.

A *step* is a real tree verification captured from the model: a tree grown from the target's own top
tokens (so deep nodes are visited often), the target logits at every node, sampling parameters and a
presence history. Each step is designed to give a different fault the power to show: peaked and flat
distributions, coarse logits with ties at the top-k boundary, min-p active, presence penalty over history
and path, a deep spine. Steps keep the model's logits over the ``vocab_cap`` columns of highest maximum
probability (plus the tree and history tokens); the walk is exact for any logits matrix, so the audit loses
nothing, and ``vocab_cap = 0`` keeps the full vocabulary (GPU).

Statistics, per step (Bonferroni over the step's tests, family threshold ``alpha``):
- per node visited at least ``min_visits`` times: the token emitted there (the next path node's token, or
  the bonus token where the walk stopped) against that node's exact row, by a G-test with rare cells pooled;
- the joint outcome (end node, bonus token) - equivalently the whole accepted path plus bonus - against
  its enumerated probability reach(end) * p_end(bonus), bonus not an active child's token.
The exact rows come from ``sampler_oracle`` (an independent float64 enumeration), cross-checked against the
product's ``node_probabilities``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .report import AuditReport
from .sampler_faults import SAMPLER_FAULTS, sampler_fault
from .stats import g_test


@dataclass(frozen=True)
class StepSpec:
    """How one captured step is made."""

    name: str
    temperature: float
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    fanout: tuple[int, ...] = (3, 2, 1)
    """Children per node at each depth (the target's top tokens)."""
    tie_grid: float = 0.0
    """Round logits to this grid (coarse, bf16-like logits: ties); 0 keeps them."""
    tie_top_k: bool = False
    """Choose top_k so that the root's k-th and (k+1)-th logits tie (needs ``tie_grid``)."""
    history_top: int = 0
    """Put the root's top tokens number 2..history_top+1 into the presence history."""
    prefix: int = 0


STEPS = (
    StepSpec(
        "study-settings",
        0.6,
        top_k=20,
        top_p=0.95,
        presence_penalty=1.0,
        fanout=(3, 2, 2, 1),
        history_top=3,
        prefix=0,
    ),
    StepSpec("flat", 1.5, fanout=(4, 2, 1), prefix=1),
    StepSpec("top-k-ties", 0.8, top_k=8, fanout=(3, 2, 1), tie_grid=0.5, tie_top_k=True, prefix=2),
    StepSpec("min-p", 0.9, min_p=0.08, fanout=(3, 2, 1), prefix=3),
    StepSpec("presence", 0.7, top_p=0.98, presence_penalty=1.5, fanout=(3, 2, 2), history_top=4, prefix=4),
    StepSpec("deep", 0.7, top_p=0.9, fanout=(2, 1, 1, 1, 1, 1, 1), prefix=5),
)


@dataclass
class SamplerAuditConfig:
    """What the sampler audit runs."""

    model: str = "tiny"
    device: str = "cpu"
    walks: int = 200_000
    """Walks per step with the correct sampler."""
    fault_walks: int = 200_000
    """Walks per step and fault."""
    chunk: int = 4096
    """Walks per batched ``walk`` call."""
    min_visits: int = 2000
    """Nodes visited fewer times are not tested on their own (they still count in the joint test)."""
    alpha: float = 1e-3
    """Family-wise threshold per step (Bonferroni over its tests)."""
    vocab_cap: int = 256
    """Columns kept per step (0 = the whole vocabulary)."""
    faults: tuple[str, ...] = SAMPLER_FAULTS
    seed: int = 0
    prefix_len: int = 24


@dataclass
class Step:
    """A captured step, vocabulary already reduced."""

    spec: StepSpec
    tokens: list[int]
    parents: list[int]
    logits: torch.Tensor  # [N, V'] fp32
    history: torch.Tensor | None  # [V'] bool
    probs: torch.Tensor  # [N, V'] float64, the exact rows
    params: Any  # SamplingParams
    oracle_vs_product: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def _params(spec: StepSpec, top_k: int | None = None) -> Any:
    from lumotree.serving.sampling.params import SamplingParams

    return SamplingParams(
        temperature=spec.temperature,
        top_k=spec.top_k if top_k is None else top_k,
        top_p=spec.top_p,
        min_p=spec.min_p,
        presence_penalty=spec.presence_penalty,
    )


def _product_probs(
    tokens: list[int], parents: list[int], logits: torch.Tensor, history: torch.Tensor | None, params: Any
) -> torch.Tensor:
    from lumotree.serving.sampling.transforms import RowParams
    from lumotree.serving.sampling.walk import TreeBatch, node_probabilities

    tb = TreeBatch.build([(tokens, parents, None)], logits.device)
    rp = RowParams.build([params], logits.shape[-1], logits.device)
    return node_probabilities(tb, logits, None if history is None else history[None], rp)


def capture_step(loaded: Any, spec: StepSpec, prefix: list[int], cfg: SamplerAuditConfig) -> Step:
    """Grow the tree from the target's top tokens, one tree forward per depth, and keep the final logits."""
    from .capture import Sequence1

    seq = Sequence1(loaded, capacity=len(prefix) + 64)
    seq.prefill(prefix[:-1])
    tokens, parents, depth = [prefix[-1]], [-1], [0]
    vocab = loaded.config.vocab_size
    hist_full = None
    params = _params(spec)

    def grid(x: torch.Tensor) -> torch.Tensor:
        return torch.round(x / spec.tie_grid) * spec.tie_grid if spec.tie_grid else x

    for d, fan in enumerate(spec.fanout):
        logits = grid(seq.tree(tokens, parents)[0].float())
        if d == 0:
            order = torch.argsort(logits[0], descending=True).tolist()
            if spec.history_top:
                hist_full = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
                hist_full[order[1 : 1 + spec.history_top]] = True
            if spec.tie_top_k:
                pen = logits[0] - (spec.presence_penalty * hist_full.float() if hist_full is not None else 0)
                s = torch.sort(pen, descending=True).values
                k = next((k for k in range(3, 40) if s[k - 1] == s[k]), spec.top_k)
                params = _params(spec, top_k=k)
        probs = _product_probs(tokens, parents, logits, hist_full, params)
        for i in [i for i in range(len(tokens)) if depth[i] == d]:
            top = torch.topk(probs[i], fan)
            for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                if p > 0:
                    tokens.append(int(t))
                    parents.append(i)
                    depth.append(d + 1)
    logits = grid(seq.tree(tokens, parents)[0].float())
    # Reduced vocabulary: the top columns by max probability over nodes, plus tree and history tokens.
    full = _product_probs(tokens, parents, logits, hist_full, params)
    if cfg.vocab_cap and cfg.vocab_cap < vocab:
        score = full.amax(0)
        score[torch.tensor(tokens, device=score.device)] = 2.0
        if hist_full is not None:
            score[hist_full] = 2.0
        cols = torch.sort(torch.topk(score, cfg.vocab_cap).indices).values
    else:
        cols = torch.arange(vocab, device=logits.device)
    remap = {int(c): j for j, c in enumerate(cols.tolist())}
    tokens_r = [remap[t] for t in tokens]
    logits_r = logits[:, cols].contiguous()
    hist_r = None if hist_full is None else hist_full[cols].contiguous()
    from .sampler_oracle import node_distributions

    exact = node_distributions(tokens_r, parents, logits_r, hist_r, params)
    prod = _product_probs(tokens_r, parents, logits_r, hist_r, params).double().cpu()
    info = {
        "nodes": len(tokens),
        "depth": max(depth),
        "vocab": int(cols.numel()),
        "top_k": params.top_k,
        "kept_per_node_max": int((exact > 0).sum(-1).max()),
        "root_top_prob": float(exact[0].max()),
    }
    if spec.tie_top_k:
        row = logits_r[0] / spec.temperature
        s = torch.sort(row, descending=True).values
        info["tie_at_top_k"] = bool(s[params.top_k - 1] == s[params.top_k])
    return Step(
        spec, tokens_r, parents, logits_r, hist_r, exact, params, float((prod - exact).abs().max()), info
    )


def run_walks(step: Step, n: int, chunk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome counts [N, V'] (token emitted at each visited node) and joint counts [N, V'] (end node,
    bonus) of ``n`` walks, batched ``chunk`` at a time through ``walk.walk`` (looked up at call time, so
    faults injected by ``sampler_fault`` apply)."""
    from lumotree.serving.sampling import walk as wm
    from lumotree.serving.sampling.transforms import RowParams

    dev = step.logits.device
    N, V = step.logits.shape
    toks = torch.tensor(step.tokens, device=dev)
    pars = torch.tensor(step.parents, device=dev)
    depth = 0
    dl = [0] * N
    for i in range(1, N):
        dl[i] = dl[step.parents[i]] + 1
        depth = max(depth, dl[i])
    outcome = torch.zeros(N * V, dtype=torch.long, device=dev)
    joint = torch.zeros(N * V, dtype=torch.long, device=dev)
    done = 0
    while done < n:
        b = min(chunk, n - done)
        trees = wm.TreeBatch(
            tokens=toks.repeat(b),
            parents=pars.repeat(b),
            active=torch.ones(b * N, dtype=torch.bool, device=dev),
            sizes=[N] * b,
            max_depth=depth,
        )
        rp = RowParams.build([step.params] * b, V, dev)
        hist = None if step.history is None else step.history[None].expand(b, V)
        seeds = torch.arange(done, done + b, device=dev, dtype=torch.int64) + seed * 1_000_003
        res = wm.walk(
            trees, step.logits.repeat(b, 1), hist, rp, seeds, torch.zeros(b, dtype=torch.int64, device=dev)
        )
        acc = res.accepted
        ends = acc.gather(1, (res.num_accepted - 1)[:, None])[:, 0]
        joint += torch.bincount(ends * V + res.bonus, minlength=N * V)
        nxt = torch.cat([acc[:, 1:], torch.full_like(acc[:, :1], -1)], 1)
        emitted = torch.where(nxt >= 0, toks[nxt.clamp(min=0)], res.bonus[:, None])
        vis = acc >= 0
        outcome += torch.bincount((acc * V + emitted)[vis], minlength=N * V)
        done += b
    return outcome.view(N, V).cpu(), joint.view(N, V).cpu()


def joint_probs(step: Step) -> torch.Tensor:
    """P(end node, bonus) [N, V'] by enumeration."""
    N, V = step.probs.shape
    reach = torch.zeros(N, dtype=torch.float64)
    reach[0] = 1.0
    stop = step.probs.clone()
    for i in range(1, N):
        p = step.parents[i]
        reach[i] = reach[p] * step.probs[p, step.tokens[i]]
        stop[p, step.tokens[i]] = 0.0  # drawing an active child's token moves there
    return reach[:, None] * stop


def test_step(
    step: Step, outcome: torch.Tensor, joint: torch.Tensor, cfg: SamplerAuditConfig
) -> dict[str, Any]:
    """Per-node and joint G-tests; ``passed`` when every p-value clears alpha / (number of tests)."""
    visits = outcome.sum(1)
    tested = [i for i in range(len(step.tokens)) if int(visits[i]) >= cfg.min_visits]
    results = [g_test(outcome[i], step.probs[i]) for i in tested]
    jg = g_test(joint.flatten(), joint_probs(step).flatten())
    m = len(tested) + 1
    thr = cfg.alpha / m
    pmin = min([r[2] for r in results] + [jg[2]])
    return {
        "tested_nodes": len(tested),
        "min_p_value": pmin,
        "threshold": thr,
        "joint_G": jg[0],
        "joint_df": jg[1],
        "joint_p": jg[2],
        "passed": pmin >= thr,
        "worst_node": tested[min(range(len(results)), key=lambda j: results[j][2])] if results else None,
    }


def run_sampler_audit(
    cfg: SamplerAuditConfig, loaded: Any = None, progress: Callable[[int], None] | None = None
) -> AuditReport:
    from .capture import load, prefixes

    loaded = loaded or load(cfg.model, cfg.device)
    rep = AuditReport("sampler", {**asdict(cfg), "steps": [s.name for s in STEPS]})
    pre = prefixes(loaded, len(STEPS), cfg.prefix_len, cfg.seed)
    steps = [capture_step(loaded, spec, pre[spec.prefix], cfg) for spec in STEPS]
    rows = []
    detected = {f: 0 for f in cfg.faults}
    for si, st in enumerate(steps):
        out, jt = run_walks(st, cfg.walks, cfg.chunk, cfg.seed + si)
        res = test_step(st, out, jt, cfg)
        row = {
            "step": st.spec.name,
            **st.info,
            "oracle_vs_product": st.oracle_vs_product,
            "walks": cfg.walks,
            "tested_nodes": res["tested_nodes"],
            "min_p": res["min_p_value"],
            "threshold": res["threshold"],
            "correct": "pass" if res["passed"] else "FAIL",
        }
        if progress:
            progress(1)
        for f in cfg.faults:
            with sampler_fault(f):
                fo, fj = run_walks(st, cfg.fault_walks, cfg.chunk, cfg.seed + si + 77)
            fr = test_step(st, fo, fj, cfg)
            row[f] = "detected" if not fr["passed"] else f"missed (p {fr['min_p_value']:.2g})"
            detected[f] += int(not fr["passed"])
            if progress:
                progress(1)
        rows.append(row)
        rep.check(
            f"{st.spec.name}: correct walk matches the exact target",
            res["passed"],
            res["min_p_value"],
            res["threshold"],
            f"min p over {res['tested_nodes']} nodes + joint; joint G {res['joint_G']:.1f} "
            f"df {res['joint_df']}",
        )
        rep.check(
            f"{st.spec.name}: transforms agree with the enumeration oracle",
            st.oracle_vs_product <= 1e-5,
            st.oracle_vs_product,
            1e-5,
            "max |p_product - p_oracle|",
        )
        if st.spec.tie_top_k:
            rep.check(
                f"{st.spec.name}: a tie sits at the top-k boundary",
                st.info.get("tie_at_top_k", False),
                st.info.get("tie_at_top_k"),
                True,
            )
    rep.tables["steps"] = rows
    need = math.ceil(len(steps) * 5 / 6)
    for f in cfg.faults:
        rep.check(f"fault {f} detected", detected[f] >= need, f"{detected[f]}/{len(steps)}", f">= {need}")
    return rep
