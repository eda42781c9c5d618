"""Whole-tree GDN verification in one matrix pass (the WY / UT form of the delta rule over a tree), in Triton.

For node i with ancestors-or-self anc(i) (rows ordered parents before children), cumulative log decay
G_i = sum of g over anc(i), and committed state S0 [K, V] of its sequence, the per-node recurrence of
``tree_scan_ref`` unrolls to

  u_i = beta_i (v_i - e^{G_i} S0^T k_i - sum_{j in anc(i), j != i} e^{G_i - G_j} (k_j . k_i) u_j)
  o_i = e^{G_i} S0^T q_i + sum_{j in anc(i)} e^{G_i - G_j} (k_j . q_i) u_j

i.e. (I + A) U = B with A strictly lower triangular (nonzero only from a node to its strict ancestors), and
O = e^G (Q S0) + P U. A is nilpotent: A^d = 0 beyond the tree's depth d, so
(I + A)^-1 = (I - A)(I + A^2)(I + A^4)... with ceil(log2(d + 1)) factors, a few small matrix products.
The kernel folds them into W = P (I + A)^-1, a [BT, BT] matrix whatever the value tile's width, so that
O = e^G (Q S0) + W B costs one product with the value tile instead of one per factor.
Every node is computed at once from S0 by matrix products: no sequential chain over the tree's depth,
no cut states, no per-node reductions.

Numerics: a different order of operations than native decoding, so fp32 would round differently and, by
measurement, break the audit's paired rule (E_tree <= 1.10 E_native + 2^-24 M64) in about 5 % of
(case, head) cells. Everything after the loads is therefore computed in fp64 (fp32 products are exact
there and the sums carry 29 more bits), so the only error left of size is the final rounding to the
output dtype - below native decoding's own error. Operands reach fp64 and outputs leave it through fp32
(the interpreter has no direct bf16 <-> fp64 cast), so a bf16 output is rounded twice: at most half an
fp32 ulp more. As in the scan, only outputs come out: durable state is
published by native replay of the accepted path, bitwise that of plain decoding.

One program per (value tile, value head, sequence); shapes as ``tree_scan.tree_gdn`` (fla layout, rows
packed over sequences, at most ``MAX_ROWS`` per sequence).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .tree_plan import WyPlan, plan_wy


@triton.jit
def _fp64_operand(x):
    """``x`` (a 2-D tile of any float dtype) in fp64, fit to be an fp64 dot operand on every Triton.

    Triton up to 3.6 sizes a dot operand's register layout (kWidth) by the narrowest load it traces back to
    through elementwise ops, and an fp64 operand traced to a bf16 load asks for a layout its fp64 MMA
    lowering does not support (the compile aborts). A reduction over a unit axis is an exact copy that ends
    that trace (an fp64 tile computed from fp32 loads needs it too)."""
    if x.dtype != tl.float64:
        x = x.to(tl.float32).to(tl.float64)
    return tl.sum(x[:, :, None], 2)


@triton.jit
def _key_products(q, k, h0, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, BT: tl.constexpr,
                  BV: tl.constexpr, STATE: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """The products over the key dimension, in fp64: kk = K K^T and qk = Q K^T [BT, BT], with STATE
    ks = K S0 and qs = Q S0 [BT, BV], and (under the in-kernel l2norm) the rows' squared norms; q and k
    read as separate tiles."""
    # The key dimension is walked in chunks of KC, in a loop left rolled, so only [BT, KC] and [KC, BV] fp64
    # operands are live at once: whole [BT, K] fp64 tiles, or an unrolled loop's hoisted loads, spill
    # registers on sm_90 (ptxas -v).
    kk = tl.zeros([BT, BT], dtype=tl.float64)
    qk = tl.zeros([BT, BT], dtype=tl.float64)
    ks = tl.zeros([BT, BV], dtype=tl.float64)
    qs = tl.zeros([BT, BV], dtype=tl.float64)
    ss_k = tl.zeros([BT], dtype=tl.float64)
    ss_q = tl.zeros([BT], dtype=tl.float64)
    for k0 in tl.range(0, BK, KC):
        o_k = k0 + tl.arange(0, KC)
        m_k = o_k < K
        # all three loads before any conversion: 254 registers and no spill at BV 64 with 4 warps under
        # Triton 3.6, against 32 bytes spilled with each load converted in turn
        b_k, b_q = _qk_chunk(q, k, rows, m_t, o_k, m_k, i_h, H, K)
        if STATE:
            b_s = tl.load(h0 + ((i_n * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                          mask=m_k[:, None] & m_v[None, :], other=0)  # fmt: skip
        b_k = _fp64_operand(b_k)
        b_q = _fp64_operand(b_q)
        kk += tl.dot(b_k, tl.trans(b_k))
        qk += tl.dot(b_q, tl.trans(b_k))
        if STATE:
            b_s = b_s.to(tl.float64)
            ks += tl.dot(b_k, b_s)
            qs += tl.dot(b_q, b_s)
        if USE_QK_L2NORM_IN_KERNEL:
            ss_k += tl.sum(b_k * b_k, 1)
            ss_q += tl.sum(b_q * b_q, 1)
    return kk, qk, ks, qs, ss_k, ss_q


@triton.jit
def _qk_chunk(q, k, rows, m_t, o_k, m_k, i_h, H: tl.constexpr, K: tl.constexpr):
    """The [BT, KC] tiles of k and q at key columns ``o_k`` (as stored: converted by the caller)."""
    m_tk = m_t[:, None] & m_k[None, :]
    b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
    b_q = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
    return b_k, b_q


@triton.jit
def _sequence_rows(cu, i_s, BT: tl.constexpr):
    """Sequence ``i_s``'s packed rows (int64, padded to BT) and their mask."""
    bos = tl.load(cu + i_s)
    o_t = tl.arange(0, BT)
    return (bos + o_t).to(tl.int64), o_t < tl.load(cu + i_s + 1) - bos


@triton.jit
def _row_loads(g, beta, anc, keep, rows, m_t, i_hv, HV: tl.constexpr):
    """Per-row scalars of value head ``i_hv``: decay g and beta (as stored), ancestor bits, kept mask."""
    b_g = tl.load(g + rows * HV + i_hv, mask=m_t, other=0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0)
    bits = tl.load(anc + rows, mask=m_t, other=0)
    kept = tl.load(keep + rows, mask=m_t, other=0) != 0
    return b_g, b_beta, bits, kept


@triton.jit
def _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, scale, BT: tl.constexpr, SQUARINGS: tl.constexpr,
                 USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """W = P (I + A)^-1 [BT, BT], the row factors e^G r_q and e^G r_k, and beta, all fp64, from the key
    products."""
    o_t = tl.arange(0, BT)
    b_g = b_g.to(tl.float32).to(tl.float64)
    b_beta = b_beta.to(tl.float32).to(tl.float64)
    if USE_QK_L2NORM_IN_KERNEL:
        r_k = 1.0 / tl.sqrt(ss_k + 1e-6)
        r_q = scale / tl.sqrt(ss_q + 1e-6)
    else:
        r_k = tl.full([BT], 1.0, tl.float64)
        r_q = tl.full([BT], scale, tl.float64)
    is_anc = ((bits[:, None] >> o_t[None, :].to(tl.int64)) & 1) != 0  # [i, j]: j ancestor-or-self of i
    b_G = tl.sum(tl.where(is_anc, b_g[None, :], 0.0), 1)
    # decay from ancestor j to node i: G_i - G_j <= 0 there; elsewhere 0 before exp (never overflows)
    decay = tl.where(is_anc, tl.exp(tl.where(is_anc, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
    b_a = tl.where(is_anc & (o_t[:, None] != o_t[None, :]),
                   (b_beta * r_k)[:, None] * decay * kk * r_k[None, :], 0.0)  # fmt: skip
    # W = P (I + A)^-1 = P (I - A)(I + A^2)(I + A^4)...: [BT, BT] products, whatever the value tile's width
    b_w = r_q[:, None] * decay * qk * r_k[None, :]
    b_w = b_w - tl.dot(b_w, b_a)
    for _ in tl.static_range(SQUARINGS):
        b_a = tl.dot(b_a, b_a)
        b_w = b_w + tl.dot(b_w, b_a)
    e_G = tl.exp(b_G)
    return b_w, e_G * r_q, e_G * r_k, b_beta


@triton.jit
def _store_outputs(o, b_o, kept, rows, m_t, i_hv, o_v, m_v, HV: tl.constexpr, V: tl.constexpr):
    """Rows not kept (padded tree slots) are written as zeros."""
    b_o = tl.where(kept[:, None], b_o, 0.0)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(tl.float32).to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])  # fmt: skip


@triton.jit
def _tree_wy_kernel(q, k, v, g, beta, o, h0, h0_idx, cu, anc, keep, scale, H: tl.constexpr,
                    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr,
                    BT: tl.constexpr, BV: tl.constexpr, SQUARINGS: tl.constexpr,
                    USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """One kernel: one program per (value tile, value head, sequence) does everything."""
    i_v, i_hv, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    rows, m_t = _sequence_rows(cu, i_s, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    i_n = tl.load(h0_idx + i_s).to(tl.int64)
    # The small loads that do not depend on the key loop are issued before it, so their latency hides behind
    # its products (the value tile's too, or chunks of the loop issued one iteration ahead by hand, cost
    # registers and time on the H100: BENCHMARKS.md, run 11).
    b_g, b_beta, bits, kept = _row_loads(g, beta, anc, keep, rows, m_t, i_hv, HV)
    kk, qk, ks, qs, ss_k, ss_q = _key_products(
        q, k, h0, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H, HV, K, V, BK, KC, BT, BV, True,
        USE_QK_L2NORM_IN_KERNEL,
    )  # fmt: skip
    # the value tile is read now, so its latency hides behind the tree products below (hydra27 on the H100:
    # 0.677 ms reading it after them in run 11, 0.642 with this and three pipeline stages in run 12)
    b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                  other=0)  # fmt: skip
    b_w, c_q, c_k, b_beta = _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, scale, BT, SQUARINGS,
                                 USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
    b_b = b_beta[:, None] * (_fp64_operand(b_v) - c_k[:, None] * ks)
    _store_outputs(o, c_q[:, None] * qs + tl.dot(b_w, b_b), kept, rows, m_t, i_hv, o_v, m_v, HV, V)


@triton.jit
def _tree_fold_kernel(q, k, g, beta, cu, anc, keep, qf, wf, scale, H: tl.constexpr, HV: tl.constexpr,
                      K: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, BT: tl.constexpr,
                      SQUARINGS: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
                      PDL: tl.constexpr):  # fmt: skip
    """Two-pass form, first pass: one program per (value head, sequence) folds everything but the state and
    the values into Q' = diag(e^G r_q) Q - W diag(beta e^G r_k) K [BT, BK] and W diag(beta) [BT, BT], fp64,
    so that O = Q' S0 + W diag(beta) V (the second pass)."""
    i_hv, i_s = tl.program_id(0), tl.program_id(1)
    if PDL:  # the output programs may start now: they read qf and wf only after gdc_wait
        gdc_launch_dependents()
    i_h = i_hv // (HV // H)
    rows, m_t = _sequence_rows(cu, i_s, BT)
    o_t = tl.arange(0, BT)
    b_g, b_beta, bits, kept = _row_loads(g, beta, anc, keep, rows, m_t, i_hv, HV)
    kk, qk, _, _, ss_k, ss_q = _key_products(
        q, k, k, rows, m_t, 0, i_h, 0, o_t, m_t, H, 1, K, 1, BK, KC, BT, BT, False, USE_QK_L2NORM_IN_KERNEL
    )  # fmt: skip
    b_w, c_q, c_k, b_beta = _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, scale, BT, SQUARINGS,
                                 USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
    # rows not kept fold to zero, so the second pass writes their zeros with no mask of its own
    c_q = tl.where(kept, c_q, 0.0)
    b_w = tl.where(kept[:, None], b_w, 0.0)
    w_k = _fp64_operand(b_w * (b_beta * c_k)[None, :])
    at = (i_s * HV + i_hv).to(tl.int64) * BT + o_t
    tl.store(wf + at[:, None] * BT + o_t[None, :], b_w * b_beta[None, :])
    for k0 in tl.range(0, BK, KC):
        o_k = k0 + tl.arange(0, KC)
        b_k, b_q = _qk_chunk(q, k, rows, m_t, o_k, o_k < K, i_h, H, K)
        b_qf = c_q[:, None] * _fp64_operand(b_q) - tl.dot(w_k, _fp64_operand(b_k))
        tl.store(qf + at[:, None] * BK + o_k[None, :], b_qf)


@triton.jit
def _tree_out_kernel(v, o, h0, h0_idx, cu, qf, wf, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BK: tl.constexpr, KC: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                     PDL: tl.constexpr):  # fmt: skip
    """Two-pass form, second pass: one program per (value tile, value head, sequence),
    O = Q' S0 + W diag(beta) V from the first pass's folds."""
    i_v, i_hv, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows, m_t = _sequence_rows(cu, i_s, BT)
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    i_n = tl.load(h0_idx + i_s).to(tl.int64)
    b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                  other=0)  # fmt: skip
    if PDL:
        gdc_wait()
    at = (i_s * HV + i_hv).to(tl.int64) * BT + o_t
    b_o = tl.dot(tl.load(wf + at[:, None] * BT + o_t[None, :]), _fp64_operand(b_v))
    for k0 in tl.range(0, BK, KC):
        o_k = k0 + tl.arange(0, KC)
        m_k = o_k < K
        b_s = tl.load(h0 + ((i_n * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0)  # fmt: skip
        b_o += tl.dot(tl.load(qf + at[:, None] * BK + o_k[None, :]), b_s.to(tl.float64))
    _store_outputs(o, b_o, m_t, rows, m_t, i_hv, o_v, m_v, HV, V)


@dataclass(frozen=True)
class TreeWyConfig:
    """Launch knobs of the matrix-form verifier."""

    block_v: int = 64
    """Value-tile width, at least 16 (the dot's minimum): programs per (sequence, head) = V / block_v. Each
    recomputes the head's small tree matrices, so narrower tiles buy parallelism with repeated work. For
    hydra27 at the 27B heads on the H100, 64 with 4 warps was the fastest one-kernel config (BENCHMARKS.md,
    run 12): 0.642 ms over 48 layers, against 0.731 with 8 warps, 0.872 at 128 and 2.07 at 32 (8 warps)."""
    num_warps: int = 4
    """Warps per program. With 4 warps and 16-column key chunks a 64-wide tile spills no registers on sm_90
    under Triton 3.6 or 3.9 (``bench/analysis/wy_registers.py``)."""
    block_k: int = 16
    """Key-chunk width, a power of two of at least 16: the key dimension is reduced in chunks of this many
    columns, so fewer fp64 operands are live at once (wider chunks: fewer, larger dots, more registers)."""
    num_stages: int = 3
    """Software pipelining depth of the key loop: its chunks' loads are issued this many iterations minus
    one ahead (Triton's pipeliner copies them to shared memory asynchronously when they are 32-bit). On the
    H100 (run 12, a call whose raw files were lost): 3 and 4 both 0.640 ms, 2 0.815."""
    fold_warps: int = 0
    """0: one kernel. N >= 1: two, the first (N warps, one program per value head and sequence) folding the
    tree products into Q' = diag(e^G r_q) Q - W diag(beta e^G r_k) K [BT, K] and W diag(beta) [BT, BT] in
    fp64, the second (``num_warps`` warps per value tile) computing O = Q' S0 + W diag(beta) V from them:
    K S0 is never formed and the tree products are built once per value head instead of once per value
    tile, so a value tile's program is one product over the key dimension and can be narrow. The second
    pass starts by programmatic dependent launch where the device has it (sm_90+) and reads the folds after
    waiting for the first."""


def _pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled kernels (not the interpreter) on sm_90 or newer."""
    return (
        device.type == "cuda"
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        and torch.cuda.get_device_capability(device)[0] >= 9
    )


def tree_gdn_wy(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: Sequence[int] | torch.Tensor | None,
    initial_state: torch.Tensor,
    scale: float | None = None,
    plan: WyPlan | None = None,
    *,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    config: TreeWyConfig = TreeWyConfig(),
    out: torch.Tensor | None = None,
    skip: Sequence[int] = (),
) -> tuple[torch.Tensor, None]:
    """Tree GDN outputs o [1, R, HV, V] (or [R, HV, V] for one sequence without the batch dim, as
    ``tree_scan.tree_gdn``); ``parents``/``cu_seqlens``/``skip`` are read only when ``plan`` is None."""
    if q.dim() == 3:
        assert initial_state.dim() == 3 and state_indices is None and cu_seqlens is None
        o, _ = tree_gdn_wy(
            q[None], k[None], v[None], g[None], beta[None], parents, initial_state[None], scale, plan,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config,
            out=None if out is None else out[None], skip=skip,
        )  # fmt: skip
        return o[0], None
    if plan is None:
        if parents is None:
            raise ValueError("need parents or a plan")
        plan = plan_wy(parents, cu_seqlens, skip)
    B, R, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert B == 1 and R == plan.num_rows, f"q {tuple(q.shape)} vs plan of {plan.num_rows} rows"
    assert k.shape == q.shape and v.shape[:2] == (1, R) and HV % H == 0
    assert g.shape == (1, R, HV) and beta.shape == (1, R, HV), "g and beta must be [1, R, HV] (headwise)"
    assert initial_state.dtype == torch.float32 and initial_state.shape[1:] == (HV, K, V)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    initial_state = initial_state.contiguous()
    device = q.device
    scale = K**-0.5 if scale is None else float(scale)
    if state_indices is None:
        state_indices = torch.arange(plan.num_seqs, device=device, dtype=torch.int32)
    o = torch.empty_like(v) if out is None else out
    assert o.shape == v.shape and o.is_contiguous()
    cu, anc, keep = plan.on(device)
    for name in ("block_v", "block_k"):
        if (width := getattr(config, name)) < 16 or width & (width - 1):
            raise ValueError(f"{name} {width}: a power of two of at least 16")
    BV = min(config.block_v, max(16, triton.next_power_of_2(V)))
    BK = max(16, triton.next_power_of_2(K))
    KC = min(config.block_k, BK)
    S, BT = plan.num_seqs, plan.block_t
    common = dict(num_stages=config.num_stages)
    if not config.fold_warps:
        _tree_wy_kernel[(triton.cdiv(V, BV), HV, S)](
            q, k, v, g, beta, o, initial_state, state_indices, cu, anc, keep, scale,
            H=H, HV=HV, K=K, V=V, BK=BK, KC=KC, BT=BT, BV=BV, SQUARINGS=plan.squarings,
            USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, num_warps=config.num_warps, **common,
        )  # fmt: skip
        return o, None
    pdl = _pdl_capable(device)
    qf = torch.empty(S, HV, BT, BK, dtype=torch.float64, device=device)
    wf = torch.empty(S, HV, BT, BT, dtype=torch.float64, device=device)
    _tree_fold_kernel[(HV, S)](
        q, k, g, beta, cu, anc, keep, qf, wf, scale, H=H, HV=HV, K=K, BK=BK, KC=KC, BT=BT,
        SQUARINGS=plan.squarings, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, PDL=pdl,
        num_warps=config.fold_warps, **common,
    )  # fmt: skip
    _tree_out_kernel[(triton.cdiv(V, BV), HV, S)](
        v, o, initial_state, state_indices, cu, qf, wf, HV=HV, K=K, V=V, BK=BK, KC=KC, BT=BT, BV=BV, PDL=pdl,
        launch_pdl=pdl, num_warps=config.num_warps, **common,
    )  # fmt: skip
    return o, None
