"""Per-forward index tables shared by every layer (built once from the ``ForwardBatch``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ...kernels.conv import chain_window_index, decode_window_index, tree_window_index
from ..batch import ForwardBatch
from ..config import ModelConfig
from .layers import rope_cos_sin


@dataclass
class ForwardContext:
    """Everything layers need besides their weights and the caches."""

    batch: ForwardBatch
    cos: torch.Tensor
    """[R, rotary_dim] RoPE cosines."""
    sin: torch.Tensor
    conv_win: torch.Tensor
    """[R, kernel] window rows into ``[S * hist history rows ; R new rows]``."""
    conv_last: torch.Tensor | None
    """[S] index of each sequence's last new row (chains only: the new conv history is its window's tail)."""
    seq_bounds: list[tuple[int, int, int]] | None
    """(row start, row end, context_len) per sequence (prefill and tree)."""
    new_visible: list[torch.Tensor] | None
    """Per sequence [n, n] bool: which new rows each new row attends to (prefill and tree)."""
    decode_seq_lens: torch.Tensor | None
    """[S] context_lens + 1 (decode)."""
    tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """Tree mode: (row_seq [R] int32, row_j [R] int32, ancestors-or-self [R, T] int8) for the tree
    attention kernel (see ``kernels.attention_decode``)."""


def _ancestor_mask(parents: list[int] | tuple[int, ...]) -> torch.Tensor:
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        m[i, i] = True
        if p >= 0:
            m[i] |= m[p]
    return m


@lru_cache(maxsize=256)
def _tree_tables(
    parents: tuple[tuple[int, ...], ...], hist: int, device: str
) -> tuple[torch.Tensor, list[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Everything a tree forward derives from its topology alone, built once per topology: conv windows,
    per-sequence visibility, and the tree-attention row tables. Cached, so a repeated tree shape (hydra27,
    chains) costs no host work or copies, and a CUDA graph can hold on to the same tensors."""
    dev = torch.device(device)
    rows: list[list[int]] = []
    start = 0
    width = max(len(p) for p in parents)
    anc = torch.zeros(sum(len(p) for p in parents), width, dtype=torch.int8)
    row_seq: list[int] = []
    row_j: list[int] = []
    vis: list[torch.Tensor] = []
    for s, par in enumerate(parents):
        rows.extend(tree_window_index(list(par), hist, s, len(parents), start))
        m = _ancestor_mask(par)
        anc[start : start + len(par), : len(par)] = m.to(torch.int8)
        vis.append(m.to(dev))
        row_seq.extend([s] * len(par))
        row_j.extend(range(len(par)))
        start += len(par)
    win = torch.tensor(rows, dtype=torch.long).view(-1, hist + 1).to(dev)
    i32 = torch.int32
    tree = (torch.tensor(row_seq, dtype=i32).to(dev), torch.tensor(row_j, dtype=i32).to(dev), anc.to(dev))
    return win, vis, tree


def build_context(
    batch: ForwardBatch, config: ModelConfig, inv_freq: torch.Tensor, dtype: torch.dtype
) -> ForwardContext:
    device = batch.input_ids.device
    hist = config.linear_conv_kernel_dim - 1
    cos, sin = rope_cos_sin(batch.positions, inv_freq, dtype)
    if batch.mode == "decode":
        S = batch.num_seqs
        return ForwardContext(
            batch, cos, sin, decode_window_index(S, hist, device), torch.arange(S, device=device), None, None,
            batch.context_lens + 1,
        )  # fmt: skip
    assert batch.seq_lens_host is not None and batch.context_lens_host is not None
    lens, ctxs = batch.seq_lens_host, batch.context_lens_host
    bounds, start = [], 0
    for n, c in zip(lens, ctxs, strict=True):
        bounds.append((start, start + n, c))
        start += n
    if batch.mode == "prefill":
        win, last = chain_window_index(lens, hist, device)
        vis = [torch.ones(n, n, dtype=torch.bool, device=device).tril() for n in lens]
        return ForwardContext(batch, cos, sin, win, last, bounds, vis, None)
    assert batch.parents_host is not None
    key = tuple(tuple(p) for p in batch.parents_host)
    win, vis, tree = _tree_tables(key, hist, str(device))
    return ForwardContext(batch, cos, sin, win, None, bounds, vis, None, tree)
