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

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return dispatch.gated_rms_norm(x, z, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(dispatch.silu_mul(linear(x, self.gate_proj), linear(x, self.up_proj)), self.down_proj)


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
