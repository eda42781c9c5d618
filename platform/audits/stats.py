"""Goodness-of-fit: the G-test with rare cells pooled, as the paper's sampler audit used it."""

from __future__ import annotations

import math

import torch


def g_test(
    observed: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0
) -> tuple[float, int, float]:
    """G statistic, degrees of freedom and p-value of counts ``observed`` [C] against ``probs`` [C].

    Cells with expected count below ``min_expected`` are pooled into one cell. A count where the expected
    count is exactly zero (an impossible outcome) gives p = 0 outright.
    """
    obs = observed.double().cpu()
    p = probs.double().cpu()
    n = float(obs.sum())
    if n == 0:
        return 0.0, 0, 1.0
    exp = n * p / p.sum()
    if bool(((exp == 0) & (obs > 0)).any()):
        return math.inf, 0, 0.0
    big = exp >= min_expected
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = e > 0
    o, e = o[keep], e[keep]
    df = int(o.numel()) - 1
    if df <= 0:
        return 0.0, 0, 1.0
    nz = o > 0
    g = 2.0 * float((o[nz] * torch.log(o[nz] / e[nz])).sum())
    from scipy.stats import chi2

    return g, df, float(chi2.sf(g, df))
