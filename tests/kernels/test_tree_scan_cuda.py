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
