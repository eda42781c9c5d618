"""In-place decoding from state-pool rows (``kernels.gdn_decode``) vs its gather twin and the tree scan,
under TRITON_INTERPRET=1 (the whole model through it: ``test_gdn_fused``)."""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: set before any import of it

import pytest
import torch


def _fresh(name: str):
    mod = sys.modules.get(name)
    return importlib.reload(mod) if mod is not None else importlib.import_module(name)


def _operands(B: int, T: int, h: int, hv: int, kd: int, vd: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    l2 = lambda x: x / x.norm(dim=-1, keepdim=True)
    q, k = l2(rnd(B, T, h, kd)), l2(rnd(B, T, h, kd))
    v = rnd(B, T, hv, vd)
    g = torch.nn.functional.logsigmoid(rnd(B, T, hv) + 2.0)
    beta = torch.sigmoid(rnd(B, T, hv))
    return q, k, v, g, beta


def test_rows_kernel_matches_gather_twin_and_leaves_other_rows() -> None:
    gd = _fresh("lumotree.kernels.gdn_decode")
    q, k, v, g, beta = _operands(B=2, T=3, h=1, hv=2, kd=16, vd=24, seed=0)  # 3 value tiles
    pool = torch.randn(5, 2, 16, 24, generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([3, 0])
    before, ref_pool = pool.clone(), pool.clone()
    o_ref = gd.decode_rows_ref_(q, k, v, g, beta, 0.25, ref_pool, rows)
    o = gd.decode_rows_(q, k, v, g, beta, 0.25, pool, rows)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-5, atol=1e-6)
    untouched = torch.tensor([1, 2, 4])
    assert torch.equal(pool[untouched], before[untouched])
    assert not torch.equal(pool[rows], before[rows])


def test_rows_kernel_rounds_like_the_tree_scan_and_padding_is_identity() -> None:
    """Decode and verification share the update (``tree_scan._step``): a chain through the tree scan gives
    the same bits as decoding it; steps with g = 0, beta = 0 leave the state bitwise unchanged."""
    ts = _fresh("lumotree.kernels.tree_scan")
    gd = _fresh("lumotree.kernels.gdn_decode")
    T = 4
    q, k, v, g, beta = _operands(B=1, T=T, h=2, hv=4, kd=16, vd=16, seed=2)
    pool = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(3))
    scan = ts.TreeScanConfig(wy_max_rows=0)  # a path plan: wy rounds differently (within the paired rule)
    o_chain, _ = ts.tree_gdn(q[0], k[0], v[0], g[0], beta[0], list(range(-1, T - 1)), pool[1].clone(), 0.3,
                             config=scan)  # fmt: skip
    work = pool.clone()
    o = gd.decode_rows_(q, k, v, g, beta, 0.3, work, torch.tensor([1]))
    assert torch.equal(o[0], o_chain)
    # the same steps with two padding steps appended (g = 0, beta = 0) publish the same state
    pad = lambda x: torch.cat([x, torch.zeros_like(x[:, :2])], dim=1)
    padded = pool.clone()
    gd.decode_rows_(*(pad(x) for x in (q, k, v)), pad(g), pad(beta), 0.3, padded, torch.tensor([1]))
    assert torch.equal(padded, work)


def test_bad_operands_are_refused() -> None:
    gd = _fresh("lumotree.kernels.gdn_decode")
    q, k, v, g, beta = _operands(B=1, T=1, h=1, hv=2, kd=8, vd=8, seed=4)
    pool = torch.zeros(2, 2, 8, 8)
    with pytest.raises(AssertionError, match="integer pool row"):
        gd.decode_rows_(q, k, v, g, beta, 1.0, pool, torch.tensor([0.0]))
    with pytest.raises(AssertionError, match="pool"):
        gd.decode_rows_(q, k, v, g, beta, 1.0, pool.double(), torch.tensor([0]))


def test_replay_reads_its_steps_rows_and_skips_missing_steps_bitwise() -> None:
    """``replay_rows_`` (the commit) over operand rows named by a step table, with steps missing at the end
    of short paths, gives the same bits as ``decode_rows_`` on the gathered rows of each sequence alone, and
    as its padded twin; rows not named stay untouched."""
    gd = _fresh("lumotree.kernels.gdn_decode")
    N, h, hv, kd, vd = 9, 1, 2, 16, 16
    q, k, v, g, beta = (x[0] for x in _operands(B=1, T=N, h=h, hv=hv, kd=kd, vd=vd, seed=5))
    pool = torch.randn(4, hv, kd, vd, generator=torch.Generator().manual_seed(6))
    rows = torch.tensor([2, 0, 3])
    steps = torch.tensor([[4, 1, 7, 8], [0, -1, -1, -1], [5, 6, -1, -1]])
    work, twin, alone = pool.clone(), pool.clone(), pool.clone()
    gd.replay_rows_(q, k, v, g, beta, 0.3, work, rows, steps)
    gd.replay_rows_ref_(q, k, v, g, beta, 0.3, twin, rows, steps)
    for b, path in enumerate(steps.tolist()):
        idx = torch.tensor([n for n in path if n >= 0])
        gd.decode_rows_(*(x[idx][None] for x in (q, k, v, g, beta)), 0.3, alone, rows[b : b + 1])
    assert torch.equal(work, alone)
    torch.testing.assert_close(work, twin, rtol=1e-5, atol=1e-6)
    assert torch.equal(work[1], pool[1]) and not torch.equal(work[rows], pool[rows])
