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
output dtype - below native decoding's own error. (Products over the key dimension on bf16 tensor cores
from exact three-piece splits, and q and k stacked into one tile, were both slower on the H100:
BENCHMARKS.md, run 13; so were two programs per value tile, the tree matrix apart from the state products,
meeting through a workspace, on the H200: 1.06 ms against 0.64, run 14.) Operands reach fp64 and outputs
leave it through fp32 (the interpreter has no direct bf16 <-> fp64 cast), so a bf16 output is rounded
twice: at most half an fp32 ulp more. As in the scan, only outputs come out: durable state is
published by native replay of the accepted path, bitwise that of plain decoding.

One program per (value tile, value head, sequence); shapes as ``tree_scan.tree_gdn`` (fla layout, rows
packed over sequences, at most ``MAX_ROWS`` per sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .tree_plan import WyPlan, plan_wy


@triton.jit
def _fp64_operand(x):
    """``x`` (a 2-D tile of any float dtype) in fp64, fit to be an fp64 dot operand on every Triton.

    Triton up to 3.6 sizes a dot operand's register layout (kWidth) by the narrowest load it traces back to
    through elementwise ops, and an fp64 operand traced to a bf16 load asks for a layout its fp64 MMA
    lowering does not support (the compile aborts). A reduction over a unit axis is an exact copy that ends
    that trace."""
    return tl.sum(x.to(tl.float32).to(tl.float64)[:, :, None], 2)


@triton.jit
def _fp64_tile(x):
    """``x`` in fp64 as a dot operand. An fp32 tile needs no workaround and is converted in place: the
    workaround's reduction costs each key chunk a round trip through shared memory (hydra27 on the H100,
    BENCHMARKS.md run 18: 0.647 ms over 48 layers with it for every tile, 0.627 with fp32 tiles in place;
    same bits)."""
    if x.dtype == tl.float32:
        return x.to(tl.float64)
    else:
        return _fp64_operand(x)


@triton.jit
def _key_products(q, k, h0, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, BT: tl.constexpr,
                  BV: tl.constexpr, S0_FMA: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """kk = K K^T, qk = Q K^T [BT, BT], ks = K S0, qs = Q S0 [BT, BV] and the rows' squared norms, in fp64,
    four fp64 products per key chunk; with ``S0_FMA`` the two state products of a chunk are fp32 products
    on the FMA pipe instead (see ``TreeWyConfig.s0_fma``), each chunk's sums added to fp64 accumulators."""
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
        m_tk = m_t[:, None] & m_k[None, :]
        # all three loads before any conversion: with bf16 q and k, 254 registers and no spill at BV 64 with
        # 4 warps under Triton 3.6, against 32 bytes spilled with each load converted in turn; the served
        # fp32 tiles, converted in place, spill 72 bytes there and are still faster (run 18)
        b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
        b_q = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
        b_s = tl.load(h0 + ((i_n * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0)  # fmt: skip
        # Triton gives every dot of the loop the warp layout it picks for the last one (chained dots): a
        # [BT, BV] product last, so it is [1, warps] and no [BT, *] tile is replicated across warps.
        if S0_FMA:  # "ieee": no tensor cores, a chain of fp32 fma over the chunk's keys per output
            ks += tl.dot(b_k.to(tl.float32), b_s, input_precision="ieee").to(tl.float64)
            qs += tl.dot(b_q.to(tl.float32), b_s, input_precision="ieee").to(tl.float64)
        k64 = _fp64_tile(b_k)
        q64 = _fp64_tile(b_q)
        # converted beside the others as in the form timed in runs 18-21 (Triton 3.6: 254 registers, 72 bytes
        # spilled); converted after K K^T and Q K^T it compiles to 255 and 32, not yet timed
        s64 = b_s.to(tl.float64)
        kk += tl.dot(k64, tl.trans(k64))
        qk += tl.dot(q64, tl.trans(k64))
        if not S0_FMA:
            ks += tl.dot(k64, s64)
            qs += tl.dot(q64, s64)
        if USE_QK_L2NORM_IN_KERNEL:
            ss_k += tl.sum(k64 * k64, 1)
            ss_q += tl.sum(q64 * q64, 1)
    return kk, qk, ks, qs, ss_k, ss_q


@triton.jit
def _key_products_stacked(q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H: tl.constexpr,
                          HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                          KC: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                          USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """``_key_products`` with the state products on the FMA pipe and k and q stacked into one [2 BT, KC]
    tile: per key chunk one fp64 product K [K; Q]^T = [K K^T | K Q^T] and one fp32 product [K; Q] S0. The
    fp64 product's [BT, 2 BT] shape gets the warp layout [1, warps]; the square K K^T and Q K^T of
    ``_key_products`` get [warps, 1] once no [BT, BV] fp64 product shares their loop, and that layout
    wastes half of each 16-row fp64 MMA on 32 rows."""
    o_s = tl.arange(0, 2 * BT)
    is_q = o_s >= BT
    r_s = tl.where(is_q, o_s - BT, o_s)
    m_s = r_s < n
    rows_s = (bos + r_s).to(tl.int64)
    kq = tl.zeros([BT, 2 * BT], dtype=tl.float64)
    sv = tl.zeros([2 * BT, BV], dtype=tl.float64)
    ss = tl.zeros([2 * BT], dtype=tl.float64)
    for k0 in tl.range(0, BK, KC):
        o_k = k0 + tl.arange(0, KC)
        m_k = o_k < K
        off = (rows_s[:, None] * H + i_h) * K + o_k[None, :]
        b_qk = tl.load(tl.where(is_q[:, None], q + off, k + off), mask=m_s[:, None] & m_k[None, :], other=0)
        b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :],
                      other=0)  # fmt: skip
        b_s = tl.load(h0 + ((i_n * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0)  # fmt: skip
        sv += tl.dot(b_qk.to(tl.float32), b_s, input_precision="ieee").to(tl.float64)
        qk64 = _fp64_tile(b_qk)
        kq += tl.dot(_fp64_tile(b_k), tl.trans(qk64))
        if USE_QK_L2NORM_IN_KERNEL:
            ss += tl.sum(qk64 * qk64, 1)
    kk, kq_t = tl.split(tl.permute(tl.reshape(kq, [BT, 2, BT]), (0, 2, 1)))
    ks, qs = tl.split(tl.permute(tl.reshape(sv, [2, BT, BV]), (1, 2, 0)))
    ss_k, ss_q = tl.split(tl.permute(tl.reshape(ss, [2, BT]), (1, 0)))
    return kk, tl.trans(kq_t), ks, qs, ss_k, ss_q


@triton.jit
def _tree_wy_kernel(q, k, v, g, beta, o, h0, h0_idx, cu, anc, keep, scale, H: tl.constexpr, HV: tl.constexpr,
                    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr,
                    BT: tl.constexpr, BV: tl.constexpr, SQUARINGS: tl.constexpr, S0_FMA: tl.constexpr,
                    USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    i_v, i_hv, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu + i_s)
    n = tl.load(cu + i_s + 1) - bos
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < n, o_v < V
    rows = (bos + o_t).to(tl.int64)
    i_n = tl.load(h0_idx + i_s).to(tl.int64)
    m_tv = m_t[:, None] & m_v[None, :]
    # The small loads that do not depend on the key loop are issued before it, so their latency hides behind
    # its products (the value tile's too, or chunks of the loop issued one iteration ahead by hand, cost
    # registers and time on the H100: BENCHMARKS.md, run 11).
    b_g = tl.load(g + rows * HV + i_hv, mask=m_t, other=0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0)
    bits = tl.load(anc + rows, mask=m_t, other=0)
    kept = tl.load(keep + rows, mask=m_t, other=0) != 0
    if S0_FMA == 2:
        kk, qk, ks, qs, ss_k, ss_q = _key_products_stacked(
            q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H, HV, K, V, BK, KC, BT, BV,
            USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
    else:
        kk, qk, ks, qs, ss_k, ss_q = _key_products(
            q, k, h0, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H, HV, K, V, BK, KC, BT, BV, S0_FMA == 1,
            USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
    # the value tile is read now, so its latency hides behind the tree products below (hydra27 on the H100:
    # 0.677 ms reading it after them in run 11, 0.642 with this and three pipeline stages in run 12)
    b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0)
    if USE_QK_L2NORM_IN_KERNEL:
        r_k = 1.0 / tl.sqrt(ss_k + 1e-6)
        r_q = scale / tl.sqrt(ss_q + 1e-6)
    else:
        r_k = tl.full([BT], 1.0, tl.float64)
        r_q = tl.full([BT], scale, tl.float64)
    b_g = b_g.to(tl.float32).to(tl.float64)
    b_beta = b_beta.to(tl.float32).to(tl.float64)
    is_anc = ((bits[:, None] >> o_t[None, :].to(tl.int64)) & 1) != 0  # [i, j]: j ancestor-or-self of i
    b_G = tl.sum(tl.where(is_anc, b_g[None, :], 0.0), 1)
    # decay from ancestor j to node i: G_i - G_j <= 0 there; elsewhere 0 before exp (never overflows)
    decay = tl.where(is_anc, tl.exp(tl.where(is_anc, b_G[:, None] - b_G[None, :], 0.0)), 0.0)
    b_a = tl.where(is_anc & (o_t[:, None] != o_t[None, :]),
                   (b_beta * r_k)[:, None] * decay * kk * r_k[None, :], 0.0)  # fmt: skip
    # W = P (I + A)^-1 = P (I - A)(I + A^2)(I + A^4)...: [BT, BT] products, whatever the value tile's width.
    # Each power of A and then its factor, in turn: the same products paired by level (factor and next power
    # side by side) took 0.649 ms over 48 layers against 0.614 on the H100, and those levels interleaved
    # with Q S0 in a second, unrolled key loop, so the tree's dependent products would fill the fp64 pipe,
    # 0.768 (200 bytes spilled; 8 warps 0.872): BENCHMARKS.md, run 21.
    b_w = r_q[:, None] * decay * qk * r_k[None, :]
    b_w = b_w - tl.dot(b_w, b_a)
    for _ in tl.static_range(SQUARINGS):
        b_a = tl.dot(b_a, b_a)
        b_w = b_w + tl.dot(b_w, b_a)
    e_G = tl.exp(b_G)
    b_b = b_beta[:, None] * (_fp64_tile(b_v) - (e_G * r_k)[:, None] * ks)
    b_o = (e_G * r_q)[:, None] * qs + tl.dot(b_w, b_b)
    b_o = tl.where(kept[:, None], b_o, 0.0)
    tl.store(
        o + (rows[:, None] * HV + i_hv) * V + o_v[None, :],
        b_o.to(tl.float32).to(o.dtype.element_ty),
        mask=m_tv,
    )


@dataclass(frozen=True)
class TreeWyConfig:
    """Launch knobs of the matrix-form verifier."""

    block_v: int = 64
    """Value-tile width, at least 16 (the dot's minimum): programs per (sequence, head) = V / block_v. Each
    recomputes the head's small tree matrices, so narrower tiles buy parallelism with repeated work. For
    hydra27 at the 27B heads on the H100, 64 with 4 warps was the fastest (BENCHMARKS.md, run 12): 0.642 ms
    over 48 layers, against 0.731 with 8 warps, 0.872 at 128 and 2.07 at 32 (8 warps). So was this one
    kernel against every split of its work into two kernels tried (run 12): K K^T and Q K^T once per key
    head ahead of it, 0.719 ms; W once per value head ahead of it, 0.72 (a call whose raw files were lost);
    Q' = e^G Q - W' K and W diag(beta) once per value head, then O = Q' S0 + W diag(beta) V per value tile,
    1.08 at best (the first kernel alone took 18 us a layer, its [32, 32] products given a warp layout that
    wastes half of each fp64 MMA)."""
    num_warps: int = 4
    """Warps per program. With 4 warps and 16-column key chunks a 64-wide tile spills no registers on sm_90
    under Triton 3.6 or 3.9 with bf16 operands, 72 bytes with the served fp32 ones (``bench/analysis/
    wy_registers.py``); 8 warps spill none and were slower in every run (run 18: 0.712 against 0.627 ms)."""
    block_k: int = 16
    """Key-chunk width, a power of two of at least 16: the key dimension is reduced in chunks of this many
    columns, so fewer fp64 operands are live at once (wider chunks: fewer, larger dots, more registers;
    32 with 8 warps took 0.724 ms on the H100 in run 13, against 0.646 for the default)."""
    num_stages: int = 4
    """Software pipelining depth of the key loop: its chunks' loads are issued this many iterations minus
    one ahead (Triton's pipeliner copies them to shared memory asynchronously when they are 32-bit). On the
    H100 (run 12, a call whose raw files were lost): 3 and 4 both 0.640 ms, 2 0.815; run 13: 6 0.655
    against 3 0.646. Since fp32 tiles are converted in place (run 19): 4 0.613 and 0.615 ms (two bench
    processes), 3 0.622 and 0.623, 2 0.768."""

    s0_fma: int = 0
    """1: the state products K S0 and Q S0 (half of a program's multiply-adds) as fp32 products on the
    CUDA cores' FMA pipe, beside the fp64 tensor-core products rather than in their queue; each key chunk's
    sums (a chain of ``block_k`` fp32 fma per output) are added in fp64. Emulated on the GDN audit's
    operands (``bench/analysis/wy_precision.py``): 0 of 1,536 cells outside the paired rule, worst error
    0.30 of its bound at 16-key chunks (0.41 at 32, 0.94 as one 128-key chain), against 0.21 in fp64; on
    the GDN bench's operands with its per-node cells (``--bench-operands 48``, 64,512 cells): 0 outside,
    0.65 at 16 keys (1 outside at 32, 1,915 as one chain), against 0.26. Only 16-key chunks keep a margin.
    2: the same with q and k stacked into one tile (``_key_products_stacked``), so that the remaining fp64
    key product keeps a warp layout that wastes no MMA rows. 0 (all fp64) until a GPU run shows another
    faster."""

    def __post_init__(self) -> None:
        if self.s0_fma not in (0, 1, 2):
            raise ValueError(f"s0_fma {self.s0_fma}: 0, 1 or 2")
        for name in ("block_v", "block_k"):
            if (width := getattr(self, name)) < 16 or width & (width - 1):
                raise ValueError(f"{name} {width}: a power of two of at least 16")
        if self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"num_warps {self.num_warps}, num_stages {self.num_stages}: both positive")


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
    BV = min(config.block_v, max(16, triton.next_power_of_2(V)))
    BK = max(16, triton.next_power_of_2(K))
    _tree_wy_kernel[(triton.cdiv(V, BV), HV, plan.num_seqs)](
        q, k, v, g, beta, o, initial_state, state_indices, cu, anc, keep, scale,
        H=H, HV=HV, K=K, V=V, BK=BK, KC=min(config.block_k, BK), BT=plan.block_t, BV=BV,
        SQUARINGS=plan.squarings, S0_FMA=config.s0_fma, USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return o, None
