"""GDN operand preparation: causal conv over gathered windows + SiLU, q/k l2norm, decay g, strength beta.

One Triton program per (row, head slot) does the conv taps of that head's channels, the SiLU, the rounding
to the activation dtype, and the l2 normalisation (q and k heads) or the head's g and beta (v heads); the
PyTorch twin is ``gdn_prep_ref``. Inputs: src [M, C] pre-conv rows (history rows then new rows, activation
dtype), win_idx [R, W] rows of src per tap (oldest first), conv_w [C, W], a, b [R, HV], A_log, dt_bias [HV].
Outputs (the replay operands): q, k [R, HK, K] fp32 l2-normalised, v [R, HV, V] fp32, g, beta [R, HV] fp32.
Channel layout of C: [q (HK * K) | k (HK * K) | v (HV * V)].

``gdn_prep_decode`` is the decode-step special case: one new row per sequence, the W-1 history taps read from
and written back to the conv-state pool in place (pool layer [rows, C, W-1], oldest first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .conv import conv_windows

Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fp32 l2 normalisation as fla's kernels do it: x / sqrt(sum x^2 + eps)."""
    xf = x.float()
    return xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + eps)


def gdn_prep_ref(
    src: torch.Tensor, win_idx: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
    out: Operands | None = None,
) -> Operands:  # fmt: skip
    R = win_idx.shape[0]
    mixed = conv_windows(src, win_idx, conv_w)
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
    q = l2norm(q.reshape(R, hk, dk))
    k = l2norm(k.reshape(R, hk, dk))
    v = v.reshape(R, hv, dv).float()
    beta = torch.sigmoid(b.float())
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    if out is None:
        return q, k, v, g, beta
    for dst, x in zip(out, (q, k, v, g, beta), strict=True):
        dst.copy_(x)
    return out


@triton.jit
def _head_channels(h, HK, DK, DV, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """Program h of a row: q heads 0..HK-1, k heads HK..2HK-1, then value heads; its channels of q|k|v."""
    is_v = h >= 2 * HK
    hv = h - 2 * HK
    off = tl.where(is_v, 2 * HK * DK + hv * DV, h * DK)
    d = tl.arange(0, BLOCK)
    mask = d < tl.where(is_v, DV, DK)
    return is_v, hv, d, mask, off + d


@triton.jit
def _store_operands(  # type: ignore[no-untyped-def]
    act, r, h, is_v, hv, d, mask, A, B, SA, SB, ALOG, DTB, Q, K_, V_, G, BETA, HK, HV, DK, DV,
):  # fmt: skip
    """The shared epilogue: v (and the head's g, beta) for value heads, l2-normalised q or k otherwise."""
    if is_v:
        tl.store(V_ + (r * HV + hv) * DV + d, act, mask=mask)
        a = tl.load(A + r * SA + hv).to(tl.float32) + tl.load(DTB + hv).to(tl.float32)
        sp = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
        tl.store(G + r * HV + hv, -tl.exp(tl.load(ALOG + hv).to(tl.float32)) * sp)
        tl.store(BETA + r * HV + hv, tl.sigmoid(tl.load(B + r * SB + hv).to(tl.float32)))
    else:
        y = act / tl.sqrt(tl.sum(act * act, axis=0) + 1e-6)
        if h < HK:
            tl.store(Q + (r * HK + h) * DK + d, y, mask=mask)
        else:
            tl.store(K_ + (r * HK + (h - HK)) * DK + d, y, mask=mask)


@triton.jit
def _prep_kernel(
    SRC, WIN, CW, A, B, SA, SB, ALOG, DTB, Q, K_, V_, G, BETA,
    C, HK, HV, DK, DV,
    W: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    is_v, hv, d, mask, ch = _head_channels(h, HK, DK, DV, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in tl.static_range(W):
        row = tl.load(WIN + r * W + t)
        x = tl.load(SRC + row * C + ch, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(CW + ch * W + t, mask=mask, other=0.0).to(tl.float32)
        acc += x * w
    act = (acc * tl.sigmoid(acc)).to(SRC.dtype.element_ty).to(tl.float32)
    _store_operands(act, r, h, is_v, hv, d, mask, A, B, SA, SB, ALOG, DTB, Q, K_, V_, G, BETA, HK, HV, DK, DV)


def _dense_last(x: torch.Tensor) -> torch.Tensor:
    """x [R, HV] as the kernels read it (rows at x.stride(0)): a column slice of the fused projection's
    output is taken as it is, which saves a copy kernel per layer whenever R > 1."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _operand_buffers(R: int, hk: int, dk: int, hv: int, dv: int, device: torch.device) -> Operands:
    f32 = torch.float32
    return (
        torch.empty(R, hk, dk, dtype=f32, device=device),
        torch.empty(R, hk, dk, dtype=f32, device=device),
        torch.empty(R, hv, dv, dtype=f32, device=device),
        torch.empty(R, hv, dtype=f32, device=device),
        torch.empty(R, hv, dtype=f32, device=device),
    )


def gdn_prep_triton(
    src: torch.Tensor, win_idx: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
    out: Operands | None = None,
) -> Operands:  # fmt: skip
    R, W = win_idx.shape
    C = src.shape[1]
    q, k, v, g, beta = _operand_buffers(R, hk, dk, hv, dv, src.device) if out is None else out
    shapes = ((R, hk, dk), (R, hk, dk), (R, hv, dv), (R, hv), (R, hv))
    for x, shape in zip((q, k, v, g, beta), shapes, strict=True):
        # the kernel addresses rows densely: a caller's buffer must be exactly that layout
        assert x.shape == shape and x.dtype == torch.float32 and x.is_contiguous()
    block = triton.next_power_of_2(max(dk, dv))
    a, b = _dense_last(a), _dense_last(b)
    _prep_kernel[(R, 2 * hk + hv)](
        src.contiguous(), win_idx.contiguous(), conv_w.contiguous(), a, b, a.stride(0), b.stride(0), A_log,
        dt_bias, q, k, v, g, beta, C, hk, hv, dk, dv, W=W, BLOCK=block, num_warps=max(1, block // 64),
    )  # fmt: skip
    return q, k, v, g, beta


def gdn_prep_decode_ref(
    qkv: torch.Tensor, conv_state: torch.Tensor, rows: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor,
    b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
) -> Operands:  # fmt: skip
    from .conv import decode_window_index

    S, hist = qkv.shape[0], conv_state.shape[-1]
    old = conv_state.index_select(0, rows).transpose(1, 2).reshape(S * hist, -1)
    src = torch.cat([old.to(qkv.dtype), qkv], dim=0)
    win = decode_window_index(S, hist, qkv.device)
    conv_state.index_copy_(0, rows, src[win[:, 1:]].transpose(1, 2).to(conv_state.dtype))
    return gdn_prep_ref(src, win, conv_w, a, b, A_log, dt_bias, hk, dk, hv, dv)


@triton.jit
def _prep_decode_kernel(
    X, CS, ROWS, CW, A, B, SA, SB, ALOG, DTB, Q, K_, V_, G, BETA,
    C, HK, HV, DK, DV,
    W: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    is_v, hv, d, mask, ch = _head_channels(h, HK, DK, DV, BLOCK)
    row = tl.load(ROWS + s).to(tl.int64)
    hist_ptr = CS + (row * C + ch) * (W - 1)
    x_new = tl.load(X + s * C + ch, mask=mask, other=0.0)
    acc = x_new.to(tl.float32) * tl.load(CW + ch * W + (W - 1), mask=mask, other=0.0).to(tl.float32)
    # Taps oldest first, then shift the history by one and append the new input (same program: no race).
    for t in tl.static_range(W - 1):
        x = tl.load(hist_ptr + t, mask=mask, other=0.0)
        acc += x.to(tl.float32) * tl.load(CW + ch * W + t, mask=mask, other=0.0).to(tl.float32)
        if t > 0:
            tl.store(hist_ptr + t - 1, x, mask=mask)
    tl.store(hist_ptr + (W - 2), x_new.to(CS.dtype.element_ty), mask=mask)
    act = (acc * tl.sigmoid(acc)).to(X.dtype.element_ty).to(tl.float32)
    _store_operands(act, s, h, is_v, hv, d, mask, A, B, SA, SB, ALOG, DTB, Q, K_, V_, G, BETA, HK, HV, DK, DV)


def gdn_prep_decode_triton(
    qkv: torch.Tensor, conv_state: torch.Tensor, rows: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor,
    b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
) -> Operands:  # fmt: skip
    S, C = qkv.shape
    W = conv_w.shape[1]
    assert conv_state.is_contiguous() and conv_state.shape[1:] == (C, W - 1) and W >= 2
    q, k, v, g, beta = _operand_buffers(S, hk, dk, hv, dv, qkv.device)
    block = triton.next_power_of_2(max(dk, dv))
    a, b = _dense_last(a), _dense_last(b)
    _prep_decode_kernel[(S, 2 * hk + hv)](
        qkv.contiguous(), conv_state, rows, conv_w.contiguous(), a, b, a.stride(0), b.stride(0), A_log,
        dt_bias, q, k, v, g, beta, C, hk, hv, dk, dv, W=W, BLOCK=block, num_warps=max(1, block // 64),
    )  # fmt: skip
    return q, k, v, g, beta
