"""Fused row kernels of the decode path (Triton) with their PyTorch twins.

- ``rms_norm``: zero-centred RMSNorm y = x / rms(x) * (1 + w), optionally fused with the residual add.
- ``gated_rms_norm``: the GDN output norm y = w * (o / rms(o)) * silu(z).
- ``silu_mul``: the SwiGLU product silu(gate) * up.
Each Triton kernel rounds exactly where its twin rounds (to the activation dtype), so the two agree up to
fp32 reduction order. Shapes: rows [N, D]; one program per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# ---------------------------------------------------------------- PyTorch twins


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (norm(x + residual), x + residual) with the sum rounded to x's dtype first."""
    h = x if residual is None else x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype), h


def gated_rms_norm_ref(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """o [N, D] already in the activation dtype; z [N, D]."""
    dtype = o.dtype
    of = o.float()
    y = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    y = weight * y
    return (y * F.silu(z.float())).to(dtype)


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# ---------------------------------------------------------------- Triton


@triton.jit
def _rms_norm_kernel(X, R, W, Y, H, D, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(X + row * D + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * D + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(H + row * D + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * D + cols, (xf * inv * (1.0 + w)).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gated_norm_kernel(OUT, Z, W, Y, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    o = tl.load(OUT + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / D + eps)
    y = (o * inv).to(Y.dtype.element_ty)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty).to(tl.float32)
    z = tl.load(Z + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * D + cols, (y * (z * tl.sigmoid(z))).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(G, U, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0)
    s = (g * tl.sigmoid(g)).to(Y.dtype.element_ty)
    tl.store(Y + offs, (s.to(tl.float32) * u.to(tl.float32)).to(Y.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    xr = _rows(x)
    N, D = xr.shape
    y = torch.empty_like(xr)
    h = torch.empty_like(xr) if residual is not None else xr
    rr = _rows(residual) if residual is not None else xr
    block = triton.next_power_of_2(D)
    _rms_norm_kernel[(N,)](xr, rr, weight, y, h, D, eps, HAS_RES=residual is not None, BLOCK=block,
                           num_warps=min(16, max(1, block // 256)))  # fmt: skip
    return y.view(x.shape), h.view(x.shape)


def gated_rms_norm_triton(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    orr, zr = _rows(o), _rows(z)
    N, D = orr.shape
    y = torch.empty_like(orr)
    block = triton.next_power_of_2(D)
    _gated_norm_kernel[(N,)](orr, zr, weight, y, D, eps, BLOCK=block, num_warps=min(8, max(1, block // 256)))
    return y.view(o.shape)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty_like(g)
    n = g.numel()
    _silu_mul_kernel[(triton.cdiv(n, 1024),)](g, u, y, n, BLOCK=1024, num_warps=4)
    return y
