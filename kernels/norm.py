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


def gated_rms_norm_ref(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """o [N, D], rounded to ``dtype`` (the activation dtype; default o's) first; z [N, D]."""
    dtype = dtype or o.dtype
    of = o.to(dtype).float()
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
def _gated_norm_kernel(OUT, Z, SZR, SZH, HZ, W, Y, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    # o may come in fp32 (the GDN kernels' output): rounded to the output dtype first, as a cast would
    o = tl.load(OUT + row * D + cols, mask=mask, other=0.0).to(Y.dtype.element_ty).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / D + eps)
    y = (o * inv).to(Y.dtype.element_ty)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty).to(tl.float32)
    z = tl.load(Z + (row // HZ) * SZR + (row % HZ) * SZH + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * D + cols, (y * (z * tl.sigmoid(z))).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(G, U, Y, SG, SU, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(G + row * SG + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * SU + offs, mask=mask, other=0.0)
    s = (g * tl.sigmoid(g)).to(Y.dtype.element_ty)
    tl.store(Y + row * N + offs, (s.to(tl.float32) * u.to(tl.float32)).to(Y.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


def _strided_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """x [..., D] as rows (tensor, row stride, head stride, heads per row) read in place: column slices of
    the fused projections' outputs (z, gate, up) are strided when a forward has several rows, and copying
    them cost one kernel each per layer."""
    x3 = x[:, None] if x.dim() == 2 else x
    if x3.dim() != 3 or x3.stride(-1) != 1:
        x3 = x.reshape(-1, 1, x.shape[-1]).contiguous()
    return x3, x3.stride(0), x3.stride(1), x3.shape[1]


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


def gated_rms_norm_triton(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None
) -> torch.Tensor:
    orr = _rows(o)
    N, D = orr.shape
    zr, szr, szh, hz = _strided_rows(z)
    assert zr.shape[0] * hz == N and zr.shape[-1] == D, "z must have o's rows"
    y = torch.empty(orr.shape, dtype=dtype or o.dtype, device=o.device)
    block = triton.next_power_of_2(D)
    _gated_norm_kernel[(N,)](orr, zr, szr, szh, hz, weight, y, D, eps, BLOCK=block,
                             num_warps=min(8, max(1, block // 256)))  # fmt: skip
    return y.view(o.shape)


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, sg, _, hg = _strided_rows(gate)
    u, su, _, hu = _strided_rows(up)
    if hg != 1 or hu != 1:  # rows of heads: read densely instead
        g, sg, u, su = _rows(gate), gate.shape[-1], _rows(up), up.shape[-1]
    rows, n = g.shape[0], gate.shape[-1]
    assert up.shape == gate.shape
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _silu_mul_kernel[(rows, triton.cdiv(n, 1024))](g, u, y, sg, su, n, BLOCK=1024, num_warps=4)
    return y
