"""Native GDN decoding from state-pool rows, in place: the decode step and the commit's replay without the
gather and scatter around fla's kernel.

fla's ``fused_recurrent_gated_delta_rule`` reads its initial states from a dense [N, HV, K, V] tensor and
writes the final states to a new one, so the engine gathers the requests' pool rows before every decode
step and scatters the result back: two extra [S, HV, K, V] fp32 copies per GDN layer and two launches (at
the 27B shapes 0.44 ms of a 16.2 ms AR step on the H200), and two [L * S, HV, K, V] temporaries in the
commit. Here each program reads its [K, BV] tile from ``pool[rows[b]]``, keeps it in registers over the
T steps and writes it back to the same place (vLLM's state-indices form of the same kernel).

The program layout, the loads and the per-step arithmetic are fla's (BV 8, one warp; the update is
``tree_scan._step``, the function the tree scan runs), so outputs round as fla's do. The default on CUDA
(``kernels.dispatch``; ``LUMOTREE_GDN_STATE=gather`` restores the gather form): on the H200 its 27B-shape
decode logits equal the gather form's exactly and the step is 0.56 ms faster (BENCHMARKS.md, run 5).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import gdn_ref
from .tree_scan import _step


@triton.jit
def _node(b_h, q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, mask_k, mask_v, scale, H: tl.constexpr,
          HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):  # fmt: skip
    """fla's loads of operand row n and the tree scan's update: (state, output)."""
    b_q = tl.load(q + (n * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(k + (n * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(v + (n * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_g = tl.load(g + n * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta + n * HV + i_hv).to(tl.float32)
    return _step(b_h, b_k, b_q * scale, b_v, b_g, b_beta)


@triton.jit
def _decode_rows_kernel(q, k, v, g, beta, o, pool, rows, steps, scale, T, H: tl.constexpr, HV: tl.constexpr,
                        K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        STEPS: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_v, i_nh = pid % NV, pid // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_k[:, None] & mask_v[None, :]
    row = tl.load(rows + i_n).to(tl.int64)
    p_h = pool + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(p_h, mask=mask_h, other=0).to(tl.float32)
    for t in range(0, T):
        if STEPS:  # the commit's replay: each step's operand row from a table, < 0 = no step, no output
            n = tl.load(steps + i_n * T + t).to(tl.int64)
            if n >= 0:
                b_h, _ = _node(
                    b_h, q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, mask_k, mask_v, scale, H, HV, K, V
                )
        else:
            n = i_n * T + t
            b_h, b_o = _node(
                b_h, q, k, v, g, beta, n, i_h, i_hv, o_k, o_v, mask_k, mask_v, scale, H, HV, K, V
            )
            tl.store(o + (n * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
    tl.store(p_h, b_h, mask=mask_h)


def _check(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, pool: torch.Tensor,
           rows: torch.Tensor, B: int) -> None:  # fmt: skip
    """Operands [*lead, H, K] / [*lead, HV, V] / [*lead, HV] alike; B pool rows, one per sequence."""
    lead, (H, K), (HV, V) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
    assert v.shape[:-2] == lead and g.shape == beta.shape == (*lead, HV), "operand shapes"
    assert HV % H == 0, "value heads must be a multiple of key heads"
    assert pool.dtype == torch.float32 and pool.shape[1:] == (HV, K, V) and pool.is_contiguous(), "pool"
    assert rows.shape == (B,) and not rows.dtype.is_floating_point, "one integer pool row per sequence"


def decode_rows_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 scale: float, pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """T native steps for B sequences, sequence b's state being ``pool[rows[b]]``, advanced in place.

    q, k [B, T, H, K] (l2-normalised); v [B, T, HV, V]; g, beta [B, T, HV]; pool [N, HV, K, V] fp32
    contiguous; rows [B] distinct. Returns o [B, T, HV, V] in v's dtype. Steps with g = 0 and beta = 0
    leave a state bitwise unchanged (the gather form of the commit pads short paths with them).

    The pool keeps fla's [K, V] layout, so each program's [K, 8] tile is K pieces of 32 bytes. A
    tile-major pool (each tile one contiguous 4 KiB run) replayed hydra27's path 6% faster on the H100
    (BENCHMARKS.md, run 18: 0.153 against 0.163 ms over 48 layers), 0.005 ms of a 0.78 ms step, not worth
    a layout that fla's prefill and the verifiers' state reads do not share."""
    _check(q, v, g, beta, pool, rows, q.shape[0])
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty_like(v)
    _launch(q, k, v, g, beta, o, pool, rows, None, scale, B, T)
    return o


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            o: torch.Tensor | None, pool: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor | None,
            scale: float, B: int, T: int) -> None:  # fmt: skip
    H, K = q.shape[-2:]
    HV, V = v.shape[-2:]
    BV = min(8, triton.next_power_of_2(V))  # fla's tile: the same reduction order
    _decode_rows_kernel[(triton.cdiv(V, BV) * B * HV,)](
        q, k, v, g, beta, v if o is None else o, pool, rows, rows if steps is None else steps, float(scale),
        T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, STEPS=steps is not None, num_warps=1,
        num_stages=3,
    )  # fmt: skip


def gather_steps(x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Operand rows x [N, ...] at steps [B, T] -> [B, T, ...], zero where a step is < 0 (g = beta = 0 there
    leaves a state bitwise unchanged: the padded form of ``replay_rows_``)."""
    out = x.index_select(0, steps.clamp_min(0).reshape(-1)).view(*steps.shape, *x.shape[1:])
    mask = (steps >= 0).view(*steps.shape, *([1] * (x.dim() - 1)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))


def replay_rows_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 scale: float, pool: torch.Tensor, rows: torch.Tensor,
                 steps: torch.Tensor) -> None:  # fmt: skip
    """The commit's replay without gathering operands: ``pool[rows[b]]`` advances through the operand rows
    ``steps[b]`` in order (q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV] contiguous; steps [B, T] int, < 0
    = no step). Same per-step arithmetic as ``decode_rows_``, so the state equals decoding those rows; the
    outputs are not written."""
    B, T = steps.shape
    _check(q, v, g, beta, pool, rows, B)
    assert q.dim() == 3 and not steps.dtype.is_floating_point, "operand rows [N, ...], steps [B, T] int"
    assert all(x.is_contiguous() for x in (q, k, v, g, beta, steps)), "contiguous operands and steps"
    _launch(q, k, v, g, beta, None, pool, rows, steps, scale, B, T)


def replay_rows_ref_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     scale: float, pool: torch.Tensor, rows: torch.Tensor,
                     steps: torch.Tensor) -> None:  # fmt: skip
    """The PyTorch twin of ``replay_rows_``: the padded operands through ``decode_rows_ref_``."""
    qs, ks, vs, gs, bs = (gather_steps(x, steps) for x in (q, k, v, g, beta))
    decode_rows_ref_(qs, ks, vs, gs, bs, scale, pool, rows)


def decode_rows_ref_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     scale: float, pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The PyTorch twin of ``decode_rows_``: gather the rows, run the recurrent reference, scatter back."""
    _check(q, v, g, beta, pool, rows, q.shape[0])
    o, final = gdn_ref.recurrent_gdn_ref(q, k, v, g, beta, scale, pool.index_select(0, rows), True)
    assert final is not None
    pool.index_copy_(0, rows, final)
    return o
