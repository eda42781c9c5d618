"""The one place that picks GDN kernels: fla-core's Triton kernels on CUDA, the PyTorch references elsewhere.

fla is imported lazily and only for CUDA tensors (importing it on a machine without a GPU driver breaks).
Set ``LUMOTREE_GDN_BACKEND=ref`` to force the references everywhere (e.g. to compare on a GPU), and
``LUMOTREE_GDN_STATE=gather`` to gather the state-pool rows around fla's decode kernel instead of decoding
them in place (``gdn_decode_rows_``).

Operand convention for every entry point (fla layout): q, k [B, T, H, K] already l2-normalised (fp32), v
[B, T, HV, V], g (log decay) and beta (post-sigmoid) [B, T, HV]; states [N, HV, K, V] fp32.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import gdn_ref


def use_triton(x: torch.Tensor) -> bool:
    """True when ``x`` lives on a CUDA device and the reference backend is not forced."""
    return x.is_cuda and os.environ.get("LUMOTREE_GDN_BACKEND", "auto") != "ref"


@functools.cache
def _fla() -> Any:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked GDN over packed sequences (B = 1, ``cu_seqlens`` [N+1]); returns (o, final states [N, HV, K,
    V])."""
    if use_triton(q):
        chunk, _ = _fla()
        return chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                     cu_seqlens=cu_seqlens)  # fmt: skip
    o, s = gdn_ref.chunk_gdn_ref(q, k, v, g, beta, scale, initial_state, True, cu_seqlens)
    assert s is not None
    return o, s


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The native decode kernel: B sequences, T steps each, token by token (T = 1 for AR decoding; commit
    replays T accepted steps, padded steps having g = 0 and beta = 0, which leave the state bitwise
    unchanged)."""
    if use_triton(q):
        _, fused = _fla()
        return fused(
            q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=True
        )
    o, s = gdn_ref.recurrent_gdn_ref(q, k, v, g, beta, scale, initial_state, True)
    assert s is not None
    return o, s


def decodes_in_place(x: torch.Tensor) -> bool:
    """Whether ``gdn_decode_rows_`` runs the rows kernel for operands like ``x`` (no temporaries)."""
    flag = os.environ.get("LUMOTREE_GDN_STATE", "rows")
    return flag == "force" or (flag == "rows" and use_triton(x))


def gdn_decode_rows_(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    pool: torch.Tensor, rows: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """Native decoding (``gdn_decode``) of B sequences whose states are ``pool[rows]``, written back in place;
    returns o. The AR step and the commit's replay both come here, so a published state is the very
    arithmetic of plain decoding. On CUDA the rows are read and written by the kernel itself
    (``kernels.gdn_decode``; ``LUMOTREE_GDN_STATE=force`` runs it on any device, for CPU tests under
    TRITON_INTERPRET=1); elsewhere, or with ``LUMOTREE_GDN_STATE=gather``, they are gathered around fla's
    kernel (or the reference)."""
    if decodes_in_place(q):
        from .gdn_decode import decode_rows_

        return decode_rows_(q, k, v, g, beta, scale, pool, rows)
    o, final = gdn_decode(q, k, v, g, beta, scale, pool.index_select(0, rows))
    pool.index_copy_(0, rows, final)
    return o


def gdn_replay_rows_(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
    pool: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor,
) -> None:  # fmt: skip
    """The commit's replay: ``pool[rows[b]]`` advances through the operand rows ``steps[b]`` ([B, T], < 0 =
    no step) of q, k [N, H, K], v [N, HV, V], g, beta [N, HV]. In place, the rows kernel reads the steps'
    operands itself and skips the missing ones; otherwise they are gathered and padded with g = beta = 0
    steps (which leave a state bitwise unchanged) for ``gdn_decode_rows_``. Either way each state takes
    plain decoding's arithmetic."""
    from . import gdn_decode as gd

    if decodes_in_place(q):
        gd.replay_rows_(q, k, v, g, beta, scale, pool, rows, steps)
    else:
        qs, ks, vs, gs, bs = (gd.gather_steps(x, steps) for x in (q, k, v, g, beta))
        gdn_decode_rows_(qs, ks, vs, gs, bs, scale, pool, rows)


TreeFn = Callable[..., tuple[torch.Tensor, Any]]


@functools.cache
def _tree_kernel() -> TreeFn | None:
    try:
        from .tree_scan import tree_gdn  # type: ignore[import-not-found]
    except ImportError:
        return None
    return tree_gdn  # type: ignore[no-any-return]


def gdn_tree(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor | Sequence[int],
    initial_state: torch.Tensor,
    scale: float,
    plan: object | None = None,
) -> tuple[torch.Tensor, Any]:
    """Tree GDN over one sequence's tree: q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; parents [N] (-1 = the
    committed state, parents before children); initial_state [HV, K, V] fp32 -> (o [N, HV, V], None).

    CUDA: the path-parallel Triton scan ``kernels.tree_scan.tree_gdn`` when present (launch knobs:
    ``TreeScanConfig.from_env``); otherwise (and on CPU) the naive per-node loop."""
    if use_triton(q):
        kernel = _tree_kernel()
        if kernel is not None:
            return kernel(q, k, v, g, beta, parents, initial_state, scale, plan)
    return gdn_ref.naive_tree_gdn(q, k, v, g, beta, parents, initial_state, scale, plan)


def gdn_tree_batch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    parents: Sequence[Sequence[int]], pool: torch.Tensor, rows: torch.Tensor, scale: float,
    padded: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Tree GDN over S packed trees (rows of tree s follow tree s-1; ``parents[s]`` local to tree s), tree s
    starting from ``pool[rows[s]]``: o [R, HV, V]. CUDA: one scan launch per level for all trees, reading the
    pool through ``rows`` on the device (no host index, so it can be graph-captured). ``padded[s]``: local
    rows of tree s nobody samples (whole subtrees): not computed on CUDA, o = 0 there on every backend."""
    cu = [0]
    for par in parents:
        cu.append(cu[-1] + len(par))
    skip = [lo + r for lo, pad in zip(cu, padded or (), strict=False) for r in pad]
    if use_triton(q) and _tree_kernel() is not None:
        kernel = _tree_kernel()
        assert kernel is not None
        flat = [p for par in parents for p in par]
        o, _ = kernel(q[None], k[None], v[None], g[None], beta[None], flat, pool, scale,
                      cu_seqlens=cu, state_indices=rows, skip=skip)  # fmt: skip
        return o[0]  # type: ignore[no-any-return]
    outs = [
        gdn_tree(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], par, pool[rows[s]], scale)[0]
        for s, (par, lo, hi) in enumerate(zip(parents, cu[:-1], cu[1:], strict=True))
    ]
    o = torch.cat(outs)
    if skip:
        o[skip] = 0
    return o


# ---------------------------------------------------------------- fused row kernels of the decode path


def use_fused(x: torch.Tensor) -> bool:
    """Fused Triton row kernels (norms, SwiGLU product, GDN operand prep) on CUDA; ``LUMOTREE_FUSED=0`` turns
    them off (the PyTorch twins then run on the GPU too)."""
    flag = os.environ.get("LUMOTREE_FUSED", "1")
    # "force" runs them on any device (CPU tests under TRITON_INTERPRET=1).
    return flag == "force" or (use_triton(x) and flag != "0")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-centred RMSNorm of (x + residual); returns (normed, x + residual)."""
    from . import norm

    return (norm.rms_norm_triton if use_fused(x) else norm.rms_norm_ref)(x, weight, eps, residual)


def gated_rms_norm(
    o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """y = w * (o / rms(o)) * silu(z) in ``dtype`` (default o's), o rounded to it first: the fused kernel
    reads the GDN kernels' fp32 output directly instead of after a cast kernel."""
    from . import norm

    fn = norm.gated_rms_norm_triton if use_fused(o) else norm.gated_rms_norm_ref
    return fn(o, z, weight, eps, dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from . import norm

    return (norm.silu_mul_triton if use_fused(gate) else norm.silu_mul_ref)(gate, up)


def gdn_prep(
    src: torch.Tensor, win_idx: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Conv + SiLU + l2norm + g/beta: the GDN replay operands (q, k, v, g, beta) of every row, written into
    ``out`` (contiguous fp32 tensors of the operands' shapes) when given."""
    from . import gdn_prep as prep

    fn = prep.gdn_prep_triton if use_fused(src) else prep.gdn_prep_ref
    return fn(src, win_idx, conv_w, a, b, A_log, dt_bias, hk, dk, hv, dv, out)


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float
) -> torch.Tensor:
    """Per-head RMSNorm (1 + w) then partial RoPE of x [R, H, D] (may be a strided head view)."""
    from . import attention_decode as ad

    return (ad.norm_rope_triton if use_fused(x) else ad.norm_rope_ref)(x, weight, cos, sin, eps)


def gated_decode_attention(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor:  # fmt: skip
    """One query row per sequence over its paged K/V, times sigmoid(gate): [S, Hq * D]."""
    from . import attention_decode as ad

    fn = ad.gated_decode_attention_triton if use_fused(q) else ad.gated_decode_attention_ref
    return fn(q, gate, k_cache, v_cache, block_tables, seq_lens, scale)


def gated_tree_attention(
    q: torch.Tensor, gate: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, context_lens: torch.Tensor, row_seq: torch.Tensor, row_j: torch.Tensor,
    anc: torch.Tensor, scale: float,
) -> torch.Tensor | None:  # fmt: skip
    """Tree rows over their prefix and ancestors, times sigmoid(gate): [R, Hq * D] from the fused kernel;
    None where the fused kernels are off (the caller then runs ``attention.paged_attention_ref`` on host
    bounds, which cannot be graph-captured)."""
    from . import attention_decode as ad

    if not use_fused(q):
        return None
    return ad.gated_tree_attention_triton(
        q, gate, k_cache, v_cache, block_tables, context_lens, row_seq, row_j, anc, scale
    )


def gdn_prep_decode(
    qkv: torch.Tensor, conv_state: torch.Tensor, rows: torch.Tensor, conv_w: torch.Tensor, a: torch.Tensor,
    b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, dk: int, hv: int, dv: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Decode step: conv over (pool history, new row) advancing the history in place, then the operands."""
    from . import gdn_prep as prep

    fn = prep.gdn_prep_decode_triton if use_fused(qkv) else prep.gdn_prep_decode_ref
    return fn(qkv, conv_state, rows, conv_w, a, b, A_log, dt_bias, hk, dk, hv, dv)
