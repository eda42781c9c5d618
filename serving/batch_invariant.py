"""Batch-invariant linear layers: a row's output must not depend on how many rows share the matmul.

BLAS kernels pick their blocking (and so their summation order) from the matrix shape, so the same row
multiplied alone (a 1-row decode) and inside a 32-row tree forward can differ in the last bits (measured on
the CPU backend: up to ~6e-6 absolute on fp32 logits-sized outputs). A near-tie between two tokens can then
flip a greedy choice between AR and a speculative arm.

``invariant_linear`` accumulates in float64 and rounds once to the input dtype. fp32 x fp32 products are exact
in float64 and float64 sums of K terms differ between summation orders by at most about K * 2^-53 relative,
far below fp32's 2^-24 rounding step: the rounded result is the same for every M unless the exact sum lies
within that sliver of a rounding boundary (about K * 2^-29 per element, ~1e-7 for K = 64). It costs
a float64 matmul, so it is meant for CPU verification and tests, not for GPU serving.

Hook: every projection of the model (attention, GDN, MLP, MTP fc, lm_head) goes through
``lumotree.serving.model.layers.linear(x, layer)``, which calls ``invariant_linear`` when the flag is set.
"""

from __future__ import annotations

import os

import torch

ENV = "LUMOTREE_BATCH_INVARIANT"
"""Set to 1 to route linear layers through ``invariant_linear``."""


def batch_invariant_enabled() -> bool:
    return os.environ.get(ENV, "0") == "1"


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed in float64 and rounded once to ``x.dtype`` (row results independent of M)."""
    y = torch.nn.functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
    return y.to(x.dtype)
