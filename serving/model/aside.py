"""A projection run beside other work: its own GEMM on a side CUDA stream, joined where its output is needed.

A tree forward's GDN layer needs its output gate z only at the gated norm, after the tree verify; the wy
verifier runs one program per (value tile, head), 96 of the H200's 132 SMs, so z's GEMM can stream its
weights on the idle SMs meanwhile. ``LUMOTREE_OVERLAP_Z`` picks where the side stream forks: ``verify``
(after the operand prep, beside the verify kernel), ``proj`` (beside the input projection) or ``0`` (none:
z stays inside the fused input GEMM; the default until a GPU run shows a fork faster, see BENCHMARKS.md).
CPU forwards and batch-invariant linears never fork.
"""

from __future__ import annotations

import os

import torch

from ..batch_invariant import batch_invariant_enabled

ENV = "LUMOTREE_OVERLAP_Z"
MODES = ("0", "proj", "verify")

_streams: dict[torch.device, torch.cuda.Stream] = {}


def overlap_mode(x: torch.Tensor) -> str:
    """Where a forward on ``x``'s device forks the z projection ("0": it does not)."""
    mode = os.environ.get(ENV, "0")
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: one of {MODES}")
    return mode if x.is_cuda and not batch_invariant_enabled() else "0"


class AsideLinear:
    """``x @ weight.T`` on a side stream from ``start`` on, handed back to the calling stream by ``join``.

    The output is allocated on the calling stream before the fork, and the caller keeps ``x`` alive until
    the join, so the allocator reuses neither while the side stream works; under graph capture the fork and
    join become the graph's branch edges."""

    def __init__(self, x: torch.Tensor, weight: torch.Tensor) -> None:
        assert x.is_cuda and x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1]
        self.x, self.weight = x, weight
        self.out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        self.main = torch.cuda.current_stream(x.device)
        if x.device not in _streams:
            _streams[x.device] = torch.cuda.Stream(x.device)
        self.side = _streams[x.device]
        self.started = False

    def start(self) -> None:
        if not self.started:
            self.side.wait_stream(self.main)
            with torch.cuda.stream(self.side):
                torch.mm(self.x, self.weight.t(), out=self.out)
            self.started = True

    def join(self) -> torch.Tensor:
        self.start()
        self.main.wait_stream(self.side)
        return self.out
