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
BENCHMARKS.md, run 13.) Operands reach fp64 and outputs leave it through fp32
(the interpreter has no direct bf16 <-> fp64 cast), so a bf16 output is rounded twice: at most half an
fp32 ulp more. As in the scan, only outputs come out: durable state is
published by native replay of the accepted path, bitwise that of plain decoding.

One program per (value tile, value head, sequence), or two that meet through a workspace
(``TreeWyConfig.pair``); shapes as ``tree_scan.tree_gdn`` (fla layout, rows packed over sequences, at most
``MAX_ROWS`` per sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .tree_plan import WyPlan, plan_wy, wy_block_v, wy_pair_numel
from .workspace import workspace


@triton.jit
def _fp64_operand(x):
    """``x`` (a 2-D tile of any float dtype) in fp64, fit to be an fp64 dot operand on every Triton.

    Triton up to 3.6 sizes a dot operand's register layout (kWidth) by the narrowest load it traces back to
    through elementwise ops, and an fp64 operand traced to a bf16 load asks for a layout its fp64 MMA
    lowering does not support (the compile aborts). A reduction over a unit axis is an exact copy that ends
    that trace."""
    return tl.sum(x.to(tl.float32).to(tl.float64)[:, :, None], 2)


@triton.jit
def _key_products(q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, BT: tl.constexpr,
                  BV: tl.constexpr, TREE: tl.constexpr, STATE: tl.constexpr,
                  USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """In fp64: with ``TREE`` kk = K K^T, qk = Q K^T [BT, BT] and the rows' squared norms; with ``STATE``
    ks = K S0, qs = Q S0 [BT, BV] (what is not asked for stays zero)."""
    # The key dimension is walked in chunks of KC, in a loop left rolled, so only [BT, KC] and [KC, BV] fp64
    # operands are live at once: whole [BT, K] fp64 tiles, or an unrolled loop's hoisted loads, spill
    # registers on sm_90 (ptxas -v).
    kk = tl.zeros([BT, BT], dtype=tl.float64)
    qk = tl.zeros([BT, BT], dtype=tl.float64)
    ks = tl.zeros([BT, BV], dtype=tl.float64)
    qs = tl.zeros([BT, BV], dtype=tl.float64)
    ss_k = tl.zeros([BT], dtype=tl.float64)
    ss_q = tl.zeros([BT], dtype=tl.float64)
    kkq = tl.zeros([BT, 2 * BT], dtype=tl.float64)
    ss_kq = tl.zeros([2 * BT], dtype=tl.float64)
    o_2t = tl.arange(0, 2 * BT)
    rows_2t = (bos + o_2t % BT).to(tl.int64)
    m_2t = o_2t % BT < n
    for k0 in tl.range(0, BK, KC):
        o_k = k0 + tl.arange(0, KC)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        # all three loads before any conversion: 254 registers and no spill at BV 64 with 4 warps under
        # Triton 3.6, against 32 bytes spilled with each load converted in turn
        b_k = tl.load(k + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
        if STATE:
            b_q = tl.load(q + (rows[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
        else:
            # alone, [BT, BT] products would be laid out [warps, 1], wasting half of each MMA: K [K; Q]^T
            # is one [BT, 2 BT] product, laid out [1, warps]
            p_kq = tl.where(o_2t < BT, k, q)[None, :] + (rows_2t[None, :] * H + i_h) * K + o_k[:, None]
            b_kq = tl.load(p_kq, mask=m_k[:, None] & m_2t[None, :], other=0)
        if STATE:
            b_s = tl.load(h0 + ((i_n * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                          mask=m_k[:, None] & m_v[None, :], other=0)  # fmt: skip
        # Triton gives every dot of the loop the warp layout it picks for the last one (chained dots): a
        # [BT, BV] product last, so it is [1, warps] and no [BT, *] tile is replicated across warps.
        b_k = _fp64_operand(b_k)
        if STATE:
            b_q = _fp64_operand(b_q)
            if TREE:
                kk += tl.dot(b_k, tl.trans(b_k))
                qk += tl.dot(b_q, tl.trans(b_k))
                if USE_QK_L2NORM_IN_KERNEL:
                    ss_k += tl.sum(b_k * b_k, 1)
                    ss_q += tl.sum(b_q * b_q, 1)
            b_s = b_s.to(tl.float64)
            ks += tl.dot(b_k, b_s)
            qs += tl.dot(b_q, b_s)
        else:
            b_kq = _fp64_operand(b_kq)
            kkq += tl.dot(b_k, b_kq)
            if USE_QK_L2NORM_IN_KERNEL:
                ss_kq += tl.sum(b_kq * b_kq, 0)
    if not STATE:
        # kkq = [K K^T | K Q^T]: its halves are kk and qk^T
        kk, kq = tl.split(tl.permute(tl.reshape(kkq, [BT, 2, BT]), [0, 2, 1]))
        qk = tl.trans(kq)
        ss_k, ss_q = tl.split(tl.permute(tl.reshape(ss_kq, [2, BT]), [1, 0]))
    return kk, qk, ks, qs, ss_k, ss_q


@triton.jit
def _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, o_t, scale, SQUARINGS: tl.constexpr,
                 USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """W = P (I + A)^-1 [BT, BT] and the row factors c_q = e^G r_q, c_k = e^G r_k, so that
    O = c_q (Q S0) + W (beta (V - c_k (K S0)))."""
    if USE_QK_L2NORM_IN_KERNEL:
        r_k = 1.0 / tl.sqrt(ss_k + 1e-6)
        r_q = scale / tl.sqrt(ss_q + 1e-6)
    else:
        r_k = tl.full(ss_k.shape, 1.0, tl.float64)
        r_q = tl.full(ss_q.shape, scale, tl.float64)
    b_g = b_g.to(tl.float32).to(tl.float64)
    b_beta = b_beta.to(tl.float32).to(tl.float64)
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
    return b_w, e_G * r_q, e_G * r_k


@triton.jit
def _outputs(o, b_v, b_w, c_q, c_k, ks, qs, b_beta, kept, rows, i_hv, o_v, m_tv, HV: tl.constexpr,
             V: tl.constexpr):  # fmt: skip
    """O = c_q (Q S0) + W (beta (V - c_k (K S0))), zero on skipped rows, stored where ``m_tv``. ``b_v``: the
    value tile, or the value pointer to read it from (masked by ``m_tv``)."""
    if b_v.dtype.is_ptr():
        b_v = tl.load(b_v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0)
    b_beta = b_beta.to(tl.float32).to(tl.float64)
    b_b = b_beta[:, None] * (_fp64_operand(b_v) - c_k[:, None] * ks)
    b_o = c_q[:, None] * qs + tl.dot(b_w, b_b)
    b_o = tl.where(kept[:, None], b_o, 0.0)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(tl.float32).to(o.dtype.element_ty),
             mask=m_tv)  # fmt: skip


@triton.jit
def _arrive(count, o_t):
    """Count this program in at its pair's counter. Returns, per row of ``o_t``, whether it is the second
    (the pair's partials are then all written and visible); the second also resets the counter."""
    tl.debug_barrier()  # every thread's partial stores precede the release below
    old = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
    tl.store(count, 0, mask=old == 1)
    tl.debug_barrier()  # and the acquire precedes every thread's reads of the partner's partials
    return o_t * 0 + old == 1


@triton.jit
def _tree_wy_kernel(q, k, v, g, beta, o, h0, h0_idx, cu, anc, keep, scale, part, count, H: tl.constexpr,
                    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr,
                    BT: tl.constexpr, BV: tl.constexpr, SQUARINGS: tl.constexpr, PAIR: tl.constexpr,
                    PART: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    if PAIR:
        # two programs per value tile: one forms the tree matrix, one the state products; roles alternate
        # over heads, so which of the two finishes (and writes the outputs) varies even in the interpreter
        i_v, i_hv, i_s = tl.program_id(0) // 2, tl.program_id(1), tl.program_id(2)
        tree_role = (tl.program_id(0) + i_hv) % 2 == 0
    else:
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
    if not PAIR:
        kk, qk, ks, qs, ss_k, ss_q = _key_products(q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H,
                                                   HV, K, V, BK, KC, BT, BV, True, True,
                                                   USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
        # the value tile is read now, so its latency hides behind the tree products below (hydra27 on the
        # H100: 0.677 ms reading it after them in run 11, 0.642 with this and three pipeline stages in run 12)
        b_v = tl.load(v + (rows[:, None] * HV + i_hv) * V + o_v[None, :], mask=m_tv, other=0)
        b_w, c_q, c_k = _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, o_t, scale, SQUARINGS,
                                     USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
        _outputs(o, b_v, b_w, c_q, c_k, ks, qs, b_beta, kept, rows, i_hv, o_v, m_tv, HV, V)
    else:
        # the pair's PART partials (``tree_plan.wy_pair_numel``): W [BT, BT], c_q, c_k [BT] from the tree
        # program; ks, qs [BT, BV] from the state program; read back by whichever of the two arrives second
        i_p = (i_s * HV + i_hv) * tl.cdiv(V, BV) + i_v
        base = part + i_p * PART
        o_tt = o_t[:, None] * BT + o_t[None, :]
        o_tv = o_t[:, None] * BV + tl.arange(0, BV)[None, :]
        p_w, p_cq, p_ck = base + o_tt, base + BT * BT + o_t, base + BT * BT + BT + o_t
        p_ks, p_qs = base + BT * BT + 2 * BT + o_tv, base + BT * BT + 2 * BT + BT * BV + o_tv
        if tree_role:
            kk, qk, ks, qs, ss_k, ss_q = _key_products(q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v,
                                                       H, HV, K, V, BK, KC, BT, BV, True, False,
                                                       USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
            b_w, c_q, c_k = _tree_matrix(kk, qk, ss_k, ss_q, b_g, b_beta, bits, o_t, scale, SQUARINGS,
                                         USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
            tl.store(p_w, b_w)
            tl.store(p_cq, c_q)
            tl.store(p_ck, c_k)
            last = _arrive(count + i_p, o_t)
            ks = tl.load(p_ks, mask=last[:, None], other=0, cache_modifier=".cg")
            qs = tl.load(p_qs, mask=last[:, None], other=0, cache_modifier=".cg")
            # in each branch, not after them: a product in another region than the [BT, BT] chain's is
            # laid out on its own, and the chain then falls back to [warps, 1], wasting half of each MMA
            _outputs(o, v, b_w, c_q, c_k, ks, qs, b_beta, kept, rows, i_hv, o_v, m_tv & last[:, None], HV, V)
        else:
            kk, qk, ks, qs, ss_k, ss_q = _key_products(q, k, h0, bos, n, rows, m_t, i_n, i_h, i_hv, o_v, m_v,
                                                       H, HV, K, V, BK, KC, BT, BV, False, True,
                                                       USE_QK_L2NORM_IN_KERNEL)  # fmt: skip
            tl.store(p_ks, ks)
            tl.store(p_qs, qs)
            last = _arrive(count + i_p, o_t)
            b_w = tl.load(p_w, mask=last[:, None], other=0, cache_modifier=".cg")
            c_q = tl.load(p_cq, mask=last, other=0, cache_modifier=".cg")
            c_k = tl.load(p_ck, mask=last, other=0, cache_modifier=".cg")
            _outputs(o, v, b_w, c_q, c_k, ks, qs, b_beta, kept, rows, i_hv, o_v, m_tv & last[:, None], HV, V)


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
    under Triton 3.6 or 3.9 (``bench/analysis/wy_registers.py``)."""
    block_k: int = 16
    """Key-chunk width, a power of two of at least 16: the key dimension is reduced in chunks of this many
    columns, so fewer fp64 operands are live at once (wider chunks: fewer, larger dots, more registers;
    32 with 8 warps took 0.724 ms on the H100 in run 13, against 0.646 for the default)."""
    num_stages: int = 3
    """Software pipelining depth of the key loop: its chunks' loads are issued this many iterations minus
    one ahead (Triton's pipeliner copies them to shared memory asynchronously when they are 32-bit). On the
    H100 (run 12, a call whose raw files were lost): 3 and 4 both 0.640 ms, 2 0.815; run 13: 6 0.655
    against 3 0.646. The loop waits on its fp64 MMAs, not on its loads (run 13's Nsight profile)."""

    pair: int = 0
    """1: two programs per value tile and head instead of one, meeting through a workspace: one forms the
    tree matrix W from K K^T and Q K^T, the other the state products K S0 and Q S0, and whichever finishes
    second combines them into the outputs. Twice the programs, so up to two share an SM and hide each
    other's latency (one 4-warp program per SM leaves the fp64 pipe waiting: BENCHMARKS.md, run 13). The
    same fp64 products and sums in the same order as one program (bitwise the same outputs under the
    interpreter). Untimed so far."""

    def __post_init__(self) -> None:
        if self.pair not in (0, 1):
            raise ValueError(f"pair {self.pair}: 0 or 1")
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
    BV = wy_block_v(config.block_v, V)
    BK = max(16, triton.next_power_of_2(K))
    tiles = triton.cdiv(V, BV)
    stride = wy_pair_numel(plan.block_t, BV)
    part = count = o  # never read by one program per tile
    if config.pair:
        pairs = plan.num_seqs * HV * tiles
        part = workspace(device, "wy_part", pairs * stride, torch.float64)
        count = workspace(device, "wy_count", pairs, torch.int32, zero=True)
    _tree_wy_kernel[(tiles * (1 + config.pair), HV, plan.num_seqs)](
        q, k, v, g, beta, o, initial_state, state_indices, cu, anc, keep, scale, part, count,
        H=H, HV=HV, K=K, V=V, BK=BK, KC=min(config.block_k, BK), BT=plan.block_t, BV=BV,
        SQUARINGS=plan.squarings, PAIR=config.pair, PART=stride,
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return o, None
