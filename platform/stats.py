"""Sweep statistics: solve rates with Wilson intervals, Fisher's exact test between arms, pooled rates.

Wilson and Fisher live in ``lumotree.dashboards.stats`` (the dashboard draws the same numbers); this module
adds the sweep-level forms. Pooled rates follow the paper: total generated tokens over total decode seconds,
summed over requests (never a mean of per-request rates, which would overweight short replies).
"""

from __future__ import annotations

from collections.abc import Iterable

from lumotree.dashboards.stats import Interval, fisher_exact, wilson_interval

__all__ = ["Interval", "wilson_interval", "fisher_resolved", "pooled_rate", "acceptance_length"]


def fisher_resolved(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher p-value that two arms with k1/n1 and k2/n2 resolved attempts share one solve rate."""
    assert 0 <= k1 <= n1 and 0 <= k2 <= n2, (k1, n1, k2, n2)
    return fisher_exact(k1, n1 - k1, k2, n2 - k2)


def pooled_rate(pairs: Iterable[tuple[float, float]]) -> float:
    """sum(tokens) / sum(seconds) over (tokens, seconds) pairs; 0 when no time was measured."""
    tokens = seconds = 0.0
    for t, s in pairs:
        assert t >= 0 and s >= 0, (t, s)
        tokens += t
        seconds += s
    return tokens / seconds if seconds > 0 else 0.0


def acceptance_length(drafts: int, accepted: int) -> float | None:
    """vLLM's mean acceptance length 1 + accepted / drafts (None without drafts, e.g. the AR arm)."""
    return 1.0 + accepted / drafts if drafts else None
