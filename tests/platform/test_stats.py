"""Sweep statistics against independent references: scipy's Fisher test and the Wilson score equation."""

from __future__ import annotations

import math

import pytest
from scipy.stats import fisher_exact as scipy_fisher

from lumotree.platform.stats import fisher_resolved, pooled_rate, wilson_interval


@pytest.mark.parametrize("k1,n1,k2,n2", [(5, 20, 7, 20), (0, 10, 6, 10), (11, 20, 12, 20), (3, 7, 1, 9)])
def test_fisher_matches_scipy(k1: int, n1: int, k2: int, n2: int) -> None:
    ref = scipy_fisher([[k1, n1 - k1], [k2, n2 - k2]]).pvalue
    assert fisher_resolved(k1, n1, k2, n2) == pytest.approx(ref, rel=1e-9)


def test_fisher_paper_study_is_not_significant() -> None:
    # The paper's agent study: LumoTree 11/20 resolved vs plain decoding 14/20 -> far from significant.
    assert fisher_resolved(11, 20, 14, 20) > 0.3


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (57, 200)])
def test_wilson_bounds_solve_the_score_equation(k: int, n: int) -> None:
    z = 1.959963984540054
    p = wilson_interval(k, n)
    assert p.low <= k / n <= p.high
    # Each interior bound b satisfies |k/n - b| = z * sqrt(b (1 - b) / n).
    for b in (p.low, p.high):
        if 0 < b < 1:
            assert abs(k / n - b) == pytest.approx(z * math.sqrt(b * (1 - b) / n), rel=1e-9)


def test_pooled_rate_is_not_a_mean_of_rates() -> None:
    assert pooled_rate([(100, 1.0), (10, 1.0)]) == pytest.approx(55.0)
    assert pooled_rate([(100, 10.0), (1, 0.01)]) == pytest.approx(101 / 10.01)
    assert pooled_rate([]) == 0.0
