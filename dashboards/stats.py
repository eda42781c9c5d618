"""Statistics of solve rates, independent of any database: Wilson intervals and Fisher's exact test.

Pure Python (no scipy import on the dashboard's request path); tests compare both with scipy/statsmodels-style
closed forms and with brute-force enumeration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Interval:
    """A proportion with its confidence interval, all in [0, 1]."""

    estimate: float
    low: float
    high: float

    def __post_init__(self) -> None:
        assert 0.0 <= self.low <= self.estimate <= self.high <= 1.0, self


def wilson_interval(successes: int, n: int, z: float = Z_95) -> Interval:
    """Wilson score interval for successes out of n (n = 0 gives the uninformative [0, 1] around 0)."""
    assert 0 <= successes <= n, (successes, n)
    if n == 0:
        return Interval(0.0, 0.0, 1.0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # Clamp rounding at the ends (successes = 0 or n gives low = 0 or high = 1 exactly in exact arithmetic).
    low = 0.0 if successes == 0 else max(0.0, min(p, center - half))
    high = 1.0 if successes == n else min(1.0, max(p, center + half))
    return Interval(p, low, high)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table [[a, b], [c, d]] (rows: arms; columns:
    resolved, unresolved), summing every table with the same margins no more likely than the observed one
    (scipy's rule, with its relative tolerance for ties)."""
    assert min(a, b, c, d) >= 0
    row1, col1, n = a + b, a + c, a + b + c + d
    if n == 0:
        return 1.0
    lo, hi = max(0, col1 - (n - row1)), min(row1, col1)

    def logp(x: int) -> float:
        return _log_comb(row1, x) + _log_comb(n - row1, col1 - x) - _log_comb(n, col1)

    observed = logp(a)
    total = 0.0
    for x in range(lo, hi + 1):
        lp = logp(x)
        if lp <= observed + 1e-7:  # scipy: pmf <= p_observed * (1 + 1e-7)
            total += math.exp(lp)
    return min(1.0, total)
