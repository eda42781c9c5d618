"""``TreeRecord``: what a tree forward keeps so that ``commit`` can publish an accepted path.

Every GDN layer writes its replay operands straight into [L, ...] buffers shared by all layers (allocated by
the first GDN layer of the forward), so commit gathers the accepted rows of every layer with one index op
per operand and replays them in one decode launch, whatever the layer count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ForwardBatch

Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class GDNReplay:
    """One GDN layer's replay operands for every tree row, exactly as the native decode kernel consumes
    them (views of the record's stacked buffers)."""

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
class ReplayStack:
    """All GDN layers' replay operands, layer-major (layer order = pool order)."""

    q: torch.Tensor
    """[L, R, Hk, K] fp32."""
    k: torch.Tensor
    """[L, R, Hk, K] fp32."""
    v: torch.Tensor
    """[L, R, Hv, V] fp32."""
    g: torch.Tensor
    """[L, R, Hv] fp32."""
    beta: torch.Tensor
    """[L, R, Hv] fp32."""
    conv_src: torch.Tensor
    """[L, S * (kernel - 1) + R, conv_dim] model dtype: each layer's conv source, [pre-tree history rows ;
    tree rows' pre-conv inputs] (the tree forward builds it anyway, so writing it here costs no copy)."""
    hist_rows: int
    """S * (kernel - 1): where the tree rows start in ``conv_src``."""

    @classmethod
    def empty(
        cls, layers: int, rows: int, hist_rows: int, conv_dim: int, heads: tuple[int, int, int, int],
        dtype: torch.dtype, device: torch.device,
    ) -> ReplayStack:  # fmt: skip
        hk, dk, hv, dv = heads

        def f32(*shape: int) -> torch.Tensor:
            return torch.empty(layers, rows, *shape, dtype=torch.float32, device=device)

        src = torch.empty(layers, hist_rows + rows, conv_dim, dtype=dtype, device=device)
        return cls(f32(hk, dk), f32(hk, dk), f32(hv, dv), f32(hv), f32(hv), src, hist_rows)

    @property
    def conv_in(self) -> torch.Tensor:
        """[L, R, conv_dim] the tree rows' pre-conv inputs."""
        return self.conv_src[:, self.hist_rows :]

    def operands(self, li: int) -> Operands:
        """Layer ``li``'s (q, k, v, g, beta) views: where the tree forward's operand prep writes."""
        return self.q[li], self.k[li], self.v[li], self.g[li], self.beta[li]

    def layer(self, li: int) -> GDNReplay:
        return GDNReplay(*self.operands(li), self.conv_in[li])


@dataclass
class TreeRecord:
    """The tree forward's batch and the replay operands of every GDN layer."""

    batch: ForwardBatch
    scale: float
    """GDN query scale K^-0.5."""
    stack: ReplayStack | None = None
    """Allocated by the forward's first GDN layer (None until then, and for a model without GDN layers)."""

    @property
    def layers(self) -> list[GDNReplay]:
        """Per-layer views of ``stack`` (layer order = pool order)."""
        if self.stack is None:
            return []
        return [self.stack.layer(li) for li in range(self.stack.q.shape[0])]
