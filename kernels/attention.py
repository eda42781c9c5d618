"""Paged attention references (PyTorch), grouped query heads, fp32 softmax.

KV cache per attention layer: k_cache, v_cache [num_blocks, block_size, Hkv, D]; slot = block * block_size +
offset.
"""

from __future__ import annotations

import torch


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store rows' K/V [R, Hkv, D] at their slots."""
    nb, bs = k_cache.shape[:2]
    k_cache.view(nb * bs, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_slots(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    nb, bs = cache.shape[:2]
    return cache.view(nb * bs, *cache.shape[2:])[slots]


def logical_slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical slot of each logical position of one sequence (block_table [max_blocks])."""
    return block_table[positions // block_size] * block_size + positions % block_size


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """q [n, Hq, D], k/v [L, Hkv, D], visible [n, L] bool -> [n, Hq, D] in q's dtype."""
    n, Hq, D = q.shape
    Hkv = k.shape[1]
    qg = q.float().view(n, Hkv, Hq // Hkv, D).permute(1, 2, 0, 3)  # [Hkv, G, n, D]
    scores = qg @ k.float().permute(1, 2, 0)[:, None] * scale  # [Hkv, G, n, L]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs @ v.float().permute(1, 0, 2)[:, None]  # [Hkv, G, n, D]
    return out.permute(2, 0, 1, 3).reshape(n, Hq, D).to(q.dtype)


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_bounds: list[tuple[int, int, int]],
    new_visible: list[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Attention of packed new rows over each sequence's committed prefix plus the visible new rows.

    q [R, Hq, D]; the new rows' K/V are already in the cache at ``slot_mapping``. ``seq_bounds[s]`` =
    (row start, row end, context_len) and ``new_visible[s]`` [n, n] bool says which new rows each new row sees
    (causal for a chain, ancestors-and-self for a tree). The prefix [0, context_len) is read through the
    block table.
    """
    out = torch.empty_like(q)
    bs = k_cache.shape[1]
    for s, (a, b, ctx) in enumerate(seq_bounds):
        if b == a:
            continue
        prefix = logical_slots(block_tables[s], torch.arange(ctx, device=q.device), bs)
        slots = torch.cat([prefix, slot_mapping[a:b]])
        k = gather_slots(k_cache, slots)
        v = gather_slots(v_cache, slots)
        vis = torch.cat([torch.ones(b - a, ctx, dtype=torch.bool, device=q.device), new_visible[s]], dim=1)
        out[a:b] = _attend(q[a:b], k, v, vis, scale)
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query row per sequence over its first ``seq_lens`` logical positions (the new row's K/V included).

    q [S, Hq, D]; block_tables [S, max_blocks]; no host reads, fixed shapes: CUDA-graph capturable.
    """
    S, Hq, D = q.shape
    bs = k_cache.shape[1]
    Hkv = k_cache.shape[2]
    L = block_tables.shape[1] * bs
    pos = torch.arange(L, device=q.device)
    slots = block_tables[:, pos // bs] * bs + pos % bs  # [S, L]
    k = gather_slots(k_cache, slots.reshape(-1)).view(S, L, Hkv, D).float()
    v = gather_slots(v_cache, slots.reshape(-1)).view(S, L, Hkv, D).float()
    qg = q.float().view(S, Hkv, Hq // Hkv, D)
    scores = torch.einsum("shgd,slhd->shgl", qg, k) * scale
    scores = scores.masked_fill((pos[None, :] >= seq_lens[:, None])[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("shgl,slhd->shgd", probs, v)
    return out.reshape(S, Hq, D).to(q.dtype)
