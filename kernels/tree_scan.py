"""Path-parallel GDN tree scan in Triton (Algorithm 2 of the LumoTree design).

One program owns (path, value head, one or two value tiles): it loads its [K, BV] fp32 state tiles once
(the committed state or a cut state), keeps them in registers across the path's sequential node updates,
writes each node's output, and exports the tiles after every cut node into the cut buffer. One launch per
level; a level starts only after the previous one wrote its cut states (stream order). A "flat" plan is one
level of root-to-leaf paths from the committed state (shared prefixes recomputed, no cut buffer); a
"side" plan also evaluates a route node's leaf children from the state the program holds after that node
(``tree_plan.SIDE_CAP`` per step), so runner-up leaves need no route of their own. Only outputs come out:
durable state is published by native replay of the accepted path, so it stays bitwise that of plain
decoding.

The per-node arithmetic is fla's ``fused_recurrent_gated_delta_rule`` operation for operation (same loads,
same l2norm, same order of scale / decay / delta / output), so a chain reproduces fla's decode numerics.

Shapes (fla layout, rows packed over sequences):
  q, k [1, R, H, K]; v [1, R, HV, V]; g [1, R, HV] log decay; beta [1, R, HV] post-sigmoid;
  initial_state [N, HV, K, V] fp32 committed states (read only), sequence s reads row ``state_indices[s]``;
  o [1, R, HV, V] in v's dtype; cut buffer [N_cut, HV, K, V] fp32 (4 * N_cut * HV * K * V bytes), kept
  in a per-device workspace and reused by every layer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import triton
import triton.language as tl

from .tree_plan import PLAN_MODES, LevelPlan, PathPlan, WyPlan, plan_tree
from .tree_wy import TreeWyConfig, tree_gdn_wy
from .workspace import workspace

TREE_METHODS = (*PLAN_MODES, "wy")
"""``TreeScanConfig.plan_mode`` values: the scan's path plans and the matrix-form verifier."""


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
    """How a tree is verified when no plan is given: cut into paths (``tree_plan.PLAN_MODES``; ``auto``
    picks the one-launch sidecar plan unless its recomputed prefixes more than double the node updates, and
    ``wy`` for trees of at most ``wy_max_rows`` rows but short chains, ``scan_max_chain``), or ``wy``:
    no paths at all, the whole tree in one matrix pass in fp64 (``kernels.tree_wy``; launch knobs
    ``wy_block_v``, ``wy_num_warps`` and ``wy_block_k``, the scan's knobs unused)."""
    tiles: int = 1
    """Value tiles per program (1 or 2). Each tile is its own [K, BV] tensor with fla's layout, so the
    rounding does not change; two tiles share the q and k loads, one tile runs the unrolled plain walk (the
    faster of the two for hydra27 on the H200 since that unroll: 0.95 against 1.15 ms per 48 layers)."""
    pack: float = 0.0
    """Paths walked back to back by one program (``tree_plan.pack_paths``): a program's node updates stay
    within ``pack`` times the longest path's; 0 = one path per program. Off by default: on the H200 the
    sidecar scan of hydra27 (padded rows skipped) took 0.869 ms unpacked, 0.888 at 1.5 and 1.103 at 1.0
    (BENCHMARKS.md, run 10); fewer, longer programs lose more latency hiding than the second wave costs."""
    wy_block_v: int = TreeWyConfig.block_v
    """``wy``: value-tile width (at least 16, the dot's minimum); programs per head = V / wy_block_v, each
    recomputing the head's small tree matrices."""
    wy_num_warps: int = TreeWyConfig.num_warps
    """``wy``: warps per program."""
    wy_block_k: int = TreeWyConfig.block_k
    """``wy``: key-chunk width (a power of two of at least 16) of the products over the key dimension."""
    wy_num_stages: int = TreeWyConfig.num_stages
    """``wy``: pipelining depth of the key loop."""
    wy_group_rows: int = TreeWyConfig.group_rows
    """``wy``: 0, or the most rows one program verifies, trees cut into ancestor-closed groups."""
    wy_max_rows: int = 32
    """``auto``: batches whose trees have at most this many rows each are verified by ``wy``; 0 = never.
    Its outputs round differently from native decoding's, within the audit's paired rule, where the
    sidecar scan's equal them bit for bit. On the H100 wy verified hydra27 (32 rows) in 0.68 ms against the
    sidecar scan's 0.87 over 48 layers, and 64-row trees more slowly (BENCHMARKS.md, run 11)."""
    scan_max_chain: int = 8
    """``auto``: batches of chains of at most this many rows each are scanned (sidecar plan: one route per
    chain), whatever ``wy_max_rows``; their outputs are then native decoding's bit for bit. On the H100 the
    scan verified chains of 1, 4, 8 and 12 rows in 0.198, 0.294, 0.411 and 0.527 ms over 48 layers (run 11)
    against wy's 0.389, 0.411, 0.429 and 0.446 (run 13), and on the H200 in 0.189, 0.283, 0.402 against
    0.383, 0.404, 0.422 at 1, 4, 8 rows (run 14): wy's fixed cost only pays from about 9 rows, so the MTP-5
    (6 rows) and EAGLE (8 rows) chains are scanned."""
    maxnreg: int = 0
    """Register cap per thread (0: the compiler's choice): resident one-warp programs per SM are 65,536
    registers / (32 x registers per thread), at most 32; a cap trades spills for residency. The arithmetic,
    hence the rounding, is the same. On the H200 no cap from 96 to 168 beat none (BENCHMARKS.md, run 9)."""

    def wy_config(self) -> TreeWyConfig:
        """The ``wy_*`` knobs as the matrix-form verifier's own config."""
        return TreeWyConfig(
            self.wy_block_v, self.wy_num_warps, self.wy_block_k, self.wy_num_stages, self.wy_group_rows
        )

    @classmethod
    def from_env(cls, text: str | None = None) -> TreeScanConfig:
        """The defaults, overridden by ``LUMOTREE_TREE_SCAN`` (or ``text``): comma-separated ``field=value``,
        e.g. ``plan_mode=split,tiles=1``, so a benchmark can serve a swept config without a code change."""
        text = os.environ.get("LUMOTREE_TREE_SCAN", "") if text is None else text
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in text.split(","))):
            key, sep, val = item.partition("=")
            if not sep or key not in kinds:
                raise ValueError(
                    f"LUMOTREE_TREE_SCAN: {item!r} is not field=value with a field of {sorted(kinds)}"
                )
            parse = {"str": str, "int": int, "float": float}[str(kinds[key])]
            try:
                values[key] = parse(val)
            except ValueError:
                raise ValueError(f"LUMOTREE_TREE_SCAN: {key} must be a number, not {val!r}") from None
        cfg = cls(**values)
        if cfg.plan_mode not in TREE_METHODS:
            raise ValueError(f"LUMOTREE_TREE_SCAN: plan_mode {cfg.plan_mode!r} is not one of {TREE_METHODS}")
        return cfg


DEFAULT_CONFIG = TreeScanConfig.from_env()


@triton.jit
def _step(b_h, b_k, b_q, b_v, b_g, b_beta):
    """One node of fla's fused-recurrent update on a [K, BV] state tile (same ops, same order)."""
    b_h *= tl.exp(b_g)
    b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
    b_h += b_k[:, None] * b_v
    return b_h, tl.sum(b_h * b_q[:, None], 0)


@triton.jit
def _operands(q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
              V: tl.constexpr, BV: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
    """q, k, v (both tiles), g, beta of row ``n`` as fp32 (row 0's for an empty side slot ``n < 0``: its
    result is computed like any other and never stored)."""
    r = tl.maximum(n, 0)
    mask_k = o_k < K
    b_q = tl.load(q + (r * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(k + (r * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(v + (r * HV + i_hv) * V + o_v, mask=o_v < V, other=0).to(tl.float32)
    b_v1 = b_v
    if TILES == 2:
        b_v1 = tl.load(v + (r * HV + i_hv) * V + o_v + BV, mask=o_v + BV < V, other=0).to(tl.float32)
    b_g = tl.load(g + r * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta + r * HV + i_hv).to(tl.float32)
    return b_q, b_k, b_v, b_v1, b_g, b_beta


@triton.jit
def _node(b_h, b_h1, b_q, b_k, b_v, b_v1, b_g, b_beta, scale, USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
          TILES: tl.constexpr):  # fmt: skip
    """A node's update of both tiles and its output, from its parent's state tiles."""
    if USE_QK_L2NORM_IN_KERNEL:
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    b_h, b_o = _step(b_h, b_k, b_q, b_v, b_g, b_beta)
    b_o1 = b_o
    if TILES == 2:
        b_h1, b_o1 = _step(b_h1, b_k, b_q, b_v1, b_g, b_beta)
    return b_h, b_h1, b_o, b_o1


@triton.jit
def _store_out(o, n, i_hv, o_v, b_o, b_o1, ok, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
               TILES: tl.constexpr):  # fmt: skip
    if ok:
        p_o = o + (n * HV + i_hv) * V + o_v
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=o_v < V)
        if TILES == 2:
            tl.store(p_o + BV, b_o1.to(o.dtype.element_ty), mask=o_v + BV < V)


@triton.jit
def _walk(q, k, v, g, beta, o, cut, nodes, write, cutidx, side, scale, L, b_h, b_h1, i_p, i_h, i_hv, o_k, o_v,
          mask_h, mask_h1, tile, n_len, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
          BV: tl.constexpr, TILES: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, HAS_CUT: tl.constexpr,
          SIDE: tl.constexpr):  # fmt: skip
    """Walk path ``i_p`` from the state tiles ``b_h``/``b_h1``, writing outputs and cut states."""
    # Operands of step t + 1 (and the rows of step t + 2) are loaded while step t computes, and so are the
    # plan's per-step flags and the side rows of step t + 1: none depends on the state, so their memory
    # latency leaves the sequential chain. Side leaves are computed unconditionally (an empty slot on row
    # 0's operands, never stored) so that they share the step's basic block and fill its latency; their
    # operands are loaded as the step begins, ahead of the node update (loading them a step earlier too
    # would hold two more q/k pairs in registers). The math per node is fla's.
    base = nodes + i_p * L
    flags = i_p * L
    last = n_len - 1
    w_nxt = tl.load(write + flags)
    c_nxt = -1
    if HAS_CUT:
        c_nxt = tl.load(cutidx + flags).to(tl.int64)
    n_cur = tl.load(base)
    n_nxt = tl.load(base + tl.minimum(1, last))
    nb = _operands(q, k, v, g, beta, n_cur, i_h, i_hv, o_k, o_v, H, HV, K, V, BV, TILES)
    # rows of side slots 0 and 1 of the current step (SIDE <= 2: tree_plan.SIDE_CAP)
    a_cur = -1
    b_cur = -1
    if SIDE >= 1:
        a_cur = tl.load(side + flags * SIDE)
    if SIDE >= 2:
        b_cur = tl.load(side + flags * SIDE + 1)
    # The plain one-tile walk is unrolled by two: its operand rotation then needs no register moves and
    # ptxas can overlap one node's output reduction with the next node's update (253 instead of 291 sm_90
    # instructions per node). A sided or two-tile walk unrolled needs more registers than it saves (on the
    # H200 a two-tile sidecar scan went from 1.03 to 1.15 ms).
    for t in tl.range(0, n_len, loop_unroll_factor=2 if SIDE == 0 and TILES == 1 else 1):
        node = n_cur
        b_q, b_k, b_v, b_v1, b_g, b_beta = nb
        t1 = flags + tl.minimum(t + 1, last)
        a_row = a_cur
        b_row = b_cur
        if SIDE >= 1:
            na = _operands(q, k, v, g, beta, a_row, i_h, i_hv, o_k, o_v, H, HV, K, V, BV, TILES)
            a_cur = tl.load(side + t1 * SIDE)
        if SIDE >= 2:
            nbb = _operands(q, k, v, g, beta, b_row, i_h, i_hv, o_k, o_v, H, HV, K, V, BV, TILES)
            b_cur = tl.load(side + t1 * SIDE + 1)
        n_after = tl.load(base + tl.minimum(t + 2, last))
        nb = _operands(q, k, v, g, beta, n_nxt, i_h, i_hv, o_k, o_v, H, HV, K, V, BV, TILES)
        n_cur, n_nxt = n_nxt, n_after
        w, c = w_nxt, c_nxt
        w_nxt = tl.load(write + t1)
        if HAS_CUT:
            c_nxt = tl.load(cutidx + t1).to(tl.int64)

        b_h, b_h1, b_o, b_o1 = _node(b_h, b_h1, b_q, b_k, b_v, b_v1, b_g, b_beta, scale,
                                     USE_QK_L2NORM_IN_KERNEL, TILES)  # fmt: skip
        # leaf children of this node, from its state (their updated states are dropped); all stores come
        # after all updates, since a store's branch would split the block the updates interleave in
        a_o, a_o1, s_o, s_o1 = b_o, b_o1, b_o, b_o1
        if SIDE >= 1:
            sq, sk, sv, sv1, sg, sbeta = na
            _, _, a_o, a_o1 = _node(
                b_h, b_h1, sq, sk, sv, sv1, sg, sbeta, scale, USE_QK_L2NORM_IN_KERNEL, TILES
            )
        if SIDE >= 2:
            sq, sk, sv, sv1, sg, sbeta = nbb
            _, _, s_o, s_o1 = _node(
                b_h, b_h1, sq, sk, sv, sv1, sg, sbeta, scale, USE_QK_L2NORM_IN_KERNEL, TILES
            )
        _store_out(o, node, i_hv, o_v, b_o, b_o1, w != 0, HV, V, BV, TILES)
        if SIDE >= 1:
            _store_out(o, a_row, i_hv, o_v, a_o, a_o1, a_row >= 0, HV, V, BV, TILES)
        if SIDE >= 2:
            _store_out(o, b_row, i_hv, o_v, s_o, s_o1, b_row >= 0, HV, V, BV, TILES)
        if HAS_CUT:
            if c >= 0:
                p_c = cut + (c * HV + i_hv) * K * V + tile
                tl.store(p_c, b_h, mask=mask_h)
                if TILES == 2:
                    tl.store(p_c + BV, b_h1, mask=mask_h1)


@triton.jit
def _path(q, k, v, g, beta, o, h0, h0_idx, cut, nodes, lens, start, write, cutidx, side, sided, scale, L, i_p,
          i_h, i_hv, o_k, o_v, mask_h, mask_h1, tile, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
          V: tl.constexpr, BV: tl.constexpr, TILES: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
          HAS_CUT: tl.constexpr, SIDE: tl.constexpr):  # fmt: skip
    """Path ``i_p`` for one (value head, tile): its start state tiles, then the walk."""
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

    # A program of a sided path runs the walk with its side slots, every other one the plain walk (one
    # launch, so short sided paths overlap the long plain ones).
    sided_p = 0
    if SIDE > 0:
        sided_p = tl.load(sided + i_p)
    # Row offsets of the node operands fit in 32 bits (rows x heads x dim of one launch), so the per-node
    # address arithmetic stays 32-bit; the state and cut pointers above keep 64-bit offsets.
    i_h = i_h.to(tl.int32)
    i_hv = i_hv.to(tl.int32)
    if sided_p != 0:
        _walk(q, k, v, g, beta, o, cut, nodes, write, cutidx, side, scale, L, b_h, b_h1, i_p, i_h, i_hv, o_k,
              o_v, mask_h, mask_h1, tile, n_len, H, HV, K, V, BV, TILES, USE_QK_L2NORM_IN_KERNEL, HAS_CUT,
              SIDE)  # fmt: skip
    else:
        _walk(q, k, v, g, beta, o, cut, nodes, write, cutidx, side, scale, L, b_h, b_h1, i_p, i_h, i_hv, o_k,
              o_v, mask_h, mask_h1, tile, n_len, H, HV, K, V, BV, TILES, USE_QK_L2NORM_IN_KERNEL, HAS_CUT,
              0)  # fmt: skip


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
    side,
    sided,
    group,
    zero,
    scale,
    L,
    GM,
    NZ,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    TILES: tl.constexpr,
    USE_QK_L2NORM_IN_KERNEL: tl.constexpr,
    HAS_CUT: tl.constexpr,
    SIDE: tl.constexpr,
    PACKED: tl.constexpr,
):
    NT = tl.cdiv(tl.cdiv(V, BV), TILES)
    pid = tl.program_id(0).to(tl.int64)
    # path-major order: every tile of the (long, first) paths (or path groups) is dispatched before the next
    i_t = pid % NT
    i_hv = (pid // NT) % HV
    i_g = pid // (NT * HV)
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_t * (TILES * BV) + tl.arange(0, BV)
    mask_k = o_k < K
    mask_h = mask_k[:, None] & (o_v < V)[None, :]
    mask_h1 = mask_k[:, None] & (o_v + BV < V)[None, :]
    tile = o_k[:, None] * V + o_v[None, :]

    if i_g == 0:  # skipped rows (padded slots): zeros, so that nothing downstream reads garbage
        for z in range(0, NZ):
            p_z = o + (tl.load(zero + z).to(tl.int64) * HV + i_hv) * V + o_v
            tl.store(p_z, tl.zeros([BV], dtype=o.dtype.element_ty), mask=o_v < V)
            if TILES == 2:
                tl.store(p_z + BV, tl.zeros([BV], dtype=o.dtype.element_ty), mask=o_v + BV < V)
    if PACKED:  # this program walks the paths of group i_g back to back (``tree_plan.pack_paths``)
        for j in range(0, GM):
            i_p = tl.load(group + i_g * GM + j).to(tl.int64)
            if i_p >= 0:
                _path(q, k, v, g, beta, o, h0, h0_idx, cut, nodes, lens, start, write, cutidx, side, sided,
                      scale, L, i_p, i_h, i_hv, o_k, o_v, mask_h, mask_h1, tile, H, HV, K, V, BV, TILES,
                      USE_QK_L2NORM_IN_KERNEL, HAS_CUT, SIDE)  # fmt: skip
    else:
        _path(q, k, v, g, beta, o, h0, h0_idx, cut, nodes, lens, start, write, cutidx, side, sided, scale, L,
              i_g, i_h, i_hv, o_k, o_v, mask_h, mask_h1, tile, H, HV, K, V, BV, TILES,
              USE_QK_L2NORM_IN_KERNEL, HAS_CUT, SIDE)  # fmt: skip


_streams: dict[tuple[str, int], torch.cuda.Stream] = {}
_identity: dict[tuple[str, int], torch.Tensor] = {}


def _identity_rows(device: torch.device, n: int) -> torch.Tensor:
    """0..n-1 on the device, kept (no per-call kernel: it matters inside CUDA graphs of 48 layers)."""
    key = (str(device), n)
    if key not in _identity:
        _identity[key] = torch.arange(n, device=device, dtype=torch.int32)
    return _identity[key]


def cut_workspace(device: torch.device, numel: int) -> torch.Tensor:
    """The per-device fp32 cut buffer shared by all layers and calls (``workspace``)."""
    return workspace(device, "cut", numel, torch.float32)


def tree_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: Sequence[int] | torch.Tensor | None,
    initial_state: torch.Tensor,
    scale: float | None = None,
    plan: PathPlan | WyPlan | None = None,
    *,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    output_node_states: bool = False,
    config: TreeScanConfig = DEFAULT_CONFIG,
    cut_buffer: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    skip: Sequence[int] = (),
) -> tuple[torch.Tensor, None]:
    """Tree scan outputs o [1, R, HV, V]; see the module docstring for shapes and conventions.

    Also accepts one sequence without the batch dim (q, k [N, H, K], v [N, HV, V], g, beta [N, HV],
    initial_state [HV, K, V]) and then returns o [N, HV, V]: the form ``kernels.dispatch.gdn_tree`` uses.

    parents/cu_seqlens are only read when ``plan`` is None (then planned once per topology, cached).
    state_indices [N_seq] int: row of ``initial_state`` for each sequence (None = row s for sequence s),
    so a layer's state pool slice can be passed without gathering. ``cut_buffer`` (fp32, at least
    N_cut * HV * K * V elements) overrides the shared workspace; ``out`` (like v) receives o. Node states
    are never returned. ``skip`` (read with ``parents`` only): rows not computed, o = 0 there (a tree's
    padded slots; see ``plan_paths``).
    """
    if output_node_states:
        raise ValueError("the Triton tree scan returns outputs only; use tree_gdn_ref for node states")
    if plan is None:
        if parents is None:
            raise ValueError("need parents or a plan")
        plan = plan_tree(
            parents, cu_seqlens, config.plan_mode, skip, config.wy_max_rows, config.scan_max_chain
        )
    if isinstance(plan, WyPlan):
        return tree_gdn_wy(
            q, k, v, g, beta, None, initial_state, scale, plan, cu_seqlens=cu_seqlens,
            state_indices=state_indices, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            config=config.wy_config(), out=out,
        )  # fmt: skip
    assert config.plan_mode != "wy", "a path plan given to the wy method"
    if q.dim() == 3:  # one sequence without the batch dim: q [N, H, K], initial_state [HV, K, V]
        assert initial_state.dim() == 3 and state_indices is None and cu_seqlens is None
        o, _ = tree_gdn(
            q[None], k[None], v[None], g[None], beta[None], None, initial_state[None], scale, plan,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, config=config, cut_buffer=cut_buffer,
            out=None if out is None else out[None],
        )  # fmt: skip
        return o[0], None
    B, R, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert B == 1 and R == plan.num_rows, f"q {tuple(q.shape)} vs plan of {plan.num_rows} rows"
    assert k.shape == q.shape and v.shape[:2] == (1, R) and HV % H == 0
    assert R * max(H * K, HV * V) < 2**31, "the scan's per-node row offsets are 32-bit"
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
    groups = plan.groups(config.pack, device)
    zero = plan.zero_rows(device)
    need = plan.num_cut * HV * K * V
    if cut_buffer is None:
        cut_buffer = cut_workspace(device, need)
    assert cut_buffer.numel() >= need and cut_buffer.dtype == torch.float32
    BK = triton.next_power_of_2(K)
    BV = min(config.block_v, triton.next_power_of_2(V))
    assert config.tiles in (1, 2), "tiles must be 1 or 2"
    main = side_stream = None
    if plan.independent and len(levels) > 1 and q.is_cuda:  # fork: later levels on a second stream
        main, side_stream = torch.cuda.current_stream(device), _side_stream(device)
        side_stream.wait_stream(main)
    for i, lv in enumerate(levels):
        assert lv.num_side <= 2, "the kernel has two side slots per step"
        ctx = (
            torch.cuda.stream(side_stream) if side_stream is not None and i > 0 else contextlib.nullcontext()
        )
        with ctx:
            _launch(lv, groups[i], zero if i == 0 else None, q, k, v, g, beta, o, initial_state,
                    state_indices, cut_buffer, scale, H, HV, K, V, BK, BV, config,
                    use_qk_l2norm_in_kernel)  # fmt: skip
    if main is not None and side_stream is not None:  # join: the outputs are complete in stream order
        main.wait_stream(side_stream)
    return o, None


def _launch(
    lv: LevelPlan, group: torch.Tensor | None, zero: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    o: torch.Tensor, initial_state: torch.Tensor, state_indices: torch.Tensor, cut_buffer: torch.Tensor,
    scale: float, H: int, HV: int, K: int, V: int, BK: int, BV: int, config: TreeScanConfig,
    use_qk_l2norm_in_kernel: bool,
) -> None:  # fmt: skip
    """One level's launch (on the current stream): one program per (path or path group, head, tile)."""
    NT = triton.cdiv(triton.cdiv(V, BV), config.tiles)
    programs = lv.num_paths if group is None else group.shape[0]
    _tree_scan_kernel[(programs * HV * NT,)](
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
        lv.nodes if lv.side is None else lv.side,
        lv.lens if lv.sided is None else lv.sided,
        lv.lens if group is None else group,
        lv.lens if zero is None else zero,
        scale,
        lv.max_len,
        1 if group is None else group.shape[1],
        0 if zero is None else zero.numel(),
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=BK,
        BV=BV,
        TILES=config.tiles,
        USE_QK_L2NORM_IN_KERNEL=use_qk_l2norm_in_kernel,
        HAS_CUT=bool(lv.has_cut),
        SIDE=lv.num_side,
        PACKED=group is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        maxnreg=config.maxnreg or None,
    )


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The second stream of ``split`` plans, one per device, kept (it is first made outside any capture)."""
    key = (str(device), -1)
    if key not in _streams:
        _streams[key] = torch.cuda.Stream(device)
    return _streams[key]


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
