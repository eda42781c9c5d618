"""Tree builders: hydra27 filled from MTP top-3 + suffix chains, chains, and the adaptive tree."""

from __future__ import annotations

import random

import pytest
import torch

from lumotree.serving.drafters.suffix import SuffixCache, SuffixConfig, SuffixDrafter, SuffixIndex
from lumotree.serving.tree import TreeTopology, hydra27
from lumotree.serving.tree_builder import (
    PAD_TOKEN,
    AdaptiveConfig,
    build_adaptive,
    build_chain,
    build_fixed,
    look_ahead_fixed,
)

MTP = [[100 + d, 200 + d, 300 + d] for d in range(5)]  # depth d+1: top-1, top-2, top-3


def test_hydra27_fill_from_mtp_and_suffix() -> None:
    root = 7
    spine = [r[0] for r in MTP]
    # the prompt contains root + spine followed by a 6-token tail, and runner-up 1 followed by 4 tokens
    prompt = [1, 2, root, *spine, 41, 42, 43, 44, 45, 46, 9, root, 200, 51, 52, 53, 54, 8, 8]
    suffix = SuffixDrafter(prompt, SuffixConfig(min_match=2, max_match=16, long_gram=4))
    d = build_fixed(hydra27(), root, torch.tensor(MTP), suffix, prefix_len=30)
    topo = d.topology
    tok = dict(zip(topo.routes, d.token_ids.tolist(), strict=True))
    assert tok[()] == root
    for depth in range(1, 6):
        z = (0,) * (depth - 1)
        assert (tok[z + (0,)], tok[z + (1,)], tok[z + (2,)]) == tuple(MTP[depth - 1])
    assert [tok[(0,) * dd] for dd in range(6, 12)] == [41, 42, 43, 44, 45, 46]
    assert [tok[(1,) + (0,) * i] for i in range(1, 5)] == [51, 52, 53, 54]
    # nothing follows runner-up 2 in the text: its rescue chain is inactive this step
    act = dict(zip(topo.routes, d.active_mask, strict=True))
    assert not act[(2, 0)] and not act[(2, 0, 0)]
    assert tok[(2, 0)] == PAD_TOKEN
    assert sum(d.active_mask) == 28 - 2
    assert d.positions[0] == 30 and max(d.positions) == 41


@pytest.mark.parametrize("seed", range(12))
def test_look_ahead_never_changes_a_tree(seed: int) -> None:
    """Trees built after ``look_ahead_fixed`` equal trees built from scratch, whether the guessed spine is
    right or not, and a look-ahead made before the text or the cache changed is never reused."""
    rng = random.Random(seed)
    cyc = [rng.randrange(1, 9) for _ in range(rng.randint(1, 4))]
    cfg = SuffixConfig(min_match=2, max_match=12, long_gram=4)
    cache = SuffixCache(cfg)
    cache.add(cyc * 20)

    def drafter() -> SuffixDrafter:
        return SuffixDrafter([rng.randrange(1, 9) for _ in range(5)] + cyc * 30, cache=cache)

    fast, slow = drafter(), drafter()
    slow.index = SuffixIndex(cfg, list(fast.tokens))
    for step in range(30):
        root = fast.tokens[-len(cyc)]
        look_ahead_fixed(hydra27(), root, 5, 3, fast)
        hit = rng.random() < 0.6  # otherwise a spine the guess did not foresee
        guess = fast.propose([root], 5) if hit else None
        spine = list(guess.tokens) if guess else [rng.randrange(1, 9) for _ in range(5)]
        mtp = [
            [spine[d] if d < len(spine) else 1, rng.randrange(1, 9), rng.randrange(1, 9)] for d in range(5)
        ]
        if step % 7 == 3:
            cache.add(
                [rng.randrange(1, 9) for _ in range(40)]
            )  # the cache changes between look-ahead and build
        got = build_fixed(hydra27(), root, mtp, fast, prefix_len=len(fast.tokens))
        want = build_fixed(hydra27(), root, mtp, slow, prefix_len=len(slow.tokens))
        assert got.token_ids.tolist() == want.token_ids.tolist() and got.active_mask == want.active_mask
        acc = [root, *spine[: rng.randint(0, 3)]]
        fast.extend(acc)
        slow.extend(acc)


def test_look_ahead_covers_the_spine_tail_and_frequent_runner_ups() -> None:
    """After ``look_ahead_fixed`` the tree needs a fresh lookup only for a runner-up that never followed the
    root: the spine tail (the guess) and the rescue chain of a frequent successor are done already."""
    root, cfg = 7, SuffixConfig(min_match=2, max_match=16, long_gram=4)
    seg = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 19]
    prompt = [9, root, 30, 31, 32, 33, 34, 8, 9, root, *seg, 8, 9, root, *seg, 8, 9]
    fast, slow = SuffixDrafter(prompt, cfg), SuffixDrafter(prompt, cfg)
    assert fast.successors([root], 3) == [20, 30]
    look_ahead_fixed(hydra27(), root, 5, 3, fast)
    mtp = [[20, 30, 40], *([21 + d, 60 + d, 70 + d] for d in range(4))]
    fresh: list[tuple[tuple[int, ...], int]] = []
    propose = fast._propose
    fast._propose = lambda extra, n: fresh.append((extra, n)) or propose(extra, n)  # type: ignore[method-assign]
    got = build_fixed(hydra27(), root, mtp, fast, prefix_len=len(prompt))
    assert fresh == [((root, 40), 2)]
    want = build_fixed(hydra27(), root, mtp, slow, prefix_len=len(prompt))
    assert got.token_ids.tolist() == want.token_ids.tolist() and got.active_mask == want.active_mask
    tok = dict(zip(got.topology.routes, got.token_ids.tolist(), strict=True))
    assert [tok[(0,) * d] for d in range(6, 12)] == [25, 26, 27, 28, 29, 19]
    assert [tok[(1,) + (0,) * i] for i in range(1, 5)] == [31, 32, 33, 34]


def test_hydra27_without_suffix_keeps_only_mtp_rows() -> None:
    d = build_fixed(hydra27(), 5, MTP, None, prefix_len=0)
    assert sum(d.active_mask) == 1 + 15


def test_chain_builder() -> None:
    d = build_chain(3, torch.tensor([4, 5, 6]), prefix_len=10)
    assert d.parents == (-1, 0, 1, 2) and d.token_ids.tolist() == [3, 4, 5, 6]
    assert d.positions == [10, 11, 12, 13]


def _siblings_distinct(topo: TreeTopology, ids: list[int]) -> bool:
    return all(len({ids[c] for c in kids}) == len(kids) for kids in topo.children)


def test_adaptive_spends_the_budget_by_confidence() -> None:
    probs = [[0.9, 0.05, 0.03]] * 5
    root = 7
    prompt = [root, 100, 101, 102, 103, 104, 61, 62, 63, 64, 65, 66, 67, 68] * 2
    suffix = SuffixDrafter(prompt, SuffixConfig(min_match=2, max_match=16, long_gram=4))
    cfg = AdaptiveConfig(budget=16)
    d = build_adaptive(root, MTP, probs, suffix, prefix_len=3, config=cfg)
    topo, ids = d.topology, d.token_ids.tolist()
    assert topo.num_rows == 16 and ids[0] == root
    assert _siblings_distinct(topo, ids)
    # the spine follows the MTP top-1 and then the suffix continuation (merged, not duplicated)
    spine_ids = [ids[r] for r in topo.spine]
    assert spine_ids[:6] == [root, 100, 101, 102, 103, 104]
    assert spine_ids[6:9] == [61, 62, 63]
    # with a tiny budget only the most confident candidates stay
    small = build_adaptive(root, MTP, probs, None, 0, AdaptiveConfig(budget=4))
    assert [small.token_ids.tolist()[r] for r in small.topology.spine] == [root, 100, 101, 102]


def test_adaptive_merges_suffix_into_mtp_nodes() -> None:
    probs = [[0.5, 0.3, 0.2]] * 2
    mtp = [[10, 11, 12], [20, 21, 22]]
    suffix = SuffixDrafter([1, 7, 11, 30, 31, 9, 7, 11, 30, 31], SuffixConfig(min_match=2, long_gram=2))
    d = build_adaptive(7, mtp, probs, suffix, 0, AdaptiveConfig(budget=32))
    ids = d.token_ids.tolist()
    assert _siblings_distinct(d.topology, ids)
    (r11,) = [r for r in range(d.num_rows) if ids[r] == 11 and d.depth[r] == 1]
    assert [ids[c] for c in d.topology.children[r11]] == [30]  # the suffix chain continues the MTP node
