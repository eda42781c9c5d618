"""The target-only walk: its output distribution equals sequential AR sampling, exactly.

A toy "model" maps a context (token tuple) to logits; the walk runs on random trees whose node logits are
the toy's logits for the node's context. We enumerate the walk's emitted-token distribution from the exact
per-node probabilities it uses, continue with AR after it stops, and compare against AR enumerated with
the naive float64 reference. Then seeded draws: the walk must emit the very tokens AR emits with that seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lumotree.serving.sampler import RowParams, Sampler, SamplingParams, TreeBatch, node_probabilities

sys.path.insert(0, str(Path(__file__).parent))
from _sampler_ref import ref_probs  # noqa: E402

VOCAB = 5
PARAMS = [
    SamplingParams(temperature=0.6, top_p=0.95, top_k=20, presence_penalty=1.0),
    SamplingParams(temperature=1.0, top_k=2, presence_penalty=0.7),
    SamplingParams(temperature=1.2, top_p=0.7, min_p=0.2, presence_penalty=-0.5),
    SamplingParams(temperature=0.9),
    SamplingParams(temperature=0.0, presence_penalty=1.0),
]


def toy_logits(context: tuple[int, ...]) -> torch.Tensor:
    """Deterministic logits per context on a coarse grid (ties happen, top-k boundaries included)."""
    g = torch.Generator().manual_seed(hash(context) % (2**31))
    return torch.round(torch.randn(VOCAB, generator=g) * 3) / 3


def random_tree(g: torch.Generator, n: int) -> tuple[list[int], list[int], list[bool]]:
    tokens = torch.randint(0, VOCAB, (n,), generator=g).tolist()
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    active = [True] + (torch.rand(n - 1, generator=g) < 0.85).tolist()
    return tokens, parents, active


def path_tokens(parents: list[int], tokens: list[int], i: int) -> tuple[int, ...]:
    out = []
    while parents[i] >= 0:
        out.append(tokens[i])
        i = parents[i]
    return tuple(reversed(out))


def ar_enum(prompt: tuple, gen: tuple, p: SamplingParams, length: int) -> dict[tuple, float]:
    """Exact distribution of the next ``length`` tokens under AR with the float64 reference."""
    if length == 0:
        return {(): 1.0}
    present = torch.zeros(VOCAB, dtype=torch.bool)
    present[list(gen)] = True
    probs = ref_probs(toy_logits(prompt + gen), present, p)
    out: dict[tuple, float] = {}
    for x in range(VOCAB):
        if probs[x] > 0:
            for rest, q in ar_enum(prompt, gen + (x,), p, length - 1).items():
                out[(x,) + rest] = out.get((x,) + rest, 0.0) + float(probs[x]) * q
    return out


def walk_enum(tree, node_probs, prompt, gen, p, length) -> dict[tuple, float]:
    """Exact distribution of the next ``length`` tokens: the walk (its own node probabilities), then AR."""
    tokens, parents, active = tree
    out: dict[tuple, float] = {}

    def visit(i: int, emitted: tuple, prob: float) -> None:
        for x in range(VOCAB):
            q = float(node_probs[i][x])
            if q == 0:
                continue
            kids = [j for j in range(len(tokens)) if parents[j] == i and active[j] and tokens[j] == x]
            if kids and len(emitted) + 1 < length:
                visit(kids[0], emitted + (x,), prob * q)
            else:
                seq = emitted + (x,)
                for rest, r in ar_enum(prompt, gen + seq, p, length - len(seq)).items():
                    out[seq + rest] = out.get(seq + rest, 0.0) + prob * q * r

    visit(0, (), 1.0)
    return out


def batch_inputs(trees, prompts, gens):
    """Node logits and per-request history for a packed batch of trees."""
    logits, history = [], torch.zeros(len(trees), VOCAB, dtype=torch.bool)
    for b, ((tokens, parents, _), prompt, gen) in enumerate(zip(trees, prompts, gens, strict=True)):
        history[b, list(gen)] = True
        for i in range(len(tokens)):
            logits.append(toy_logits(prompt + gen + path_tokens(parents, tokens, i)))
    return TreeBatch.build(trees, "cpu"), torch.stack(logits), history


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_walk_distribution_equals_ar_exactly(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    trees = [random_tree(g, n) for n in (1, 4, 7, 9, 6)]
    prompts = [(1, 2), (3,), (0, 4, 4), (2,), (1,)]
    gens = [(3,), (1, 1), (4,), (0, 2), (2,)]
    params = PARAMS
    batch, logits, history = batch_inputs(trees, prompts, gens)
    probs = node_probabilities(batch, logits, history, RowParams.build(params, VOCAB, "cpu")).double()
    off = batch.offsets
    for b, tree in enumerate(trees):
        length = 1 + max(len(path_tokens(tree[1], tree[0], i)) for i in range(len(tree[0])))
        got = walk_enum(tree, probs[off[b] : off[b + 1]], prompts[b], gens[b], params[b], length)
        want = ar_enum(prompts[b], gens[b], params[b], length)
        assert set(got) == set(want), b
        for k in want:
            assert abs(got[k] - want[k]) < 1e-6, (b, k, got[k], want[k])


def test_path_history_matters_in_this_setup() -> None:
    """Sensitivity check: forgetting the path tokens in the presence history changes the distribution."""
    tree = ([2, 3, 3], [-1, 0, 1], [True, True, True])
    p = PARAMS[0]
    batch, logits, history = batch_inputs([tree], [(1,)], [(2,)])
    rp = RowParams.build([p], VOCAB, "cpu")
    good = node_probabilities(batch, logits, history, rp)
    flat = TreeBatch.roots(torch.zeros(3, dtype=torch.long))  # same logits, no paths
    broken = node_probabilities(
        flat, logits, history.expand(3, VOCAB), RowParams.build([p] * 3, VOCAB, "cpu")
    )
    assert not torch.allclose(good[2], broken[2], atol=1e-3)


@pytest.mark.parametrize("pidx", range(len(PARAMS)))
def test_seeded_walk_emits_ar_tokens(pidx: int) -> None:
    """With one seed, the walk emits the tokens sequential AR draws (same noise per output position)."""
    p = PARAMS[pidx]
    sampler = Sampler(VOCAB, "cpu")
    g = torch.Generator().manual_seed(100 + pidx)
    long_accepts = 0
    for trial in range(25):
        prompt, gen = (trial % 5,), (int(torch.randint(0, VOCAB, (1,), generator=g)),)
        seed, out_pos = 1000 + trial, 7 + trial
        # AR reference: one draw per position, history growing by each token.
        ar: list[int] = []
        for t in range(6):
            ctx = gen + tuple(ar)
            present = torch.zeros(1, VOCAB, dtype=torch.bool)
            present[0, list(ctx)] = True
            x = sampler.sample(
                toy_logits(prompt + ctx)[None],
                present,
                [p],
                torch.tensor([seed]),
                torch.tensor([out_pos + t]),
            )
            ar.append(int(x))
        # A tree that holds AR's path with some luck: dense fanout over a small vocabulary.
        tree = random_tree(g, 12)
        tree = ([gen[-1]] + tree[0][1:], tree[1], tree[2])
        batch, logits, history = batch_inputs([tree], [prompt], [gen])
        res = sampler.walk(batch, logits, history, [p], torch.tensor([seed]), torch.tensor([out_pos]))
        acc = [i for i in res.accepted[0].tolist() if i >= 0]
        emitted = [tree[0][i] for i in acc[1:]] + [int(res.bonus[0])]
        assert emitted == ar[: len(emitted)], (trial, emitted, ar)
        assert all(tree[2][i] for i in acc)
        long_accepts += len(acc) > 2
    assert long_accepts > 0


def test_walk_takes_lowest_duplicate_child_and_skips_inactive() -> None:
    sampler = Sampler(4, "cpu")
    logits = torch.full((5, 4), -10.0)
    logits[:, 1] = 5.0  # greedy draws token 1 everywhere
    # root -> {1 (inactive), 1, 1}; node 2 -> {1}
    tree = ([0, 1, 1, 1, 1], [-1, 0, 0, 0, 2], [True, False, True, True, True])
    batch = TreeBatch.build([tree], "cpu")
    res = sampler.walk(
        batch, logits, None, [SamplingParams(temperature=0)], torch.tensor([0]), torch.tensor([0])
    )
    assert res.accepted[0].tolist() == [0, 2, 4] and int(res.bonus[0]) == 1
