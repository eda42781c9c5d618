"""Suffix drafter against a brute-force matcher that scans every position of the corpus."""

from __future__ import annotations

import random

import pytest

from lumotree.serving.drafters.suffix import SEPARATOR, SuffixCache, SuffixConfig, SuffixDrafter, SuffixIndex

CFG = SuffixConfig(min_match=2, max_match=12, long_gram=4, max_candidates=10**9, min_prob=0.2)


def brute(corpus: list[int], query: list[int], max_len: int, cfg: SuffixConfig):
    """Longest matched query suffix (min..max_match) over every end with a next token, then the vote walk."""
    best, cand = 0, []
    for e in range(len(corpus) - 1):
        m = 0
        while m < min(cfg.max_match, len(query), e + 1) and corpus[e - m] == query[-1 - m]:
            m += 1
        if m < cfg.min_match or corpus[e + 1] == SEPARATOR:
            continue
        if m > best:
            best, cand = m, [e]
        elif m == best:
            cand.append(e)
    toks, probs = [], []
    for j in range(max_len):
        live = [e for e in cand if e + 1 + j < len(corpus) and corpus[e + 1 + j] != SEPARATOR]
        if not live:
            break
        count = {}
        for e in live:
            count[corpus[e + 1 + j]] = count.get(corpus[e + 1 + j], 0) + 1
        top = max(count.values())
        tok = corpus[max(e for e in live if count[corpus[e + 1 + j]] == top) + 1 + j]
        if top / len(live) < cfg.min_prob:
            break
        toks.append(tok)
        probs.append(top / len(live))
        cand = [e for e in live if corpus[e + 1 + j] == tok]
    return best, tuple(toks), tuple(probs)


@pytest.mark.parametrize("seed", range(40))
def test_index_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 20])
    motif = [rng.randrange(vocab) for _ in range(rng.randint(3, 10))]
    corpus: list[int] = []
    while len(corpus) < rng.randint(20, 300):
        corpus += motif if rng.random() < 0.5 else [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
    index = SuffixIndex(CFG)
    # incremental: feed in random pieces, query at every piece boundary
    pos = 0
    while pos < len(corpus):
        step = rng.randint(1, 17)
        index.extend(corpus[pos : pos + step])
        pos += step
        text = corpus[:pos]
        extra = [rng.randrange(vocab) for _ in range(rng.randint(0, 3))]
        query = (text + extra)[-CFG.max_match :]
        chain = index.propose(query, 6)
        m, toks, probs = brute(text, query, 6, CFG)
        # the drafter skips a corpus without the query's last min_match tokens: never one with a match
        assert index.has_gram(query) or (m == 0 and chain is None)
        if chain is None:
            assert not toks, (m, toks)
        else:
            assert (chain.match_len, chain.tokens) == (m, toks)
            assert chain.probs == pytest.approx(probs)


def test_repeated_code_is_continued() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    d = SuffixDrafter(prompt, CFG)
    chain = d.propose(max_len=4)
    assert chain is not None and chain.tokens == (4, 5, 6, 7) and chain.match_len == 3
    assert chain.score == pytest.approx(4.0)
    d.extend([4, 5])  # incremental update moves the match along
    assert d.propose(max_len=2).tokens == (6, 7)
    # uncommitted tokens (root + spine) are part of the query
    assert d.propose(extra=[6, 7], max_len=2).tokens == (8, 9)
    assert d.propose(extra=[42, 43], max_len=2) is None


def test_votes_and_probabilities() -> None:
    corpus = [7, 8, 1, 0, 7, 8, 1, 0, 7, 8, 2, 0, 5, 7, 8]
    chain = SuffixIndex(CFG, corpus).propose([7, 8], 2)
    assert chain.tokens == (1, 0) and chain.probs == pytest.approx((2 / 3, 1.0))
    assert chain.score == pytest.approx(2 / 3 + 2 / 3)


def test_cross_request_cache_and_bound() -> None:
    cfg = SuffixConfig(min_match=2, max_match=8, long_gram=4, cache_tokens=40)
    cache = SuffixCache(cfg)
    first = SuffixDrafter([10, 11, 12, 13, 14, 15], cache=cache)
    first.finish()
    second = SuffixDrafter([99, 10, 11], cache=cache)
    chain = second.propose(max_len=3)
    assert chain is not None and chain.source == "cache" and chain.tokens == (12, 13, 14)
    # no match crosses a request boundary, and the cache stays bounded
    for i in range(20):
        cache.add([100 + i] * 7)
    assert len(cache) <= 40
    assert SuffixDrafter([15, 99], cache=cache).propose() is None
    assert cache.index.propose([15, 10], 3) is None


def _serve(cache: SuffixCache, prompt: list[int], output: list[int]) -> list:
    """One request: draft at every position of its output, commit it, hand it to the cache."""
    d = SuffixDrafter(prompt, cache=cache)
    chains = []
    for tok in output:
        chains.append(d.propose(extra=[tok], max_len=4))
        d.extend([tok])
    d.finish()
    return chains


def test_reissued_requests_leave_the_cache_and_lookups_as_they_were() -> None:
    """Serving the same requests again (the passes of a replay) must not make lookups scan more occurrences:
    the per-step work would grow with every pass at the same acceptance."""
    rng = random.Random(0)
    cfg = SuffixConfig(min_match=2, max_match=8, long_gram=4)
    cache = SuffixCache(cfg)
    # agent-like requests: each prompt extends the one before, outputs repeat pieces of their prompt
    shared = [rng.randrange(50) for _ in range(60)]
    requests = []
    for i in range(6):
        prompt = shared + [rng.randrange(50) for _ in range(10 * i)]
        requests.append((prompt, prompt[5:25] + [rng.randrange(50) for _ in range(8)]))
    for _ in range(2):  # the first pass fills the cache, the second drafts from it
        second = [_serve(cache, p, o) for p, o in requests]
    size = len(cache)
    assert size == sum(len(p) + len(o) + 1 for p, o in requests)
    query = shared[-cfg.max_match :]
    _, ends = cache.index.occurrences(query)
    for _ in range(5):
        drafts = [_serve(cache, p, o) for p, o in requests]
        assert len(cache) == size and cache.index.occurrences(query)[1] == ends
        assert drafts == second
    assert cache.num_requests == len(requests)


def test_cache_takes_back_an_evicted_request() -> None:
    cfg = SuffixConfig(min_match=2, max_match=8, long_gram=4, cache_tokens=40)
    cache = SuffixCache(cfg)
    old = [10, 11, 12, 13, 14, 15]
    cache.add(old)
    cache.add(old)
    assert len(cache) == len(old) + 1
    for i in range(8):
        cache.add([100 + i] * 7)
    assert cache.index.propose([10, 11], 3) is None  # evicted
    cache.add(old)
    chain = cache.index.propose([10, 11], 3)
    assert chain is not None and chain.tokens == (12, 13, 14)
