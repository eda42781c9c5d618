"""The compiled tree scan on a GPU: every plan gives the same bits, also the two-stream ``split`` plan
inside a CUDA graph (its fork and join must be captured, or the graph would read outputs not yet written)."""

from __future__ import annotations

import pytest
import torch

from lumotree.kernels import tree_scan
from lumotree.kernels.tree_plan import plan_paths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HYDRA = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 1, 1, 12, 13, 2, 2, 16, 17, 3, 3, 20, 21, 4, 4, 24, 25,
         29, 30]  # fmt: skip


def test_plans_agree_bitwise_and_split_survives_graph_capture() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, h, hv, d = len(HYDRA), 4, 12, 128
    q, k = (torch.randn(1, n, h, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(1, n, hv, d, device="cuda", generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, n, hv, device="cuda", generator=gen))
    beta = torch.rand(1, n, hv, device="cuda", generator=gen)
    h0 = torch.randn(1, hv, d, d, device="cuda", generator=gen)

    def run(mode: str, out: torch.Tensor | None = None) -> torch.Tensor:
        return tree_scan.tree_gdn(q, k, v, g, beta, None, h0, None, plan_paths(HYDRA, mode=mode),
                                  use_qk_l2norm_in_kernel=True, out=out)[0]  # fmt: skip

    base = run("levels")
    for mode in ("flat", "side", "sidecar", "split"):
        assert torch.equal(run(mode), base), mode
    out = torch.zeros_like(base)
    run("split", out)  # warm up outside the capture (compiles, makes the second stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run("split", out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, base)


def test_wy_within_the_paired_rule_at_27b_heads_and_under_graph_capture() -> None:
    """The matrix-form verifier compiled (fp64 dots) on hydra27 with 27B head dims and bf16 operands: every
    (head) cell within the paired rule against float64, with the fp32 per-node recurrence as the native
    envelope, whole and in groups; a captured replay gives the same bits."""
    from lumotree.kernels.tree_scan_ref import tree_gdn_float64, tree_gdn_ref

    gen = torch.Generator(device="cuda").manual_seed(1)
    n, h, hv, d = len(HYDRA), 4, 12, 128
    q, k = (torch.randn(1, n, h, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(1, n, hv, d, device="cuda", generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, n, hv, device="cuda", generator=gen) + 3)
    beta = torch.rand(1, n, hv, device="cuda", generator=gen)
    h0 = torch.randn(1, hv, d, d, device="cuda", generator=gen) * 0.1
    kw = dict(use_qk_l2norm_in_kernel=True)
    o_nat, _ = tree_gdn_ref(q, k, v.float(), g, beta, HYDRA, h0, **kw)
    o64, _ = tree_gdn_float64(q, k, v.float(), g, beta, HYDRA, h0, **kw)
    m64 = o64.abs().amax(dim=(0, 1, 3))
    for groups in (0, 16):  # the whole tree per program, and cut into ancestor-closed groups
        out = torch.full((1, n, hv, d), float("nan"), device="cuda")
        cfg = tree_scan.TreeScanConfig(plan_mode="wy", wy_group_rows=groups)
        tree_scan.tree_gdn(q, k, v.float(), g, beta, HYDRA, h0, None, config=cfg, out=out, **kw)
        o = out.clone()
        e, e_nat = ((x.double() - o64).abs().amax(dim=(0, 1, 3)) for x in (o, o_nat))
        assert (e <= 1.10 * e_nat + 2.0**-24 * m64 + 2.0**-149).all(), (groups, e, e_nat)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            tree_scan.tree_gdn(q, k, v.float(), g, beta, HYDRA, h0, None, config=cfg, out=out, **kw)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, o)
