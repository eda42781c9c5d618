"""The native transforms against a naive float64 reference; greedy tie rule; seeded draws; distributions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from lumotree.serving.sampler import RowParams, Sampler, SamplingParams, probabilities
from lumotree.serving.sampling.rng import uniform

sys.path.insert(0, str(Path(__file__).parent))
from _sampler_ref import ref_probs  # noqa: E402

CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.8),
    SamplingParams(temperature=0.6, top_p=0.95, top_k=20, presence_penalty=1.0),
    SamplingParams(temperature=0.9, top_p=0.55),
    SamplingParams(temperature=1.0, min_p=0.12),
    SamplingParams(temperature=0.8, top_k=4, top_p=0.9, min_p=0.3, presence_penalty=-0.75),
    SamplingParams(temperature=0.0, presence_penalty=1.5),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=2.0, top_k=1),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
]


def tied_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Logits on a coarse grid so that ties occur everywhere, top-k boundaries included."""
    g = torch.Generator().manual_seed(seed)
    return torch.round(torch.randn(rows, vocab, generator=g) * 4) / 4


def test_transforms_match_float64_reference_batched() -> None:
    vocab = 24
    logits = tied_logits(len(CASES) * 3, vocab, 0)
    params = [p for p in CASES for _ in range(3)]
    g = torch.Generator().manual_seed(1)
    present = torch.rand(len(params), vocab, generator=g) < 0.3
    got = probabilities(logits, present, RowParams.build(params, vocab, "cpu")).double()
    for r, p in enumerate(params):
        want = ref_probs(logits[r], present[r], p)
        assert torch.equal(got[r] > 0, want > 0), (r, p, got[r], want)
        torch.testing.assert_close(got[r], want, atol=1e-6, rtol=1e-5)


def test_top_k_keeps_boundary_ties() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    rp = RowParams.build([SamplingParams(top_k=2)], 6, "cpu")
    kept = probabilities(logits, None, rp)[0] > 0
    # The 2nd largest value (2.0) is shared by three tokens: all of them stay.
    assert kept.tolist() == [True, False, True, True, True, False]


def test_top_p_keeps_or_drops_tie_groups_whole() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2]]))
    for top_p, n in [(0.3, 1), (0.41, 4), (0.5, 4), (1.0, 4)]:
        rp = RowParams.build([SamplingParams(top_p=top_p)], 4, "cpu")
        assert int((probabilities(logits, None, rp)[0] > 0).sum()) == n, top_p


def test_min_p_threshold_relative_to_max() -> None:
    probs = torch.tensor([[0.5, 0.26, 0.24, 0.0001]])
    rp = RowParams.build([SamplingParams(min_p=0.5)], 4, "cpu")
    kept = probabilities(torch.log(probs), None, rp)[0] > 0
    assert kept.tolist() == [True, True, False, False]


def test_greedy_ties_go_to_lowest_id_and_see_the_penalty() -> None:
    s = Sampler(5, "cpu")
    logits = torch.tensor([[1.0, 3.0, 0.0, 3.0, 3.0], [1.0, 3.0, 0.0, 3.0, 2.5]])
    present = torch.tensor([[False] * 5, [False, True, False, True, False]])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, presence_penalty=0.6)]
    seeds, pos = torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    assert s.sample(logits, present, params, seeds, pos).tolist() == [1, 4]


def test_same_seed_same_tokens_and_streams_are_distinct() -> None:
    s = Sampler(50, "cpu")
    logits = torch.zeros(4, 50)
    params = [SamplingParams(temperature=1.0)] * 4
    seeds = torch.tensor([7, 7, 8, 7])
    pos = torch.tensor([3, 3, 3, 4])
    a = s.sample(logits, None, params, seeds, pos)
    b = s.sample(logits, None, params, seeds, pos)
    assert torch.equal(a, b) and a[0] == a[1]
    u = uniform(torch.arange(200), torch.zeros(200, dtype=torch.long), 1000)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert len({tuple(r[:8].tolist()) for r in u}) == 200


def g_test_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """G-test of observed counts against a distribution; cells with expected count < 5 are pooled."""
    n = float(counts.sum())
    exp = probs.double() * n
    big = exp >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    exp = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = exp > 0
    if torch.any(obs[~keep] > 0):
        return 0.0  # a token outside the support was drawn
    obs, exp = obs[keep], exp[keep]
    nz = obs > 0
    g = 2.0 * float((obs[nz] * torch.log(obs[nz] / exp[nz])).sum())
    return float(stats.chi2.sf(g, max(1, len(obs) - 1)))


@pytest.mark.parametrize("case", [1, 3, 5, 6])
def test_draws_follow_the_reference_distribution(case: int) -> None:
    vocab, n = 24, 20000
    p = CASES[case]
    logits = tied_logits(1, vocab, 3 + case)
    present = torch.rand(1, vocab, generator=torch.Generator().manual_seed(case)) < 0.3
    s = Sampler(vocab, "cpu")
    toks = s.sample(
        logits.expand(n, vocab),
        present.expand(n, vocab),
        [p] * n,
        torch.full((n,), 12345),
        torch.arange(n),
    )
    counts = torch.bincount(toks, minlength=vocab)
    want = ref_probs(logits[0], present[0], p)
    assert g_test_pvalue(counts, want) > 1e-3
    # The same statistic rejects a deliberately broken sampler (temperature applied twice).
    broken = ref_probs(logits[0] / p.temperature, present[0] / p.temperature, p)
    if not torch.allclose(broken, want, atol=1e-3):
        assert g_test_pvalue(counts, broken) < 1e-3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("top_k", 2.5),
        ("min_p", 1.1),
        ("presence_penalty", 3.0),
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("seed", "x"),
        ("stop", [""]),
    ],
)
def test_bad_params_raise_clear_errors(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_stop_string_is_wrapped() -> None:
    assert SamplingParams(stop="###").stop == ["###"]
