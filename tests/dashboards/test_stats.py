"""Wilson intervals and Fisher's exact test against scipy and a direct enumeration."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from lumotree.dashboards.stats import fisher_exact, wilson_interval


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 10), (3, 10), (5, 10), (10, 10), (7, 20), (123, 456)])
def test_wilson_matches_scipy(k: int, n: int) -> None:
    ci = wilson_interval(k, n)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert ci.estimate == pytest.approx(k / n)
    assert ci.low == pytest.approx(ref.low, abs=1e-12) and ci.high == pytest.approx(ref.high, abs=1e-12)


def test_wilson_textbook_value_and_empty() -> None:
    # 10 of 20 at 95%: p = 0.5 +- 1.96 * sqrt(.25/20 + 1.96^2/1600) / (1 + 1.96^2/20)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 20 + z * z / 1600) / (1 + z * z / 20)
    ci = wilson_interval(10, 20)
    assert ci.low == pytest.approx(0.5 - half) and ci.high == pytest.approx(0.5 + half)
    assert wilson_interval(0, 0).low == 0.0 and wilson_interval(0, 0).high == 1.0
    with pytest.raises(AssertionError):
        wilson_interval(3, 2)


@pytest.mark.parametrize(
    "table",
    [
        (5, 5, 6, 4),
        (6, 4, 7, 3),
        (11, 9, 14, 6),
        (0, 10, 10, 0),
        (3, 1, 1, 3),
        (0, 0, 0, 0),
        (1, 0, 0, 0),
        (8, 2, 1, 5),
    ],
)
def test_fisher_matches_scipy(table: tuple[int, int, int, int]) -> None:
    a, b, c, d = table
    expected = 1.0 if a + b + c + d == 0 else stats.fisher_exact([[a, b], [c, d]]).pvalue
    assert fisher_exact(a, b, c, d) == pytest.approx(expected, rel=1e-9)
