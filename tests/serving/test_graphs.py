"""``serving.graphs``: per-key static input buffers (CPU runs them eagerly), the entry budget, and on CUDA the
warm-up that refuses host syncs before a capture can be invalidated."""

from __future__ import annotations

import pytest
import torch

from lumotree.serving.graphs import StaticGraphs, capture


def test_static_graphs_run_on_static_copies_and_respect_the_budget() -> None:
    seen: list[int] = []

    def fn(x: list[torch.Tensor]) -> torch.Tensor:
        seen.append(x[0].data_ptr())
        return x[0] * 2 + x[1]

    g = StaticGraphs(False, lambda: None, lambda e: None, max_entries=1)
    a, b = torch.arange(4.0), torch.ones(4)
    assert torch.equal(g("k", fn, [a, b]), a * 2 + 1)
    assert torch.equal(g("k", fn, [a + 1, b]), (a + 1) * 2 + 1)  # new values copied into the same buffers
    assert seen[0] == seen[1] != a.data_ptr()
    assert torch.equal(g("other", fn, [a, b]), a * 2 + 1)  # over budget: eager on the caller's tensors
    assert seen[2] == a.data_ptr() and list(g.entries) == ["k"]
    with pytest.raises(AssertionError):
        g("k", fn, [torch.arange(5.0), torch.ones(5)])  # a key must fix its shapes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_capture_refuses_a_syncing_function_before_capturing() -> None:
    x = torch.ones(8, device="cuda")
    with pytest.raises(RuntimeError):
        capture(lambda: x * float(x.sum().item()))
    graph, out = capture(lambda: x * 2)
    x.fill_(3.0)
    graph.replay()
    assert torch.equal(out, torch.full_like(x, 6.0))
