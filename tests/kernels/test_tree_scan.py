"""Triton tree scan vs the naive per-node recurrence and float64 (paired rule), under TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib
import os
import random
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated: set before any import of it

import pytest
import torch

from lumotree.kernels import tree_plan
from lumotree.kernels.tree_scan_ref import paired_rule_ok, tree_gdn_float64, tree_gdn_ref

HYDRA_DRAFT_PARENT = [-1, -1, -1, 0, 0, 0, 1, 2, 3, 3, 3, 6, 7, 8, 8, 8, 11, 12, 13, 13, 13, 16, 17, 18, 22,
                      23, 24, 25, 27, 28, 29]  # fmt: skip
HYDRA_ACTIVE = [i not in (17, 22, 24, 26) for i in range(31)]  # hydra27_fixed32's "active" (draft nodes)


def _scan_module():
    """The kernel module compiled for the interpreter, even if an earlier test imported it otherwise."""
    name = "lumotree.kernels.tree_scan"
    mod = sys.modules.get(name)
    mod = importlib.reload(mod) if mod is not None else importlib.import_module(name)
    return mod


def hydra27_parents() -> list[int]:
    return [-1] + [p + 1 for p in HYDRA_DRAFT_PARENT]


def random_tree(n: int, rng: random.Random, deep: bool) -> list[int]:
    parents = [-1]
    for i in range(1, n):
        lo = max(0, i - 2) if deep else 0
        parents.append(rng.randint(lo, i - 1))
    return parents


def make_inputs(n: int, seqs: int, h: int, hv: int, kd: int, vd: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, n, h, kd, generator=gen).to(dtype)
    k = torch.randn(1, n, h, kd, generator=gen).to(dtype)
    v = torch.randn(1, n, hv, vd, generator=gen).to(dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(1, n, hv, generator=gen)).to(dtype)
    beta = torch.rand(1, n, hv, generator=gen).to(dtype)
    h0 = torch.randn(seqs, hv, kd, vd, generator=gen)
    return q, k, v, g, beta, h0


TREES = {
    "hydra27": hydra27_parents(),
    "chain16": [-1] + list(range(15)),
    "root_only": [-1],
    "wide64": random_tree(64, random.Random(1), deep=False),
    "deep64": random_tree(64, random.Random(2), deep=True),
    "star9": [-1] + [0] * 8,
}


CASES = [(name, "levels") for name in sorted(TREES)] + [
    (n, m) for n in ("hydra27", "chain16", "star9") for m in ("flat", "side", "sidecar", "split")
]


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_scan_matches_reference_and_float64(name: str, mode: str) -> None:
    ts = _scan_module()
    parents = TREES[name]
    n = len(parents)
    q, k, v, g, beta, h0 = make_inputs(n, 1, h=1, hv=2, kd=16, vd=16, seed=n)
    plan = tree_plan.plan_paths(parents, mode=mode)
    kw = dict(scale=0.25, use_qk_l2norm_in_kernel=True)
    cfg = ts.TreeScanConfig(block_v=8, wy_max_rows=0)  # the native chains below: a path plan, never wy
    o, _ = ts.tree_gdn(q, k, v, g, beta, parents, h0, plan=plan, config=cfg, **kw)
    o_ref, _ = tree_gdn_ref(q, k, v, g, beta, parents, h0, **kw)
    o64, _ = tree_gdn_float64(q, k, v, g, beta, parents, h0, **kw)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    # native decoding of every root-to-leaf path (a chain launch: fla's op sequence) gives the same bits
    kids = {p for p in parents if p >= 0}
    leaves = [i for i in range(n) if i not in kids]
    for leaf in leaves if len(leaves) <= 11 else [leaves[0], leaves[len(leaves) // 2], leaves[-1]]:
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        rows = torch.tensor(path[::-1])
        ops = [x[:, rows] for x in (q, k, v, g, beta)]
        o_chain, _ = ts.tree_gdn(*ops, list(range(-1, len(path) - 1)), h0, config=cfg, **kw)
        assert torch.equal(o[:, rows], o_chain), f"path to leaf {leaf} differs from its native chain"
    # paired rule against float64, with the fp32 per-node recurrence as the native envelope
    e_tree = (o.double() - o64).abs().amax()
    e_nat = (o_ref.double() - o64).abs().amax()
    assert paired_rule_ok(e_tree.item(), e_nat.item(), o64.abs().amax().item()), (e_tree, e_nat)


@pytest.mark.parametrize("name", ["hydra27", "deep64", "wide64"])
def test_two_tiles_and_plans_give_the_same_bits(name: str) -> None:
    """Two value tiles per program and every plan change the schedule, never the rounding: every variant
    equals the one-tile, level-by-level scan bit for bit (which equals native chains, test above)."""
    ts = _scan_module()
    parents = TREES[name]
    n = len(parents)
    q, k, v, g, beta, h0 = make_inputs(n, 1, h=1, hv=2, kd=16, vd=40, seed=11)
    # wy_max_rows=0: auto among the path plans (wy rounds differently; tests/kernels/test_tree_wy.py)
    cfg = lambda tiles, mode, pack: ts.TreeScanConfig(block_v=8, tiles=tiles, plan_mode=mode, pack=pack,
                                                      wy_max_rows=0)  # fmt: skip
    run = lambda tiles, mode, pack=0.0: ts.tree_gdn(q, k, v, g, beta, parents, h0, 0.25,
                                                    config=cfg(tiles, mode, pack))[0]  # fmt: skip
    base = run(1, "levels")
    ref = tree_gdn_ref(q, k, v, g, beta, parents, h0, 0.25)[0]
    torch.testing.assert_close(base, ref, rtol=1e-5, atol=1e-5)
    for tiles, mode, pack in (
        (2, "levels", 0.0),
        (1, "levels", 1.5),
        (1, "flat", 1.0),
        (2, "auto", 1.5),
        (2, "side", 1.5),
        (1, "sidecar", 0.0),
        (1, "split", 2.0),
    ):
        assert torch.equal(run(tiles, mode, pack), base), (tiles, mode, pack)
    with pytest.raises(AssertionError, match="tiles"):
        ts.tree_gdn(q, k, v, g, beta, parents, h0, 0.25, config=ts.TreeScanConfig(tiles=3, wy_max_rows=0))


@pytest.mark.parametrize("mode", ["levels", "sidecar", "split"])
def test_skipped_rows_are_zero_and_the_rest_unchanged(mode: str) -> None:
    """hydra27's padded slots skipped (packed or not): every other row keeps its bits, the skipped ones are
    written as zeros (over NaN, so an unwritten row would show), in a batch beside an unskipped chain."""
    ts = _scan_module()
    a, b = TREES["hydra27"], [-1, 0, 1]
    parents, cu = a + b, [0, len(a), len(a) + len(b)]
    n = len(parents)
    q, k, v, g, beta, pool = make_inputs(n, 2, h=1, hv=2, kd=16, vd=16, seed=5)
    skip = [1 + i for i, on in enumerate(HYDRA_ACTIVE) if not on]
    kw = dict(cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    full, _ = ts.tree_gdn(q, k, v, g, beta, parents, pool, config=ts.TreeScanConfig(plan_mode=mode), **kw)
    keep = [r for r in range(n) if r not in skip]
    for pack in (0.0, 1.5):
        out = torch.full_like(v, float("nan"))
        cfg = ts.TreeScanConfig(plan_mode=mode, pack=pack)
        ts.tree_gdn(q, k, v, g, beta, parents, pool, config=cfg, out=out, skip=skip, **kw)
        assert torch.equal(out[:, keep], full[:, keep]), (mode, pack)
        assert torch.equal(out[:, skip], torch.zeros_like(out[:, skip])), (mode, pack)
    plan = tree_plan.plan_paths(parents, cu, mode=mode, skip=skip)
    assert plan.skipped == tuple(skip)
    assert not {r for lv in plan.paths for _, rows in lv for r in rows} & set(skip)


def test_batched_trees_with_state_indices_and_bf16() -> None:
    """Two sequences packed (hydra27 + a chain), states picked from a pool by index, bf16 operands."""
    ts = _scan_module()
    a, b = TREES["hydra27"], [-1, 0, 1, 2]
    parents, cu = a + b, [0, len(a), len(a) + len(b)]
    n = len(parents)
    q, k, v, g, beta, pool = make_inputs(n, 3, h=1, hv=2, kd=16, vd=16, seed=7, dtype=torch.bfloat16)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    kw = dict(cu_seqlens=cu, state_indices=idx, use_qk_l2norm_in_kernel=True)
    before = pool.clone()
    o, _ = ts.tree_gdn(
        q, k, v, g, beta, parents, pool, config=ts.TreeScanConfig(block_v=8, wy_max_rows=0), **kw
    )
    o_ref, _ = tree_gdn_ref(q, k, v, g, beta, parents, pool, **kw)
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(pool, before), "the committed states must never be written by the scan"
    # side leaves of hydra27 beside a plain chain, each route starting from its own sequence's state
    cfg = ts.TreeScanConfig(block_v=8, plan_mode="side")
    assert torch.equal(ts.tree_gdn(q, k, v, g, beta, parents, pool, config=cfg, **kw)[0], o)
    # the chain of sequence 1 is plain decoding from pool[0]: compare against the per-node reference alone
    o_chain, _ = tree_gdn_ref(q[:, 32:], k[:, 32:], v[:, 32:], g[:, 32:], beta[:, 32:], b, pool[:1],
                              use_qk_l2norm_in_kernel=True)  # fmt: skip
    torch.testing.assert_close(o[:, 32:].float(), o_chain.float(), rtol=1e-2, atol=1e-2)


def test_dispatch_form_without_batch_dim() -> None:
    """The single-sequence form that kernels.dispatch.gdn_tree passes (q [N, H, K], state [HV, K, V])."""
    ts = _scan_module()
    parents = [-1, 0, 0, 1]
    q, k, v, g, beta, h0 = make_inputs(4, 1, h=1, hv=2, kd=16, vd=8, seed=3)
    o, none = ts.tree_gdn(q[0], k[0], v[0], g[0], beta[0], parents, h0[0], 0.25, None)
    o_ref, _ = tree_gdn_ref(q[0], k[0], v[0], g[0], beta[0], parents, h0[0], 0.25)
    assert none is None and o.shape == (4, 2, 8)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)


def test_config_from_env_overrides_the_defaults_and_rejects_bad_input() -> None:
    ts = _scan_module()
    cfg = ts.TreeScanConfig.from_env("plan_mode=split, tiles=2")
    assert ts.TreeScanConfig().tiles != 2
    assert (cfg.plan_mode, cfg.tiles, cfg.block_v) == ("split", 2, ts.TreeScanConfig().block_v)
    assert ts.TreeScanConfig.from_env("") == ts.TreeScanConfig()
    assert ts.TreeScanConfig.from_env("pack=0.5").pack == 0.5
    for bad, msg in (("tiles", "field=value"), ("warps=2", "field=value"), ("tiles=two", "number"),
                     ("plan_mode=packed", "plan_mode")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            ts.TreeScanConfig.from_env(bad)
