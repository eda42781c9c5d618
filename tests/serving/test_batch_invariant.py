"""``invariant_linear``: a row's output is bitwise the same whatever the number of rows, and it is the
correctly rounded float64 result (plain ``F.linear`` depends on M on the CPU backend, hence this)."""

from __future__ import annotations

import torch

from lumotree.serving.batch_invariant import invariant_linear


def test_rows_do_not_depend_on_batch_size() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(600, 64, generator=g), torch.randn(600, generator=g)
    x = torch.randn(64, 64, generator=g)
    alone = [invariant_linear(x[i : i + 1], w, b) for i in range(64)]
    for m in (2, 4, 8, 16, 32, 64):
        y = invariant_linear(x[:m], w, b)
        for i in range(m):
            assert torch.equal(y[i : i + 1], alone[i]), (m, i)
    exact = (x.double() @ w.double().T + b.double()).float()
    assert torch.equal(invariant_linear(x, w, b), exact)
