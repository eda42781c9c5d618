"""Naive float64 references for the sampling transforms, one row at a time, written from the spec only."""

from __future__ import annotations

import math

import torch

from lumotree.serving.sampling.params import SamplingParams


def ref_probs(logits: torch.Tensor, present: torch.Tensor | None, p: SamplingParams) -> torch.Tensor:
    """[V] float64 distribution: presence penalty, greedy or temperature, top-k (ties), top-p, min-p."""
    x = [float(v) for v in logits.double()]
    vocab = len(x)
    if present is not None:
        x = [v - p.presence_penalty * float(bool(present[i])) for i, v in enumerate(x)]
    if p.temperature == 0:
        best = max(x)
        out = torch.zeros(vocab, dtype=torch.float64)
        out[min(i for i, v in enumerate(x) if v == best)] = 1.0
        return out
    x = [v / p.temperature for v in x]
    keep = [True] * vocab
    if p.top_k > 0:
        kth = sorted(x, reverse=True)[min(p.top_k, vocab) - 1]
        keep = [k and v >= kth for k, v in zip(keep, x, strict=True)]

    def softmax() -> list[float]:
        m = max(v for v, k in zip(x, keep, strict=True) if k)
        e = [math.exp(v - m) if k else 0.0 for v, k in zip(x, keep, strict=True)]
        z = sum(e)
        return [v / z for v in e]

    if p.top_p < 1:
        pr = softmax()
        keep = [k and sum(q for q in pr if q > pr[i]) < p.top_p for i, k in enumerate(keep)]
    if p.min_p > 0:
        pr = softmax()
        top = max(pr)
        keep = [k and pr[i] >= p.min_p * top for i, k in enumerate(keep)]
    return torch.tensor(softmax(), dtype=torch.float64)
