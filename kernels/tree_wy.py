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

One program per (value tile, value head, group), a group being a sequence's tree or, with
``TreeWyConfig.group_rows``, a set of its rows closed under ancestors (the restriction of (I + A)^-1 to such a
set is the inverse of the restricted I + A, so a group needs no row outside it); shapes as
``tree_scan.tree_gdn`` (fla layout, rows packed over sequences, at most ``MAX_ROWS`` per sequence).
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
                  BV: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    """kk = K K^T, qk = Q K^T [BT, BT], ks = K S0, qs = Q S0 [BT, BV] and the rows' squared norms, in fp64,
    four fp64 products per key chunk."""
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
        b_k = _fp64_tile(b_k)
        b_q = _fp64_tile(b_q)
        b_s = b_s.to(tl.float64)
        kk += tl.dot(b_k, tl.trans(b_k))
        qk += tl.dot(b_q, tl.trans(b_k))
        ks += tl.dot(b_k, b_s)
        qs += tl.dot(b_q, b_s)
        if USE_QK_L2NORM_IN_KERNEL:
            ss_k += tl.sum(b_k * b_k, 1)
            ss_q += tl.sum(b_q * b_q, 1)
    return kk, qk, ks, qs, ss_k, ss_q


@triton.jit
def _tree_wy_kernel(q, k, v, g, beta, o, h0, h0_idx, cu, anc, keep, slot_rows, group_seq, zero_rows, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                    KC: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, SQUARINGS: tl.constexpr,
                    GROUPED: tl.constexpr, BZ: tl.constexpr,
                    USE_QK_L2NORM_IN_KERNEL: tl.constexpr):  # fmt: skip
    i_v, i_hv, i_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu + i_g)
    n = tl.load(cu + i_g + 1) - bos
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t, m_v = o_t < n, o_v < V
    if GROUPED:  # slots gathered from the rows of the group's sequence
        slots = bos + o_t
        rows = tl.load(slot_rows + slots, mask=m_t, other=0).to(tl.int64)
        i_n = tl.load(h0_idx + tl.load(group_seq + i_g)).to(tl.int64)
    else:  # the group is a sequence's row range
        rows = (bos + o_t).to(tl.int64)
        slots = rows
        i_n = tl.load(h0_idx + i_g).to(tl.int64)
    m_tv = m_t[:, None] & m_v[None, :]
    # The small loads that do not depend on the key loop are issued before it, so their latency hides behind
    # its products (the value tile's too, or chunks of the loop issued one iteration ahead by hand, cost
    # registers and time on the H100: BENCHMARKS.md, run 11).
    b_g = tl.load(g + rows * HV + i_hv, mask=m_t, other=0)
    b_beta = tl.load(beta + rows * HV + i_hv, mask=m_t, other=0)
    bits = tl.load(anc + slots, mask=m_t, other=0)
    kept = tl.load(keep + slots, mask=m_t, other=0)
    kk, qk, ks, qs, ss_k, ss_q = _key_products(
        q, k, h0, rows, m_t, i_n, i_h, i_hv, o_v, m_v, H, HV, K, V, BK, KC, BT, BV, USE_QK_L2NORM_IN_KERNEL
    )
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
    b_o = tl.where(kept[:, None] != 0, b_o, 0.0)
    if GROUPED:  # keep -1: a row another group writes
        m_tv = m_tv & (kept[:, None] >= 0)
    tl.store(o + (rows[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(tl.float32).to(o.dtype.element_ty),
             mask=m_tv)  # fmt: skip
    if BZ > 0:  # skipped rows, which have no slot in a grouped plan
        z_rows = tl.load(zero_rows + i_g * BZ + tl.arange(0, BZ)).to(tl.int64)
        tl.store(
            o + (z_rows[:, None] * HV + i_hv) * V + o_v[None, :],
            tl.zeros([BZ, BV], dtype=o.dtype.element_ty),
            mask=(z_rows[:, None] >= 0) & m_v[None, :],
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
    group_rows: int = 0
    """0: one program per (value tile, head, tree). A power of two of at least 16: a tree with more rows is
    verified by several programs, each over a set of at most this many rows closed under ancestors
    (``WyPlan.grouped``; prefixes shared by two sets are computed by both, written by one), so each does a
    quarter of the [rows, rows] products at half the rows and the GPU gets more programs: hydra27 (28 live
    rows) becomes groups of 16 and 15 rows. Unchanged where a root-to-leaf path is longer. Off until timed
    on a GPU: at the 27B heads a 16-row program compiles to 168 registers without spills at BV 64 and 4
    warps (sm_90, Triton 3.6), against the served tile's 254 and 72 bytes spilled (BENCHMARKS.md,
    CPU-only session of 2026-12-08)."""

    def __post_init__(self) -> None:
        for name in ("block_v", "block_k"):
            if (width := getattr(self, name)) < 16 or width & (width - 1):
                raise ValueError(f"{name} {width}: a power of two of at least 16")
        if self.group_rows and (self.group_rows < 16 or self.group_rows & (self.group_rows - 1)):
            raise ValueError(f"group_rows {self.group_rows}: 0 or a power of two of at least 16")
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
    if config.group_rows:
        plan = plan.grouped(config.group_rows)
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
    tables = plan.on(device)
    BV = min(config.block_v, max(16, triton.next_power_of_2(V)))
    BK = max(16, triton.next_power_of_2(K))
    _tree_wy_kernel[(triton.cdiv(V, BV), HV, plan.num_groups)](
        q, k, v, g, beta, o, initial_state, state_indices, *tables, scale,
        H=H, HV=HV, K=K, V=V, BK=BK, KC=min(config.block_k, BK), BT=plan.block_t, BV=BV,
        SQUARINGS=plan.squarings, GROUPED=bool(plan.rows), BZ=plan.zero_width,
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return o, None
