"""The matrix-form (wy) tree verifier vs the float64 per-node recurrence, under TRITON_INTERPRET=1.

Its arithmetic differs from native decoding's, so it is held to the audit's paired rule per (tree, head)
cell with the fp32 per-node recurrence as the native envelope - on the audit's own operands (strong decays,
bf16-grid inputs), where an fp32 matrix form breaks the rule in about one cell in twenty.
"""

from __future__ import annotations

import importlib
import os
import random
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when the kernel is decorated: set before any import of it

import pytest
import torch

from lumotree.kernels import tree_plan
from lumotree.kernels.tree_scan_ref import tree_gdn_float64, tree_gdn_ref
from lumotree.platform.audits import gdn as audit


def _modules():
    """tree_wy and tree_scan compiled for the interpreter, even if an earlier test imported them otherwise."""
    out = []
    for name in ("lumotree.kernels.tree_wy", "lumotree.kernels.tree_scan"):
        mod = sys.modules.get(name)
        out.append(importlib.reload(mod) if mod is not None else importlib.import_module(name))
    return out


def _cells_outside_rule(o: torch.Tensor, o_nat: torch.Tensor, o64: torch.Tensor) -> int:
    """Per value head: E = max abs error over nodes and values (the audit's cell)."""
    e = (o.double() - o64).abs().amax(dim=(0, 1, 3))
    e_nat = (o_nat.double() - o64).abs().amax(dim=(0, 1, 3))
    m64 = o64.abs().amax(dim=(0, 1, 3))
    return int((e > 1.10 * e_nat + 2.0**-24 * m64 + 2.0**-149).sum())


def test_audit_trees_within_the_paired_rule() -> None:
    """hydra27, chains, stars, wide and deep random trees up to 64 nodes, 27B head dims."""
    wy, _ = _modules()
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    hk, hv, dk, dv = 2, 6, 128, 32
    bad = 0
    for _name, parents in audit.tree_schedule(8, rng, 64):
        ops = audit.gdn_inputs(len(parents), hk, hv, dk, dv, gen, "cpu")
        q, k, v, g, beta = (ops[x][None] for x in ("q", "k", "v", "g", "beta"))
        h0 = torch.randn(1, hv, dk, dv, generator=gen) * 0.1
        o, _ = wy.tree_gdn_wy(q, k, v, g, beta, parents, h0, None)
        # fp32 tiles go to fp64 in place, bf16 ones through _fp64_operand: the same values, the same
        # fp64 products, the same bits
        qb, kb = q.bfloat16(), k.bfloat16()
        o_fp32, _ = wy.tree_gdn_wy(qb.float(), kb.float(), v, g, beta, parents, h0, None)
        o_bf16, _ = wy.tree_gdn_wy(qb, kb, v, g, beta, parents, h0, None)
        assert torch.equal(o_bf16, o_fp32)
        o_nat, _ = tree_gdn_ref(q, k, v, g, beta, parents, h0, None)
        o64, _ = tree_gdn_float64(q, k, v, g, beta, parents, h0, None)
        # trees cut into ancestor-closed groups of at most 16 rows: every row written, to the same bound
        grouped = torch.full_like(v, float("nan"))
        wy.tree_gdn_wy(
            q, k, v, g, beta, parents, h0, None, config=wy.TreeWyConfig(group_rows=16), out=grouped
        )
        for out in (o, grouped):
            bad += _cells_outside_rule(out, o_nat, o64)
            # fp64 inside: the error is the output's own rounding, far below native decoding's
            assert (out.double() - o64).abs().max() <= 2.0**-23 * o64.abs().max()
    assert bad == 0


def test_batched_trees_skipped_rows_state_indices_bf16_and_dispatch() -> None:
    """hydra27 (padded slots skipped) packed beside a chain, states picked from a pool by index, bf16
    operands, in-kernel l2norm; the same through ``tree_scan.tree_gdn`` with plan_mode=wy."""
    wy, ts = _modules()
    from lumotree.serving.tree import hydra27

    topo = hydra27()
    a, b = list(topo.parents), [-1, 0, 1, 2]
    parents, cu = a + b, [0, len(a), len(a) + len(b)]
    skip = list(topo.padded_rows)
    n, hv, d = len(parents), 4, 32
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, n, 2, d, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(1, n, hv, d, generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, n, hv, generator=gen) + 2)
    beta = torch.rand(1, n, hv, generator=gen)
    pool = torch.randn(3, hv, d, d, generator=gen) * 0.1
    idx = torch.tensor([2, 0], dtype=torch.int32)
    kw = dict(cu_seqlens=cu, state_indices=idx, use_qk_l2norm_in_kernel=True)
    before = pool.clone()
    out = torch.full_like(v, float("nan"))
    o, _ = wy.tree_gdn_wy(q, k, v, g, beta, parents, pool, None, out=out, skip=skip, **kw)
    assert o is out and o.dtype == torch.bfloat16 and torch.equal(pool, before)
    ref, _ = tree_gdn_float64(q, k, v, g, beta, parents, pool, **kw)
    keep = [r for r in range(n) if r not in skip]
    assert torch.equal(o[:, skip], torch.zeros_like(o[:, skip]))
    # fp64 inside: float64's value up to the cast to bf16, which truncates under the interpreter (one ulp)
    err = (o[:, keep].double() - ref[:, keep]).abs()
    assert (err <= 2.0**-7 * ref[:, keep].abs() + 2.0**-133).all()
    cfg = ts.TreeScanConfig(plan_mode="wy", wy_block_v=16)
    again, _ = ts.tree_gdn(q, k, v, g, beta, parents, pool, config=cfg, skip=skip, **kw)
    assert torch.equal(again, o)
    # auto serves wy for trees of at most wy_max_rows rows (these: 32 and 4)
    auto_cfg = ts.TreeScanConfig(wy_max_rows=32)
    auto, _ = ts.tree_gdn(q, k, v, g, beta, parents, pool, config=auto_cfg, skip=skip, **kw)
    assert torch.equal(auto, o)
    # hydra27 cut into two ancestor-closed groups (16 and 15 rows), its padded rows zeroed from a list
    grouped = torch.full_like(v, float("nan"))
    cfg16 = ts.TreeScanConfig(plan_mode="wy", wy_group_rows=16)
    ts.tree_gdn(q, k, v, g, beta, parents, pool, config=cfg16, skip=skip, out=grouped, **kw)
    assert torch.equal(grouped[:, skip], o[:, skip])
    assert (
        (grouped[:, keep].double() - ref[:, keep]).abs() <= 2.0**-7 * ref[:, keep].abs() + 2.0**-133
    ).all()
    # the single-sequence form of kernels.dispatch (no batch dim)
    one, _ = ts.tree_gdn(q[0, :32], k[0, :32], v[0, :32], g[0, :32], beta[0, :32], a, pool[2], config=cfg,
                         use_qk_l2norm_in_kernel=True, skip=skip)  # fmt: skip
    assert torch.equal(one, o[0, :32])


def test_plan_tables_and_bad_trees() -> None:
    plan = tree_plan.plan_wy([-1, 0, 1, 0, 3, 4, 5], skip=[6])
    assert plan.anc[:3] == (0b1, 0b11, 0b111) and plan.anc[6] == 0b1111001
    assert plan.keep == (1, 1, 1, 1, 1, 1, 0) and plan.depth == 4 and plan.squarings == 2
    assert plan.block_t == 16 and plan.cut_buffer_bytes(48, 128, 128) == 0
    assert [tree_plan.plan_wy([-1, *range(n - 1)]).squarings for n in (1, 2, 3, 4, 5, 8, 9, 12)] == [
        0, 0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip
    assert tree_plan.plan_wy([-1, *range(63)]).block_t == 64
    # groups: hydra27's 28 live rows in two ancestor-closed sets; chains longer than a group stay whole
    from lumotree.serving.tree import hydra27

    topo = hydra27()
    whole = tree_plan.plan_wy(topo.parents, skip=topo.padded_rows)
    cut = whole.grouped(16)
    assert cut is whole.grouped(16) and whole.grouped(32) is whole and cut.grouped(16) is cut
    assert cut.cu == (0, 16, 31) and cut.seq == (0, 0) and cut.block_t == 16 and cut.num_rows == 32
    assert sorted(cut.zero) == sorted(topo.padded_rows) and cut.zero_width == 2
    written = [r for r, w in zip(cut.rows, cut.keep, strict=True) if w == 1]
    assert sorted(written) == [r for r in range(32) if r not in topo.padded_rows]
    for a, b in zip(cut.cu, cut.cu[1:], strict=False):
        members = cut.rows[a:b]
        for i, r in enumerate(members):  # each slot's mask is its row's ancestors-or-self, all in the group
            ancestors = {r}
            while topo.parents[r] >= 0:
                r = topo.parents[r]
                ancestors.add(r)
            assert {members[j] for j in range(b - a) if cut.anc[a + i] >> j & 1} == ancestors
    assert tree_plan.plan_wy([-1, *range(19)]).grouped(16).rows == ()
    for parents, skip, msg in (
        ([-1, *range(64)], (), "more than 64 rows"),
        ([-1, 0, 1], (1,), "parent 1 is skipped"),
        ([-1, 0, 2], (), "earlier row"),
        ([-1, 0], (5,), "out of range"),
    ):
        with pytest.raises(ValueError, match=msg):
            tree_plan.plan_wy(parents, skip=skip)
    _, ts = _modules()
    with pytest.raises(ValueError, match="power of two"):
        ts.tree_gdn(*(torch.zeros(1, 2, 1, 16) for _ in range(2)), torch.zeros(1, 2, 1, 16),
                    torch.zeros(1, 2, 1), torch.zeros(1, 2, 1), [-1, 0], torch.zeros(1, 1, 16, 16),
                    config=ts.TreeScanConfig(plan_mode="wy", wy_block_v=24))  # fmt: skip
    with pytest.raises(ValueError, match="block_k 8"):
        ts.tree_gdn(*(torch.zeros(1, 2, 1, 16) for _ in range(2)), torch.zeros(1, 2, 1, 16),
                    torch.zeros(1, 2, 1), torch.zeros(1, 2, 1), [-1, 0], torch.zeros(1, 1, 16, 16),
                    config=ts.TreeScanConfig(plan_mode="wy", wy_block_k=8))  # fmt: skip
