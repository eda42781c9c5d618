"""Path-parallel GDN tree scan in Triton (Algorithm 2 of the LumoTree design).

One program owns (path, value head, one or two value tiles): it loads its [K, BV] fp32 state tiles once
(the committed state or a cut state), keeps them in registers across the path's sequential node updates,
writes each node's output, and exports the tiles after every cut node into the cut buffer. One launch per
level; a level starts only after the previous one wrote its cut states (stream order). A "flat" plan is one
level of root-to-leaf paths from the committed state (shared prefixes recomputed, no cut buffer); a
"packed" plan runs several of those routes back to back in one program, reloading the committed state
between them. Only outputs come out: durable state is published by native replay of the accepted path, so it
stays bitwise that of plain decoding.

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
    """Software pipelining depth of the node loop (operand prefetch)."""
    plan_mode: str = "auto"
    """How a tree is cut into paths when no plan is given (``tree_plan.PLAN_MODES``; ``auto`` picks one
    launch over root-to-leaf paths unless that more than doubles the node updates)."""
    tiles: int = 2
    """Value tiles per program (1 or 2). Each tile is its own [K, BV] tensor with fla's layout, so the
    rounding does not change; two independent update chains per warp hide each other's latency and share
    the q and k loads."""


DEFAULT_CONFIG = TreeScanConfig()


@triton.jit
def _step(b_h, b_k, b_q, b_v, b_g, b_beta):
    """One node of fla's fused-recurrent update on a [K, BV] state tile (same ops, same order)."""
    b_h *= tl.exp(b_g)
    b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
    b_h += b_k[:, None] * b_v
    return b_h, tl.sum(b_h * b_q[:, None], 0)


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
    reload,
    scale,
    L,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    TILES: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
    HAS_RELOAD: tl.constexpr,
    HAS_CUT: tl.constexpr,
):
    NT = tl.cdiv(tl.cdiv(V, BV), TILES)
    pid = tl.program_id(0).to(tl.int64)
    # path-major order: every tile of the (long, first) paths is dispatched before the next path's
    i_t = pid % NT
    i_hv = (pid // NT) % HV
    i_p = pid // (NT * HV)
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_t * (TILES * BV) + tl.arange(0, BV)
    o_v1 = o_v + BV
    mask_k = o_k < K
    mask_v = o_v < V
    mask_v1 = o_v1 < V
    mask_h = mask_k[:, None] & mask_v[None, :]
    mask_h1 = mask_k[:, None] & mask_v1[None, :]
    tile = o_k[:, None] * V + o_v[None, :]

    n_len = tl.load(lens + i_p)
    s0 = tl.load(start + i_p).to(tl.int64)
    if s0 >= 0:
        src = cut + (s0 * HV + i_hv) * K * V + tile
    else:
        row = tl.load(h0_idx + (-s0 - 1)).to(tl.int64)
        src = h0 + (row * HV + i_hv) * K * V + tile
    b_h = tl.load(src, mask=mask_h, other=0).to(tl.float32)
    b_h1 = b_h
    if TILES == 2:
        b_h1 = tl.load(src + BV, mask=mask_h1, other=0).to(tl.float32)

    # Operands of step t + 1 (and the row of step t + 2) are loaded while step t computes, and so are the
    # plan's per-step flags: none depends on the state, so their memory latency leaves the sequential
    # chain. The math per step is fla's.
    base = nodes + i_p * L
    flags = i_p * L
    last = n_len - 1
    w_nxt = tl.load(write + flags)
    c_nxt = -1
    if HAS_CUT:
        c_nxt = tl.load(cutidx + flags).to(tl.int64)
    r_nxt = 0
    if HAS_RELOAD:
        r_nxt = tl.load(reload + flags).to(tl.int64)
    n_cur = tl.load(base).to(tl.int64)
    n_nxt = tl.load(base + tl.minimum(1, last)).to(tl.int64)
    nb_q = tl.load(q + (n_cur * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    nb_k = tl.load(k + (n_cur * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    nb_v = tl.load(v + (n_cur * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
    nb_v1 = nb_v
    if TILES == 2:
        nb_v1 = tl.load(v + (n_cur * HV + i_hv) * V + o_v1, mask=mask_v1, other=0).to(tl.float32)
    nb_g = tl.load(g + n_cur * HV + i_hv).to(tl.float32)
    nb_beta = tl.load(beta + n_cur * HV + i_hv).to(tl.float32)
    for t in range(0, n_len):
        node = n_cur
        b_q, b_k, b_v, b_v1, b_g, b_beta = nb_q, nb_k, nb_v, nb_v1, nb_g, nb_beta
        n_after = tl.load(base + tl.minimum(t + 2, last)).to(tl.int64)
        nb_q = tl.load(q + (n_nxt * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
        nb_k = tl.load(k + (n_nxt * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
        nb_v = tl.load(v + (n_nxt * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
        if TILES == 2:
            nb_v1 = tl.load(v + (n_nxt * HV + i_hv) * V + o_v1, mask=mask_v1, other=0).to(tl.float32)
        nb_g = tl.load(g + n_nxt * HV + i_hv).to(tl.float32)
        nb_beta = tl.load(beta + n_nxt * HV + i_hv).to(tl.float32)
        n_cur, n_nxt = n_nxt, n_after
        t1 = flags + tl.minimum(t + 1, last)
        w, c, r = w_nxt, c_nxt, r_nxt
        w_nxt = tl.load(write + t1)
        if HAS_CUT:
            c_nxt = tl.load(cutidx + t1).to(tl.int64)
        if HAS_RELOAD:  # a packed program: the next route starts over from its committed state
            r_nxt = tl.load(reload + t1).to(tl.int64)
            if r < 0:
                p_r = h0 + (tl.load(h0_idx + (-r - 1)).to(tl.int64) * HV + i_hv) * K * V + tile
                b_h = tl.load(p_r, mask=mask_h, other=0).to(tl.float32)
                if TILES == 2:
                    b_h1 = tl.load(p_r + BV, mask=mask_h1, other=0).to(tl.float32)

        if USE_QK_L2NORM_IN_KERNEL:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_h, b_o = _step(b_h, b_k, b_q, b_v, b_g, b_beta)
        if TILES == 2:
            b_h1, b_o1 = _step(b_h1, b_k, b_q, b_v1, b_g, b_beta)
        if w != 0:
            p_o = o + (node * HV + i_hv) * V + o_v
            tl.store(p_o, b_o.to(o.dtype.element_ty), mask=mask_v)
            if TILES == 2:
                tl.store(p_o + BV, b_o1.to(o.dtype.element_ty), mask=mask_v1)
        if HAS_CUT:
            if c >= 0:
                p_c = cut + (c * HV + i_hv) * K * V + tile
                tl.store(p_c, b_h, mask=mask_h)
                if TILES == 2:
                    tl.store(p_c + BV, b_h1, mask=mask_h1)


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
    assert config.tiles in (1, 2), "tiles must be 1 or 2"
    NT = triton.cdiv(triton.cdiv(V, BV), config.tiles)
    for lv in levels:
        _tree_scan_kernel[(lv.num_paths * HV * NT,)](
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
            lv.cut if lv.reload is None else lv.reload,
            scale,
            lv.max_len,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BV=BV,
            TILES=config.tiles,
            USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
            HAS_RELOAD=lv.reload is not None,
            HAS_CUT=bool(lv.has_cut),
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
