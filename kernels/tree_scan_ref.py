"""Naive per-node GDN recurrence over a packed batch of draft trees: the oracle of the Triton tree scan.

Conventions follow fla's ``fused_recurrent_gated_delta_rule`` (so a chain gives fla's numbers):
  q, k [1, R, H, K]; v [1, R, HV, V]; g [1, R, HV] (log decay, alpha = exp(g)); beta [1, R, HV]
  (post-sigmoid); HV is a multiple of H and value head h reads key head h // (HV // H).
  With ``use_qk_l2norm_in_kernel`` q and k are l2-normalised inside (x / sqrt(sum x^2 + 1e-6), as fla does);
  otherwise they are used as given. q is then multiplied by ``scale`` (default K^-0.5).
For node i with parent row p (-1 = the committed state of its sequence):
  S' = exp(g_i) * S_p;  u = beta_i * (v_i - S'^T k_i);  S_i = S' + k_i u^T;  o_i = S_i^T q_i.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .tree_plan import _global_parents


def _prep_qk(x: torch.Tensor, l2norm: bool) -> torch.Tensor:
    if l2norm:
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    return x


def tree_gdn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: Sequence[int] | torch.Tensor,
    initial_state: torch.Tensor,
    scale: float | None = None,
    plan: object | None = None,
    *,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    output_node_states: bool = False,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-node tree recurrence.

    initial_state [N, HV, K, V]: committed states; sequence s starts from ``initial_state[state_indices[s]]``
        (``state_indices`` None = ``initial_state[s]``). Never written.
    Returns o [1, R, HV, V] in v's dtype (``compute_dtype`` when it is float64) and, when asked, every node's
    state [R, HV, K, V] in ``compute_dtype``. ``plan`` is accepted for signature parity and ignored.
    """
    del plan
    if q.dim() == 3:  # one sequence without the batch dim (the dispatch form)
        o, st = tree_gdn_ref(
            q[None], k[None], v[None], g[None], beta[None], parents, initial_state[None], scale,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, output_node_states=output_node_states,
            compute_dtype=compute_dtype,
        )  # fmt: skip
        return o[0], st
    R, H, K = q.shape[1], q.shape[2], q.shape[3]
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"value heads {HV} must be a multiple of key heads {H}")
    scale = K**-0.5 if scale is None else scale
    p = [int(x) for x in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    cu = [0, R] if cu_seqlens is None else [int(x) for x in cu_seqlens]
    gp, seq = _global_parents(p, cu)
    cd = compute_dtype
    qf = _prep_qk(q[0].to(cd), use_qk_l2norm_in_kernel).repeat_interleave(HV // H, dim=1) * scale
    kf = _prep_qk(k[0].to(cd), use_qk_l2norm_in_kernel).repeat_interleave(HV // H, dim=1)
    vf, gf, bf = v[0].to(cd), g[0].to(cd), beta[0].to(cd)
    idx = torch.arange(len(cu) - 1) if state_indices is None else state_indices.cpu().long()
    states = torch.empty(R, HV, K, V, dtype=cd, device=v.device)
    o = torch.empty(R, HV, V, dtype=cd, device=v.device)
    for i in range(R):
        s_par = states[gp[i]] if gp[i] >= 0 else initial_state[int(idx[seq[i]])].to(cd)
        s = s_par * torch.exp(gf[i])[:, None, None]
        u = bf[i][:, None] * (vf[i] - torch.einsum("hkv,hk->hv", s, kf[i]))
        s = s + kf[i][:, :, None] * u[:, None, :]
        states[i] = s
        o[i] = torch.einsum("hkv,hk->hv", s, qf[i])
    out_dtype = cd if cd == torch.float64 else v.dtype
    return o.to(out_dtype)[None], (states if output_node_states else None)


def tree_gdn_float64(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float64 per-node recurrence (the accuracy reference of the paired rule)."""
    return tree_gdn_ref(*args, compute_dtype=torch.float64, **kwargs)


def states_of(result: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    """The node states of a ``tree_gdn_ref`` / ``tree_gdn_float64`` call with ``output_node_states=True``."""
    states = result[1]
    assert states is not None, "the call did not ask for output_node_states"
    return states


def paired_rule_ok(e_tree: float, e_native: float, m64: float, slack: float = 1.10) -> bool:
    """The paper's acceptance rule: E_tree <= 1.10 E_native + 2^-24 M64 + 2^-149."""
    return e_tree <= slack * e_native + 2.0**-24 * m64 + 2.0**-149
