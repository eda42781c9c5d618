"""Fused Triton kernels of the gated-attention decode path, with their PyTorch twins.

- ``norm_rope``: per-head zero-centred RMSNorm then partial rotary (rotate-half) of q or k rows, reading
  strided head views (the query half of q_proj's [query | gate] heads) without a copy.
- ``gated_decode_attention``: one query row per sequence over its paged K/V (positions < seq_lens),
  grouped query heads, online softmax in fp32, times sigmoid(gate); one program per (sequence, KV head).
- ``gated_tree_attention``: the same kernel over tree rows: row j of a tree over a prefix of ctx tokens
  sits at logical position ctx + j and sees the prefix plus its ancestors-or-self (a per-row mask over the
  tree's rows). Every input is a device tensor of fixed shape, so tree verification is CUDA-graph capturable;
  a tree's root row runs exactly the decode program (same blocks, same order), so a root's attention is
  bitwise what decode computes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import paged_decode_attention


def norm_rope_ref(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """x [R, H, D] -> RMSNorm (1 + w) per head, then rotate the first rotary_dim channels."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)
    return apply_rope(y, cos, sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim channels of x [R, H, D] (rotate-half convention); the rest pass through."""
    rd = cos.shape[-1]
    xr, xp = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([xr * cos[:, None, :] + rotated * sin[:, None, :], xp], dim=-1)


def gated_decode_attention_ref(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """q, gate [S, Hq, D] -> attention output times sigmoid(gate), [S, Hq * D]."""
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
    S = q.shape[0]
    return out.reshape(S, -1) * torch.sigmoid(gate.reshape(S, -1))


@triton.jit
def _norm_rope_kernel(
    X, W, COS, SIN, Y, stride_r, stride_h, H, D, RD, eps, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    mask = d < D
    x = tl.load(X + r * stride_r + h * stride_h + d, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + d, mask=mask, other=0.0).to(tl.float32)
    y = (
        (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)) * (1.0 + w))
        .to(Y.dtype.element_ty)
        .to(tl.float32)
    )
    half = RD // 2
    # rotate-half partner of channel d (< RD): d + half for the first half, d - half for the second.
    partner = tl.where(d < half, d + half, d - half)
    xp = tl.load(X + r * stride_r + h * stride_h + partner, mask=d < RD, other=0.0).to(tl.float32)
    yp = (xp * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps))).to(tl.float32)
    wp = tl.load(W + partner, mask=d < RD, other=0.0).to(tl.float32)
    yp = (yp * (1.0 + wp)).to(Y.dtype.element_ty).to(tl.float32)
    rot = tl.where(d < half, -yp, yp)
    c = tl.load(COS + r * RD + d, mask=d < RD, other=1.0).to(tl.float32)
    s = tl.load(SIN + r * RD + d, mask=d < RD, other=0.0).to(tl.float32)
    out = tl.where(d < RD, y * c + rot * s, y)
    tl.store(Y + (r * H + h) * D + d, out.to(Y.dtype.element_ty), mask=mask)


def norm_rope_triton(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    R, H, D = x.shape
    assert x.stride(2) == 1
    y = torch.empty(R, H, D, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(D)
    _norm_rope_kernel[(R, H)](
        x, weight, cos.contiguous(), sin.contiguous(), y, x.stride(0), x.stride(1), H, D, cos.shape[-1], eps,
        BLOCK=block, num_warps=max(1, block // 128),
    )  # fmt: skip
    return y


@triton.jit
def _decode_attn_kernel(
    Q, GATE, KC, VC, TABLES, LENS, OUT, ROW_SEQ, ROW_J, ANC,
    q_stride_r, q_stride_h, g_stride_r, g_stride_h, table_stride, anc_stride, scale,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    GP: tl.constexpr, BN: tl.constexpr, TREE: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    kh = tl.program_id(1)
    G: tl.constexpr = HQ // HKV
    gi = tl.arange(0, GP)
    d = tl.arange(0, D)
    gmask = gi < G
    qh = kh * G + gi
    q = tl.load(Q + r * q_stride_r + qh[:, None] * q_stride_h + d[None, :], mask=gmask[:, None], other=0.0)
    if TREE:  # LENS = the sequence's committed length; this row sits at ctx + j
        s = tl.load(ROW_SEQ + r).to(tl.int64)
        ctx = tl.load(LENS + s)
        n_ctx = ctx + tl.load(ROW_J + r) + 1
    else:  # LENS = tokens visible to the row, its own included
        s = r
        ctx = tl.load(LENS + s)
        n_ctx = ctx
    m = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_sum = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D], dtype=tl.float32)
    offs = tl.arange(0, BN)
    for start in range(0, n_ctx, BN):
        pos = start + offs
        pmask = pos < n_ctx
        if TREE:  # tree rows see only their ancestors-or-self beyond the prefix
            tj = pos - ctx
            anc = tl.load(ANC + r * anc_stride + tj, mask=pmask & (tj >= 0), other=1)
            pmask = pmask & (anc != 0)
        blk = tl.load(TABLES + s * table_stride + pos // BS, mask=pmask, other=0)
        slot = blk.to(tl.int64) * BS + pos % BS
        base = (slot * HKV + kh) * D
        k = tl.load(KC + base[:, None] + d[None, :], mask=pmask[:, None], other=0.0)
        v = tl.load(VC + base[:, None] + d[None, :], mask=pmask[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [GP, BN]
        sc = tl.where(pmask[None, :], sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    out = acc / l_sum[:, None]
    out = out.to(OUT.dtype.element_ty).to(tl.float32)
    gt = tl.load(
        GATE + r * g_stride_r + qh[:, None] * g_stride_h + d[None, :], mask=gmask[:, None], other=0.0
    )
    res = out * tl.sigmoid(gt.to(tl.float32))
    tl.store(OUT + (r * HQ + qh[:, None]) * D + d[None, :], res.to(OUT.dtype.element_ty), mask=gmask[:, None])


def _launch(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, lens: torch.Tensor, scale: float, tree: tuple[torch.Tensor, ...] | None,
) -> torch.Tensor:  # fmt: skip
    R, Hq, D = q.shape
    Hkv, bs = k_cache.shape[2], k_cache.shape[1]
    assert q.stride(2) == 1 and gate.stride(2) == 1 and D == triton.next_power_of_2(D)
    out = torch.empty(R, Hq, D, dtype=q.dtype, device=q.device)
    tables = block_tables.contiguous()
    row_seq, row_j, anc = tree if tree is not None else (lens, lens, lens)  # unread without TREE
    gp = max(16, triton.next_power_of_2(Hq // Hkv))
    _decode_attn_kernel[(R, Hkv)](
        q, gate, k_cache, v_cache, tables, lens, out, row_seq, row_j, anc,
        q.stride(0), q.stride(1), gate.stride(0), gate.stride(1), tables.stride(0), anc.stride(0), scale,
        HQ=Hq, HKV=Hkv, D=D, BS=bs, GP=gp, BN=16, TREE=tree is not None, num_warps=4,
    )  # fmt: skip
    return out.view(R, Hq * D)


def gated_decode_attention_triton(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    return _launch(q, gate, k_cache, v_cache, block_tables, seq_lens, scale, None)


def gated_tree_attention_triton(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, row_seq: torch.Tensor, row_j: torch.Tensor,
    anc: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """q, gate [R, Hq, D] of packed tree rows -> [R, Hq * D]. ``row_seq`` [R] sequence of each row (its
    block table and ``context_lens`` entry), ``row_j`` [R] the row's index in its tree (its K/V sits at
    logical position context_len + j), ``anc`` [R, T] int8: 1 where tree row t is an ancestor-or-self."""
    assert anc.dtype == torch.int8 and anc.stride(1) == 1
    return _launch(q, gate, k_cache, v_cache, block_tables, context_lens, scale, (row_seq, row_j, anc))
