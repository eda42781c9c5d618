"""Path-parallel GDN tree scan in Triton (Algorithm 2 of the LumoTree design).

One program owns (path, value head, value tile): it loads its [K, BV] fp32 state tile once (the committed
state or a cut state), keeps it in registers across the path's sequential node updates, writes each node's
output, and exports the tile after every cut node into the cut buffer. One launch per level; a level starts
only after the previous one wrote its cut states (stream order). Only outputs come out: durable state is
published by native replay of the accepted path, so it stays bitwise that of plain decoding.

The per-node arithmetic is fla's ``fused_recurrent_gated_delta_rule`` operation for operation (same loads,
same l2norm, same order of scale / decay / delta / output), so a chain reproduces fla's decode numerics.

Shapes (fla layout, rows packed over sequences):
  q, k [1, R, H, K]; v [1, R, HV, V]; g [1, R, HV] log decay; beta [1, R, HV] post-sigmoid;
  initial_state [N, HV, K, V] fp32 committed states (read only), sequence s reads row ``state_indices[s]``;
  o [1, R, HV, V] in v's dtype; cut buffer [N_cut, HV, K, V] fp32 (4 * N_cut * HV * K * V bytes), kept
  in a per-device workspace and reused by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .tree_plan import PathPlan, plan_paths


@dataclass(frozen=True)
class TreeScanConfig:
    """Launch knobs of the scan (the benchmark sweeps them)."""

    block_v: int = 8
    """Value-tile width BV. 8 with one warp is fla's fused-recurrent tile: the same register layout gives
    the same reduction order, so tree outputs round exactly as native decoding's (the audit's paired rule
    against a float64 recurrence); other tiles are faster or slower but round differently."""
    num_warps: int = 1
    """Warps per program; the [K, BV] tile is split over them."""
    num_stages: int = 3
    """Software pipelining depth passed to Triton."""
    plan_mode: str = "levels"
    """How a tree is cut into paths when no plan is given (``tree_plan.PLAN_MODES``)."""
    chunk: int = 8
    """Nodes whose operands are loaded at once, before their sequential updates (a power of 2): the chain
    of updates then waits for memory once per chunk instead of once per node."""
    tiles: int = 1
    """Value tiles per program (1 or 2). Each tile keeps its own [K, BV] state and fla's arithmetic, so
    rounding is unchanged; a node's q and k are loaded once for all of them."""

    def __post_init__(self) -> None:
        assert self.chunk >= 1 and self.chunk & (self.chunk - 1) == 0, f"chunk {self.chunk}: a power of 2"
        assert self.tiles in (1, 2), f"tiles {self.tiles}: 1 or 2"


DEFAULT_CONFIG = TreeScanConfig()


@triton.jit
def _node_update(b_h, b_k, b_v, b_g, b_beta, b_q):
    """One node's update of a [K, BV] state tile and its output: fla's fused-recurrent step, op for op."""
    b_h *= tl.exp(b_g)
    b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
    b_h += b_k[:, None] * b_v
    return b_h, tl.sum(b_h * b_q[:, None], 0)


@triton.jit
def _pick_row(x, sel):
    """Row ``sel`` of a chunk [BL, D] loaded ahead, in fp32 (a masked sum: exact, one nonzero term)."""
    return tl.sum(tl.where(sel[:, None], x.to(tl.float32), 0.0), 0)


@triton.jit
def _pick(x, sel):
    """Entry ``sel`` of a chunk [BL] loaded ahead."""
    return tl.sum(tl.where(sel, x, 0), 0)


@triton.jit
def _tree_scan_kernel(
    q,
    k,
    v,
    g,
    beta,
    o,
    h0,
    h0_idx,
    cut,
    nodes,
    lens,
    start,
    write,
    cutidx,
    scale,
    L,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BL: tl.constexpr,
    NT: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV * NT)
    # path-major order: every tile of the (long, first) paths is dispatched before the next path's
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_p = pid // (NV * HV)
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV * NT + tl.arange(0, BV)
    o_v2 = o_v + BV  # the second tile (NT == 2)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_v2 = (o_v2 < V) & (NT == 2)
    mask_h = mask_k[:, None] & mask_v[None, :]
    mask_h2 = mask_k[:, None] & mask_v2[None, :]
    tile = o_k[:, None] * V + o_v[None, :]
    tile2 = o_k[:, None] * V + o_v2[None, :]

    n_len = tl.load(lens + i_p)
    s0 = tl.load(start + i_p).to(tl.int64)
    if s0 >= 0:
        src = cut + (s0 * HV + i_hv) * K * V
    else:
        row = tl.load(h0_idx + (-s0 - 1)).to(tl.int64)
        src = h0 + (row * HV + i_hv) * K * V
    b_h = tl.load(src + tile, mask=mask_h, other=0).to(tl.float32)
    b_h2 = tl.load(src + tile2, mask=mask_h2, other=0).to(tl.float32)

    # A chunk of BL nodes: all operands are loaded at once (they do not depend on the state), then the
    # sequential updates run out of registers; the arithmetic per node is fla's.
    o_l = tl.arange(0, BL)
    for c0 in range(0, n_len, BL):
        m_l = (c0 + o_l) < n_len
        m_lk = m_l[:, None] & mask_k[None, :]
        c_node = tl.load(nodes + i_p * L + c0 + o_l, mask=m_l, other=0).to(tl.int64)
        c_q = tl.load(q + (c_node[:, None] * H + i_h) * K + o_k[None, :], mask=m_lk, other=0)
        c_k = tl.load(k + (c_node[:, None] * H + i_h) * K + o_k[None, :], mask=m_lk, other=0)
        p_v = v + (c_node[:, None] * HV + i_hv) * V
        c_v = tl.load(p_v + o_v[None, :], mask=m_l[:, None] & mask_v[None, :], other=0)
        c_v2 = tl.load(p_v + o_v2[None, :], mask=m_l[:, None] & mask_v2[None, :], other=0)
        c_g = tl.load(g + c_node * HV + i_hv, mask=m_l, other=0).to(tl.float32)
        c_beta = tl.load(beta + c_node * HV + i_hv, mask=m_l, other=0).to(tl.float32)
        c_write = tl.load(write + i_p * L + c0 + o_l, mask=m_l, other=0)
        c_cut = tl.load(cutidx + i_p * L + c0 + o_l, mask=m_l, other=-1)
        for j in range(0, tl.minimum(BL, n_len - c0)):
            sel = o_l == j
            node = _pick(c_node, sel)
            b_q = _pick_row(c_q, sel)
            b_k = _pick_row(c_k, sel)
            b_g = _pick(c_g, sel)
            b_beta = _pick(c_beta, sel)
            if USE_QK_L2NORM_IN_KERNEL:
                b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_q = b_q * scale
            b_h, b_o = _node_update(b_h, b_k, _pick_row(c_v, sel), b_g, b_beta, b_q)
            if NT == 2:
                b_h2, b_o2 = _node_update(b_h2, b_k, _pick_row(c_v2, sel), b_g, b_beta, b_q)
            if _pick(c_write, sel) != 0:
                p_o = o + (node * HV + i_hv) * V
                tl.store(p_o + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
                if NT == 2:
                    tl.store(p_o + o_v2, b_o2.to(o.dtype.element_ty), mask=mask_v2)
            c = _pick(c_cut, sel).to(tl.int64)
            if c >= 0:
                dst = cut + (c * HV + i_hv) * K * V
                tl.store(dst + tile, b_h, mask=mask_h)
                if NT == 2:
                    tl.store(dst + tile2, b_h2, mask=mask_h2)


_workspace: dict[tuple[str, int], torch.Tensor] = {}
_retired: list[torch.Tensor] = []


def _identity_rows(device: torch.device, n: int) -> torch.Tensor:
    """0..n-1 on the device, kept (no per-call kernel: it matters inside CUDA graphs of 48 layers)."""
    key = (str(device), -n - 1)
    if key not in _workspace:
        _workspace[key] = torch.arange(n, device=device, dtype=torch.int32)
    return _workspace[key]


def cut_workspace(device: torch.device, numel: int) -> torch.Tensor:
    """The per-device fp32 cut buffer, grown on demand and shared by all layers and calls.

    Under CUDA-graph capture it must already be large enough (warm up once outside capture)."""
    key = (str(device), 0)
    buf = _workspace.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:  # a captured graph may still point at it: never free it
            _retired.append(buf)
        buf = torch.empty(max(numel, 1), dtype=torch.float32, device=device)
        _workspace[key] = buf
    return buf


def tree_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: Sequence[int] | torch.Tensor | None,
    initial_state: torch.Tensor,
    scale: float | None = None,
    plan: PathPlan | None = None,
    *,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    output_node_states: bool = False,
    config: TreeScanConfig = DEFAULT_CONFIG,
    cut_buffer: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]:
    """Tree scan outputs o [1, R, HV, V]; see the module docstring for shapes and conventions.

    Also accepts one sequence without the batch dim (q, k [N, H, K], v [N, HV, V], g, beta [N, HV],
    initial_state [HV, K, V]) and then returns o [N, HV, V]: the form ``kernels.dispatch.gdn_tree`` uses.

    parents/cu_seqlens are only read when ``plan`` is None (then planned once per topology, cached).
    state_indices [N_seq] int: row of ``initial_state`` for each sequence (None = row s for sequence s),
    so a layer's state pool slice can be passed without gathering. ``cut_buffer`` (fp32, at least
    N_cut * HV * K * V elements) overrides the shared workspace; ``out`` (like v) receives o. Node states
    are never returned.
    """
    if output_node_states:
        raise ValueError("the Triton tree scan returns outputs only; use tree_gdn_ref for node states")
    if q.dim() == 3:  # one sequence without the batch dim: q [N, H, K], initial_state [HV, K, V]
        assert initial_state.dim() == 3 and state_indices is None and cu_seqlens is None
        o, _ = tree_gdn(
            q[None], k[None], v[None], g[None], beta[None], parents, initial_state[None], scale, plan,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config, cut_buffer=cut_buffer,
            out=None if out is None else out[None],
        )  # fmt: skip
        return o[0], None
    if plan is None:
        if parents is None:
            raise ValueError("need parents or a plan")
        plan = plan_paths(parents, cu_seqlens, mode=config.plan_mode)
    B, R, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert B == 1 and R == plan.num_rows, f"q {tuple(q.shape)} vs plan of {plan.num_rows} rows"
    assert k.shape == q.shape and v.shape[:2] == (1, R) and HV % H == 0
    assert g.shape == (1, R, HV) and beta.shape == (1, R, HV), "g and beta must be [1, R, HV] (headwise)"
    assert initial_state.dtype == torch.float32 and initial_state.shape[1:] == (HV, K, V)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    if not initial_state.is_contiguous():
        initial_state = initial_state.contiguous()
    device = q.device
    scale = K**-0.5 if scale is None else float(scale)
    if state_indices is None:
        state_indices = _identity_rows(device, plan.num_seqs)
    o = torch.empty_like(v) if out is None else out
    assert o.shape == v.shape and o.is_contiguous()
    levels = plan.on(device)
    need = plan.num_cut * HV * K * V
    if cut_buffer is None:
        cut_buffer = cut_workspace(device, need)
    assert cut_buffer.numel() >= need and cut_buffer.dtype == torch.float32
    BK = triton.next_power_of_2(K)
    BV = min(config.block_v, triton.next_power_of_2(V))
    NV = triton.cdiv(V, BV * config.tiles)
    for lv in levels:
        _tree_scan_kernel[(lv.num_paths * HV * NV,)](
            q,
            k,
            v,
            g,
            beta,
            o,
            initial_state,
            state_indices,
            cut_buffer,
            lv.nodes,
            lv.lens,
            lv.start,
            lv.write,
            lv.cut,
            scale,
            lv.max_len,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            BL=min(config.chunk, triton.next_power_of_2(lv.max_len)),
            NT=config.tiles,
            USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return o, None


def native_replay_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> None:
    """Publish: replay accepted steps through fla's fused-recurrent kernel, updating ``state`` in place.

    q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; state [B, HV, K, V] fp32 contiguous (B may fold
    layers x sequences). The very kernel of AR decoding, launched with its final-state output aliased to its
    initial state (each program reads its tile once and writes it once at the end), so the result is bitwise
    what ``fused_recurrent_gated_delta_rule(..., output_final_state=True)`` returns, without the temporary.
    """
    from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as kern

    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    assert state.shape == (B, HV, K, V) and state.dtype == torch.float32 and state.is_contiguous()
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    BK = triton.next_power_of_2(K)
    BV = min(8, triton.next_power_of_2(V))  # fla's choice: same tiles, same reduction order
    o = torch.empty_like(v)
    kern[(triton.cdiv(V, BV) * B * HV,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=o, h0=state, ht=state,
        cu_seqlens=None, scale=scale, T=T, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, IS_BETA_HEADWISE=True,
        USE_QK_L2NORM_IN_KERNEL=False, APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=False,
        num_warps=1, num_stages=3,
    )  # fmt: skip
