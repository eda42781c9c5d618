"""Sampling equivalence: under temperature 0.6, top-p 0.95, top-k 20, presence penalty 1.0, the joint
distribution of the first three generated tokens of every speculative arm equals AR's (chi-square test of
homogeneity, rare cells pooled, 20,480 samples per arm, p > 0.001), and the same test rejects a walk that
applies the temperature twice. Each arm draws with its own seeds: with equal seeds the arms would emit the
very same tokens as AR (the walk reuses AR's noise per output position), which proves nothing about
distributions."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.loader import load_model
from lumotree.serving.sampler import Sampler, SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from _arms_fixtures import write_arms_checkpoint  # noqa: E402

VOCAB = 64
PROMPT = [1, 2, 3, 1, 2, 3]
ROUNDS, BATCH = 10, 2048  # 20,480 samples per arm, 2,048 sequences per engine step
ALPHA = 1e-3


def params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.6, top_p=0.95, top_k=20, presence_penalty=1.0, max_tokens=3,
                          seed=seed, ignore_eos=True)  # fmt: skip


class TwiceTemperature(Sampler):
    """A broken sampler: inside speculative trees the logits are divided by the temperature once more."""

    def walk(self, trees, logits, history, params, seeds, out_pos):  # type: ignore[no-untyped-def]
        if trees.max_depth > 0:
            logits = logits / params[0].temperature
        return super().walk(trees, logits, history, params, seeds, out_pos)


def chi_square_homogeneity(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of a 2 x K table; cells with an expected count under
    ``min_expected`` in either sample are pooled into one cell."""
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b))
    frac_a = na / (na + nb)
    big, pooled = [], [0, 0]
    for k in keys:
        tot = a[k] + b[k]
        if min(tot * frac_a, tot * (1 - frac_a)) >= min_expected:
            big.append((a[k], b[k]))
        else:
            pooled[0] += a[k]
            pooled[1] += b[k]
    if sum(pooled):
        big.append((pooled[0], pooled[1]))
    stat = 0.0
    for ca, cb in big:
        tot = ca + cb
        ea, eb = tot * frac_a, tot * (1 - frac_a)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    df = len(big) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2.0)))
    return stat, df, p


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # two shared cores: intra-op threads only contend on tiny shapes
    ckpt = write_arms_checkpoint(
        tmp_path_factory.mktemp("arms_sampling") / "m", vocab=VOCAB, layout="gdn1_attn1"
    )
    yield load_model(ckpt, "cpu", torch.float32)[0], ckpt
    torch.set_num_threads(n)


def sample_joint(model, ckpt: Path, arm: str, opts: dict, seed_base: int, broken: bool = False) -> Counter:
    if arm == "eagle":
        opts = {**opts, "eagle_path": str(ckpt / "eagle")}
    eng = Engine(model, None, EngineConfig(arm=arm, arm_options=opts, max_seqs=BATCH, max_model_len=48,
                                           max_prefill_tokens=BATCH * len(PROMPT)))  # fmt: skip
    if broken:
        eng.sampler = eng.verifier.sampler = TwiceTemperature(VOCAB, eng.device)
    out: Counter = Counter()
    for r in range(ROUNDS):
        seeds = range(seed_base + r * BATCH, seed_base + (r + 1) * BATCH)
        for req in eng.generate([PROMPT] * BATCH, [params(s) for s in seeds]):
            assert len(req.output_ids) == 3
            out[tuple(req.output_ids)] += 1
    eng.check_no_leaks()
    if arm != "ar":
        assert eng.counters.accepted_tokens > 0, f"{arm}: no draft was accepted; the walk went untested"
    return out


@pytest.fixture(scope="module")
def ar_joint(model) -> Counter:
    return sample_joint(*model, "ar", {}, seed_base=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arm,opts,seed_base",
    [("mtp", {"mtp_k": 5}, 10**6), ("eagle", {}, 2 * 10**6), ("lumotree", {"tree": "hydra27"}, 3 * 10**6)],
    ids=["mtp5", "eagle", "lumotree"],
)
def test_joint_first_three_tokens_match_ar(model, ar_joint: Counter, arm: str, opts: dict, seed_base: int):
    got = sample_joint(*model, arm, opts, seed_base)
    stat, df, p = chi_square_homogeneity(ar_joint, got)
    assert df >= 20, "too few cells: the test would have no power"
    assert p > ALPHA, f"{arm}: joint distribution differs from AR (chi2 {stat:.1f}, df {df}, p {p:.2e})"


@pytest.mark.slow
def test_broken_sampler_is_rejected(model, ar_joint: Counter) -> None:
    got = sample_joint(*model, "mtp", {"mtp_k": 5}, 4 * 10**6, broken=True)
    stat, df, p = chi_square_homogeneity(ar_joint, got)
    assert p < ALPHA, f"temperature applied twice went undetected (chi2 {stat:.1f}, df {df}, p {p:.2e})"


def test_chi_square_reference() -> None:
    """The statistic and p-value against a hand computation and scipy-free identities."""
    a, b = Counter({0: 30, 1: 70}), Counter({0: 50, 1: 50})
    stat, df, p = chi_square_homogeneity(a, b)
    # 2x2: expected 40/60 per row; stat = sum (O - E)^2 / E = 2 * (100/40 + 100/60)
    assert df == 1 and stat == pytest.approx(2 * (100 / 40 + 100 / 60))
    assert p == pytest.approx(float(torch.erfc(torch.tensor(stat / 2, dtype=torch.float64).sqrt())))
    same = Counter({k: 100 for k in range(30)})
    assert chi_square_homogeneity(same, same)[2] == pytest.approx(1.0)
