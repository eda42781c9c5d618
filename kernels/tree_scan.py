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

    block_v: int = 16
    """Value-tile width BV: smaller tiles give more programs (HV * V / BV per path) to fill the SMs."""
    num_warps: int = 1
    """Warps per program; the [K, BV] tile is split over them."""
    num_stages: int = 3
    """Software pipelining depth of the node loop (operand prefetch)."""


DEFAULT_CONFIG = TreeScanConfig()


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
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    # path-major order: every tile of the (long, first) paths is dispatched before the next path's
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_p = pid // (NV * HV)
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_k[:, None] & mask_v[None, :]
    tile = o_k[:, None] * V + o_v[None, :]

    n_len = tl.load(lens + i_p)
    s0 = tl.load(start + i_p).to(tl.int64)
    if s0 >= 0:
        b_h = tl.load(cut + (s0 * HV + i_hv) * K * V + tile, mask=mask_h, other=0).to(tl.float32)
    else:
        row = tl.load(h0_idx + (-s0 - 1)).to(tl.int64)
        b_h = tl.load(h0 + (row * HV + i_hv) * K * V + tile, mask=mask_h, other=0).to(tl.float32)

    for t in range(0, n_len):
        node = tl.load(nodes + i_p * L + t).to(tl.int64)
        b_q = tl.load(q + (node * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
        b_k = tl.load(k + (node * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
        b_v = tl.load(v + (node * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
        if USE_QK_L2NORM_IN_KERNEL:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_beta = tl.load(beta + node * HV + i_hv).to(tl.float32)
        b_g = tl.load(g + node * HV + i_hv).to(tl.float32)
        b_h *= tl.exp(b_g)
        b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
        b_h += b_k[:, None] * b_v
        b_o = tl.sum(b_h * b_q[:, None], 0)
        w = tl.load(write + i_p * L + t)
        if w != 0:
            tl.store(o + (node * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        c = tl.load(cutidx + i_p * L + t).to(tl.int64)
        if c >= 0:
            tl.store(cut + (c * HV + i_hv) * K * V + tile, b_h, mask=mask_h)


_workspace: dict[tuple[str, int], torch.Tensor] = {}


def cut_workspace(device: torch.device, numel: int) -> torch.Tensor:
    """The per-device fp32 cut buffer, grown on demand and shared by all layers and calls.

    Under CUDA-graph capture it must already be large enough (warm up once outside capture)."""
    key = (str(device), 0)
    buf = _workspace.get(key)
    if buf is None or buf.numel() < numel:
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
) -> tuple[torch.Tensor, None]:
    """Tree scan outputs o [1, R, HV, V]; see the module docstring for shapes and conventions.

    Also accepts one sequence without the batch dim (q, k [N, H, K], v [N, HV, V], g, beta [N, HV],
    initial_state [HV, K, V]) and then returns o [N, HV, V]: the form ``kernels.dispatch.gdn_tree`` uses.

    parents/cu_seqlens are only read when ``plan`` is None (then planned once per topology, cached).
    state_indices [N_seq] int: row of ``initial_state`` for each sequence (None = row s for sequence s),
    so a layer's state pool slice can be passed without gathering. ``cut_buffer`` (fp32, at least
    N_cut * HV * K * V elements) overrides the shared workspace. Node states are never returned.
    """
    if output_node_states:
        raise ValueError("the Triton tree scan returns outputs only; use tree_gdn_ref for node states")
    if q.dim() == 3:  # one sequence without the batch dim: q [N, H, K], initial_state [HV, K, V]
        assert initial_state.dim() == 3 and state_indices is None and cu_seqlens is None
        o, _ = tree_gdn(
            q[None], k[None], v[None], g[None], beta[None], parents, initial_state[None], scale, plan,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config, cut_buffer=cut_buffer,
        )  # fmt: skip
        return o[0], None
    if plan is None:
        if parents is None:
            raise ValueError("need parents or a plan")
        plan = plan_paths(parents, cu_seqlens)
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
        state_indices = torch.arange(plan.num_seqs, device=device, dtype=torch.int32)
    o = torch.empty_like(v)
    levels = plan.on(device)
    need = plan.num_cut * HV * K * V
    if cut_buffer is None:
        cut_buffer = cut_workspace(device, need)
    assert cut_buffer.numel() >= need and cut_buffer.dtype == torch.float32
    BK = triton.next_power_of_2(K)
    BV = min(config.block_v, triton.next_power_of_2(V))
    NV = triton.cdiv(V, BV)
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
            USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return o, None
