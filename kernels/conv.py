"""Causal depthwise conv (kernel W, SiLU) evaluated over gathered windows.

Every mode (prefill, decode, tree) runs the same arithmetic: row r's output is
silu(sum_w src[win_idx[r, w]] * weight[:, w]), taps in order w = 0..W-1, accumulated in fp32, cast to the
input
dtype. Only the window indices differ: a chain (prefill/decode) reads the W-1 previous rows, a tree node
reads its
W-1 nearest ancestors, and both reach into the pre-forward conv history when the path is short.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_windows(src: torch.Tensor, win_idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """src [M, C] (history rows and new rows), win_idx [R, W] into src (oldest tap first), weight [C, W].

    Returns [R, C] in src's dtype.
    """
    assert win_idx.shape[1] == weight.shape[1] and src.shape[1] == weight.shape[0]
    w = weight.float()
    acc = src[win_idx[:, 0]].float() * w[:, 0]
    for t in range(1, weight.shape[1]):
        acc = acc + src[win_idx[:, t]].float() * w[:, t]
    return F.silu(acc).to(src.dtype)


def chain_window_index(
    seq_lens: list[int], hist: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window indices for S chains laid out as ``[S * hist history rows ; sum(seq_lens) new rows]``.

    Returns (win_idx [R, hist + 1], last_row [S]): row j of sequence s reads the hist rows before it, reaching
    into sequence s's history rows when j < hist. ``last_row`` indexes each sequence's last new row (a
    sequence
    with no new rows has -1; its history is unchanged).
    """
    S = len(seq_lens)
    idx: list[list[int]] = []
    last: list[int] = []
    base = S * hist
    for s, n in enumerate(seq_lens):
        seq_src = [s * hist + i for i in range(hist)] + [base + j for j in range(n)]
        for j in range(n):
            idx.append(seq_src[j : j + hist + 1])
        last.append(len(idx) - 1 if n > 0 else -1)
        base += n
    win = torch.tensor(idx, dtype=torch.long, device=device).view(-1, hist + 1)
    return win, torch.tensor(last, dtype=torch.long, device=device)


def decode_window_index(S: int, hist: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Window indices of one new row per sequence, built on the device without host data
    (graph-capturable)."""
    s = torch.arange(S, device=device)
    taps = s[:, None] * hist + torch.arange(hist, device=device)[None, :]
    return torch.cat([taps, (S * hist + s)[:, None]], dim=1)


def tree_window_index(
    parents: list[int], hist: int, seq: int, num_seqs: int, row_base: int
) -> list[list[int]]:
    """Window indices of one sequence's tree rows: each node reads its ``hist`` nearest ancestors (oldest
    first),
    continuing into the sequence's history rows (``seq * hist + i``) once the path runs out.

    Rows are addressed like ``chain_window_index``: new row r of this sequence is ``num_seqs * hist +
    row_base + r``.
    """
    base = num_seqs * hist + row_base
    out = []
    for i in range(len(parents)):
        chain = [base + i]
        p = parents[i]
        while len(chain) < hist + 1 and p >= 0:
            chain.append(base + p)
            p = parents[p]
        h = hist - 1
        while len(chain) < hist + 1:
            chain.append(seq * hist + h)
            h -= 1
        out.append(chain[::-1])
    return out
