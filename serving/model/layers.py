"""Small building blocks of the Qwen3.5 text model: linear hook, norms, MLP, rotary embedding."""

from __future__ import annotations

import torch
from torch import nn

from ...kernels import dispatch
from ..batch_invariant import batch_invariant_enabled, invariant_linear


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """Every projection of the model goes through here. With LUMOTREE_BATCH_INVARIANT=1 a row's output does
    not depend on how many rows share the forward (tree verify vs 1-row decode); otherwise ``layer(x)``."""
    if batch_invariant_enabled():
        return invariant_linear(x, layer.weight, layer.bias)
    return layer(x)


class FusedLinears:
    """Bias-free projections of one input whose weights live as row blocks of ONE matrix, so that a step runs
    one GEMM (one launch, one pass over x) instead of one per projection: vLLM's merged qkv / gate_up, kept
    under the checkpoint's own parameter names (each layer's weight is a view of the block)."""

    def __init__(self, layers: list[nn.Linear]) -> None:
        assert layers and all(la.bias is None for la in layers), "only bias-free projections fuse"
        w0 = layers[0].weight
        assert all(la.weight.shape[1] == w0.shape[1] for la in layers)
        self.weight = torch.empty(sum(la.out_features for la in layers), w0.shape[1], dtype=w0.dtype,
                                  device=w0.device)  # fmt: skip
        self.sizes = [la.out_features for la in layers]
        self.layers = layers
        start = 0
        with torch.no_grad():
            for la, n in zip(layers, self.sizes, strict=True):
                self.weight[start : start + n].copy_(la.weight)
                la.weight = nn.Parameter(self.weight[start : start + n], requires_grad=False)
                start += n

        self._ptrs = [la.weight.data_ptr() for la in layers]

    def intact(self) -> bool:
        """False once a layer's weight was replaced (e.g. ``module.to``): the block is then stale."""
        return all(la.weight.data_ptr() == p for la, p in zip(self.layers, self._ptrs, strict=True))


def fuse_projections(root: nn.Module) -> None:
    """Fuse the same-input projections of every submodule that can (their ``fuse()``), once the weights sit
    on their device in their dtype (a later ``.to`` un-fuses them: the layers notice and run separately)."""
    for m in root.modules():
        fuse = getattr(m, "fuse", None) if m is not root else None
        if callable(fuse):
            fuse()


def project(x: torch.Tensor, layers: list[nn.Linear], fused: FusedLinears | None) -> list[torch.Tensor]:
    """Each layer applied to x: one GEMM over the fused block when there is an intact one."""
    if fused is None or not fused.intact():
        return [linear(x, la) for la in layers]
    w = fused.weight
    y = invariant_linear(x, w, None) if batch_invariant_enabled() else torch.nn.functional.linear(x, w)
    return list(y.split(fused.sizes, dim=-1))


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: y = x / rms(x) * (1 + w), computed in fp32, cast back (Qwen3.5 convention)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return dispatch.rms_norm(x, self.weight, self.eps, residual)[0]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual) in one pass."""
        return dispatch.rms_norm(x, self.weight, self.eps, residual)


class GatedRMSNorm(nn.Module):
    """GDN output norm: y = w * (x / rms(x)) * silu(z); plain (not zero-centred) weight, norm in fp32, the
    normalised x cast to the input dtype before the weight (as the reference does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """In ``dtype`` (default x's); x is rounded to it first."""
        return dispatch.gated_rms_norm(x, z, self.weight, self.eps, dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.fused: FusedLinears | None = None
        """gate|up as one GEMM (``fuse``)."""

    def fuse(self) -> None:
        self.fused = FusedLinears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = project(x, [self.gate_proj, self.up_proj], self.fused)
        return linear(dispatch.silu_mul(gate, up), self.down_proj)


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Computed on ``device`` itself (no host copy), so a first forward inside CUDA graph capture is safe."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim))


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [R, rotary_dim] for the given positions (text-only: all three mRoPE sections share them)."""
    freqs = positions[:, None].float() * inv_freq[None, :].to(positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
