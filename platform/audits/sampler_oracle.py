"""The exact target of the walk, enumerated independently of the product's transform code.

Per node: presence penalty over (history + the node's root-to-node path tokens, root excluded), then in
float32 exactly as native decoding scales (logit / T), the kept set by definition - top-k keeps every token
>= the k-th largest value (boundary ties kept), top-p keeps a token when the renormalised mass of tokens
with strictly larger value is < top_p (tie groups whole), min-p keeps values >= max + log(min_p) - and the
probabilities of the kept set in float64. Greedy rows are one-hot at the lowest-id maximum.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def row_distribution(
    logits: torch.Tensor,
    present: torch.Tensor | None,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    presence: float,
) -> torch.Tensor:
    """One row: logits [V] fp32 -> probabilities [V] float64."""
    x = logits.float().cpu().clone()
    if present is not None and presence != 0.0:
        x = x - torch.tensor(presence, dtype=torch.float32) * present.cpu().float()
    V = x.numel()
    if temperature == 0:
        out = torch.zeros(V, dtype=torch.float64)
        out[int(torch.nonzero(x == x.max())[0])] = 1.0
        return out
    x = x / torch.tensor(temperature, dtype=torch.float32)
    keep = torch.ones(V, dtype=torch.bool)
    if 0 < top_k < V:
        kth = torch.sort(x, descending=True).values[top_k - 1]
        keep &= x >= kth
    if top_p < 1.0:
        xs = x.double()
        m = float(xs[keep].max())
        w = torch.where(keep, torch.exp(xs - m), torch.zeros_like(xs))
        w = w / w.sum()
        # mass strictly above each value: total minus the mass of values <= it (ascending cumulative sums)
        xa, order = torch.sort(x)
        cum = torch.cumsum(w[order], 0)
        n_le = torch.searchsorted(xa, x, right=True)
        above = cum[-1] - cum[n_le - 1]
        keep &= above < top_p
    if min_p > 0.0:
        keep &= x >= x.max() + math.log(min_p)
    xs = x.double()
    m = float(xs[keep].max())
    w = torch.where(keep, torch.exp(xs - m), torch.zeros_like(xs))
    return w / w.sum()


def node_distributions(
    tokens: list[int], parents: list[int], logits: torch.Tensor, history: torch.Tensor | None, params: Any
) -> torch.Tensor:
    """[N, V] float64 for every node of one tree (``params`` a SamplingParams)."""
    out = []
    for i in range(len(parents)):
        present = None
        if history is not None:
            present = history.cpu().clone()
            j = i
            while parents[j] >= 0:  # the path's tokens, root excluded
                present[tokens[j]] = True
                j = parents[j]
        out.append(
            row_distribution(
                logits[i],
                present,
                params.temperature,
                params.top_k,  # type: ignore[attr-defined]
                params.top_p,
                params.min_p,
                params.presence_penalty,
            )
        )  # type: ignore[attr-defined]
    return torch.stack(out)
