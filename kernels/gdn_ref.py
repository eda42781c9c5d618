"""PyTorch references for the gated delta rule (GDN): naive recurrent, naive chunked, float64, per-node tree.

Layout and conventions follow flash-linear-attention (fla):
  q, k  [B, T, H, K]    (already l2-normalised by the caller; ``scale`` multiplies q inside)
  v     [B, T, HV, V]   (HV a multiple of H: value head j reads key head j // (HV // H))
  g     [B, T, HV]      log decay (alpha = exp(g) <= 1)
  beta  [B, T, HV]      write strength (post-sigmoid)
  initial_state / final_state [N, HV, K, V] fp32, N = B or the number of ``cu_seqlens`` sequences.
Per step (fla's fused_recurrent order): S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T
(scale q).

Every reference computes one step with ``gdn_step``, so a chain through the tree reference, the recurrent
reference
and a replay are bitwise the same arithmetic on the same shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[..., H, K] -> [..., HV, K] by repeating each key head over its group of value heads."""
    h = x.shape[-2]
    return x if h == hv else x.repeat_interleave(hv // h, dim=-2)


def gdn_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One delta-rule update. state [B, HV, K, V]; q, k [B, HV, K] (q pre-scaled); v [B, HV, V]; g, beta [B,
    HV].

    Returns (new state, o [B, HV, V]). Reductions run over K with V innermost, so each output element's
    arithmetic does not depend on the batch size.
    """
    state = state * torch.exp(g)[..., None, None]
    kv = (state * k[..., :, None]).sum(-2)
    u = beta[..., None] * (v - kv)
    state = state + k[..., :, None] * u[..., None, :]
    o = (state * q[..., :, None]).sum(-2)
    return state, o


def _seq_ranges(batch: int, length: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, length) for b in range(batch)]
    assert batch == 1, "cu_seqlens needs a packed batch of 1"
    cu = cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def recurrent_gdn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Naive token-by-token GDN (the CPU twin of fla's ``fused_recurrent_gated_delta_rule``)."""
    B, T, _, K = k.shape
    HV, V = v.shape[-2:]
    scale = K**-0.5 if scale is None else scale
    cd = compute_dtype
    qf = _expand_heads(q.to(cd), HV) * scale
    kf = _expand_heads(k.to(cd), HV)
    vf, gf, bf = v.to(cd), g.to(cd), beta.to(cd)
    out_dtype = v.dtype if cd == torch.float32 else cd
    o = torch.empty(B, T, HV, V, dtype=out_dtype, device=v.device)
    if cu_seqlens is None:
        # Whole batch advances together: the same [B, HV, K, V] step as one native decode call.
        if initial_state is None:
            state = torch.zeros(B, HV, K, V, dtype=cd, device=v.device)
        else:
            state = initial_state.to(cd)
        for t in range(T):
            state, o_t = gdn_step(state, qf[:, t], kf[:, t], vf[:, t], gf[:, t], bf[:, t])
            o[:, t] = o_t.to(out_dtype)
        return o, (state.to(torch.float32) if cd == torch.float32 else state) if output_final_state else None
    finals = []
    for n, (b, s, e) in enumerate(_seq_ranges(B, T, cu_seqlens)):
        if initial_state is None:
            state = torch.zeros(1, HV, K, V, dtype=cd, device=v.device)
        else:
            state = initial_state[n : n + 1].to(cd)
        for t in range(s, e):
            state, o_t = gdn_step(
                state,
                qf[b : b + 1, t],
                kf[b : b + 1, t],
                vf[b : b + 1, t],
                gf[b : b + 1, t],
                bf[b : b + 1, t],
            )
            o[b, t] = o_t[0].to(out_dtype)
        finals.append(state)
    final = torch.cat(finals) if output_final_state else None
    return o, final


def float64_gdn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence in float64: the yardstick for error bounds (outputs and state stay float64)."""
    return recurrent_gdn_ref(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, compute_dtype=torch.float64
    )


def _chunk_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, heads first: q, k [HV, T, K] (q pre-scaled), v [HV, T, V], g, beta [HV, T], state [HV,
    K, V].

    Within a chunk with local cumulative log decay G_t, the corrections U solve the unit lower-triangular
    system
    (I + A) U = beta (V - e^G K S0), A_ts = beta_t e^(G_t - G_s) k_t.k_s for s < t; then
    o_t = e^(G_t) S0^T q_t + sum_(s<=t) e^(G_t - G_s) (q_t.k_s) u_s and S_end = e^(G_C) S0 + sum_s e^(G_C -
    G_s) k_s u_s^T.
    """
    HV, T, _ = q.shape
    out = torch.empty(HV, T, v.shape[-1], dtype=v.dtype, device=v.device)
    for c0 in range(0, T, chunk_size):
        c1 = min(T, c0 + chunk_size)
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1]
        G = g[:, c0:c1].cumsum(-1)  # [HV, C]
        C = c1 - c0
        diff = G[:, :, None] - G[:, None, :]  # G_t - G_s
        strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
        incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(0)
        decay_strict = torch.where(strict, diff, torch.full_like(diff, float("-inf"))).exp()
        decay_incl = torch.where(incl, diff, torch.full_like(diff, float("-inf"))).exp()
        A = bc[..., None] * (kc @ kc.transpose(-1, -2)) * decay_strict
        eye = torch.eye(C, dtype=q.dtype, device=q.device)
        rhs = bc[..., None] * (vc - (G.exp()[..., None] * kc) @ state)
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o_c = (G.exp()[..., None] * qc) @ state + ((qc @ kc.transpose(-1, -2)) * decay_incl) @ U
        out[:, c0:c1] = o_c
        g_end = G[:, -1:]
        state = g_end.exp()[..., None] * state + (kc * (g_end - G).exp()[..., None]).transpose(-1, -2) @ U
    return out, state


def chunk_gdn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Naive chunked GDN (the CPU twin of fla's ``chunk_gated_delta_rule``), fp32 inside, output in v's
    dtype."""
    B, T, _, K = k.shape
    HV, V = v.shape[-2:]
    scale = K**-0.5 if scale is None else scale
    f32 = torch.float32
    qf = _expand_heads(q.to(f32), HV) * scale
    kf = _expand_heads(k.to(f32), HV)
    vf, gf, bf = v.to(f32), g.to(f32), beta.to(f32)
    o = torch.empty(B, T, HV, V, dtype=v.dtype, device=v.device)
    finals = []
    for n, (b, s, e) in enumerate(_seq_ranges(B, T, cu_seqlens)):
        if initial_state is None:
            state = torch.zeros(HV, K, V, dtype=f32, device=v.device)
        else:
            state = initial_state[n].to(f32)
        if e > s:
            o_seq, state = _chunk_one(
                qf[b, s:e].transpose(0, 1),
                kf[b, s:e].transpose(0, 1),
                vf[b, s:e].transpose(0, 1),
                gf[b, s:e].transpose(0, 1),
                bf[b, s:e].transpose(0, 1),
                state,
                chunk_size,
            )
            o[b, s:e] = o_seq.transpose(0, 1).to(v.dtype)
        finals.append(state)
    final = torch.stack(finals) if output_final_state else None
    return o, final


def naive_tree_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor | Sequence[int],
    initial_state: torch.Tensor,
    scale: float | None = None,
    plan: object | None = None,
) -> tuple[torch.Tensor, None]:
    """Per-node tree GDN: node i starts from its parent's state (parent -1 = ``initial_state``).

    One sequence's tree: q, k [N, H, K]; v [N, HV, V]; g, beta [N, HV]; parents [N] with parents before
    children;
    initial_state [HV, K, V] fp32. Returns (o [N, HV, V] in v's dtype, None). ``plan`` is accepted and
    ignored.
    """
    N, _, K = k.shape
    HV = v.shape[-2]
    scale = K**-0.5 if scale is None else scale
    par = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
    assert len(par) == N and all(-1 <= p < i for i, p in enumerate(par)), "parents must precede children"
    f32 = torch.float32
    qf = _expand_heads(q.to(f32), HV) * scale
    kf = _expand_heads(k.to(f32), HV)
    vf, gf, bf = v.to(f32), g.to(f32), beta.to(f32)
    root = initial_state.to(f32)[None]
    states: list[torch.Tensor] = []
    outs = []
    for i, p in enumerate(par):
        s, o_i = gdn_step(
            root if p < 0 else states[p],
            qf[i : i + 1],
            kf[i : i + 1],
            vf[i : i + 1],
            gf[i : i + 1],
            bf[i : i + 1],
        )
        states.append(s)
        outs.append(o_i)
    o = torch.cat(outs).to(v.dtype) if outs else v.new_empty(0, HV, v.shape[-1])
    return o, None
