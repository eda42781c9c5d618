"""``TreeRecord``: what a tree forward keeps so that ``commit`` can publish an accepted path."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..batch import ForwardBatch


@dataclass
class GDNReplay:
    """One GDN layer's replay operands for every tree row, exactly as the native decode kernel consumes
    them."""

    q: torch.Tensor
    """[R, Hk, K] fp32, l2-normalised (the kernel applies the K^-0.5 scale)."""
    k: torch.Tensor
    """[R, Hk, K] fp32, l2-normalised."""
    v: torch.Tensor
    """[R, Hv, V] fp32."""
    g: torch.Tensor
    """[R, Hv] fp32 log decay."""
    beta: torch.Tensor
    """[R, Hv] fp32 (post-sigmoid)."""
    conv_in: torch.Tensor
    """[R, conv_dim] pre-conv inputs (model dtype): what the conv history stores."""


@dataclass
class TreeRecord:
    """The tree forward's batch and per-GDN-layer replay operands (layer order = pool order)."""

    batch: ForwardBatch
    scale: float
    """GDN query scale K^-0.5."""
    layers: list[GDNReplay] = field(default_factory=list)
