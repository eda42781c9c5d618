"""Suffix drafting (as in Arctic's suffix decoding): continue the context the way the text already did.

The corpus of a request is its prompt plus its output so far; a bounded cross-request cache holds finished
requests, each distinct text once. A proposal for a query (the request's text plus not-yet-committed tokens,
e.g. the tree root and an MTP spine) is:

1. the longest suffix of the query, between ``min_match`` and ``max_match`` tokens, that occurs in the corpus
   with at least one following token; C = every occurrence of it (its end positions);
2. a greedy walk: at step j the candidates vote with the token that follows them; the most frequent token
   wins (ties: the one that followed the most recent occurrence), its probability is its share of the votes;
   the losers drop out. The walk stops at ``max_len`` tokens, when no candidate has a next token, or when the
   winner's probability falls under ``min_prob``.

This is the walk down Arctic's suffix tree from the matched node (most frequent child each step), computed
lazily from positions instead of materialising a tree: the index is a hash of the last ``min_match`` and the
last ``long_gram`` tokens at every position, so an update costs O(1) per token and memory is a few ints per
token. ``score`` is the expected number of accepted tokens, sum_j prod_{i<=j} p_i.

A lookup costs O(occurrences of the matched suffix), at most ``max_candidates`` of them. A request whose
exact text is already cached is therefore not cached again: every copy would add one more occurrence to every
lookup that matches it (re-issued requests, e.g. the passes of a replay, would make each pass slower than the
one before at the same acceptance), while copies of a whole set of requests leave its vote shares as they
were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SEPARATOR = -1
"""Placed between requests in the cache corpus: no match crosses it and it is never proposed."""


@dataclass(frozen=True)
class SuffixConfig:
    """Matching and caching knobs of the suffix drafter."""

    min_match: int = 2
    """Shortest query suffix that counts as a match."""
    max_match: int = 32
    """Longest suffix compared (Arctic's tree depth); longer agreement does not rank higher."""
    long_gram: int = 8
    """Second index: matches at least this long are found among far fewer candidates."""
    max_candidates: int = 256
    """Most recent occurrences scanned per index lookup (bounds the cost on very repetitive text)."""
    min_prob: float = 0.1
    """A continuation token needs at least this share of the surviving occurrences."""
    cache_tokens: int = 1 << 20
    """Cross-request cache capacity in tokens; the oldest requests are dropped beyond it."""

    def __post_init__(self) -> None:
        assert 1 <= self.min_match <= self.long_gram <= self.max_match, self
        assert self.max_candidates >= 1 and 0.0 <= self.min_prob <= 1.0 and self.cache_tokens >= 1


@dataclass(frozen=True)
class SuffixChain:
    """A proposed continuation: tokens with their conditional frequencies."""

    tokens: tuple[int, ...]
    probs: tuple[float, ...]
    """probs[j] = share of the occurrences still agreeing after tokens[:j] that continue with tokens[j]."""
    match_len: int
    """Length of the matched query suffix."""
    source: str = "request"
    """"request" (the request's own text) or "cache" (finished requests)."""

    @property
    def score(self) -> float:
        """Expected accepted tokens if each token is accepted with its probability, in order."""
        total, run = 0.0, 1.0
        for p in self.probs:
            run *= p
            total += run
        return total

    def cumulative(self) -> list[float]:
        """prod_{i<=j} probs[i] for every j: the path confidence of each chain node."""
        out, run = [], 1.0
        for p in self.probs:
            run *= p
            out.append(run)
        return out


@dataclass
class SuffixIndex:
    """An append-only token corpus with end-position lists for ``min_match``- and ``long_gram``-grams."""

    config: SuffixConfig = field(default_factory=SuffixConfig)
    tokens: list[int] = field(default_factory=list)
    _grams: dict[int, dict[int, list[int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._grams = {n: {} for n in sorted({self.config.min_match, self.config.long_gram})}
        toks, self.tokens = self.tokens, []
        self.extend(toks)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens (incremental: O(1) index work per token)."""
        t = self.tokens
        for x in tokens:
            t.append(int(x))
            e = len(t) - 1
            for n, table in self._grams.items():
                if e + 1 >= n:
                    gram = tuple(t[e - n + 1 : e + 1])
                    if SEPARATOR not in gram:
                        table.setdefault(hash(gram), []).append(e)

    def has_gram(self, query: Sequence[int]) -> bool:
        """Whether the last ``min_match`` tokens of ``query`` occur at all: without them no suffix of the
        query matches (every longer one ends with them), so a lookup can stop here."""
        n = self.config.min_match
        return len(query) >= n and hash(tuple(query[-n:])) in self._grams[n]

    def _match_len(self, e: int, query: list[int]) -> int:
        t, limit = self.tokens, min(self.config.max_match, len(query), e + 1)
        # whole-window agreement (the common case on repetitive text) in one list comparison
        if t[e + 1 - limit : e + 1] == query[len(query) - limit :]:
            return limit
        m = 0
        while m < limit and t[e - m] == query[-1 - m]:
            m += 1
        return m

    def occurrences(self, query: Sequence[int]) -> tuple[int, list[int]]:
        """(L*, ends): the longest matched suffix length and the end positions of its occurrences that have
        a next token; (0, []) when no suffix of ``min_match`` tokens or more matches."""
        cfg, t, n_tok = self.config, self.tokens, len(self.tokens)
        query = list(query)
        full = min(cfg.max_match, len(query))
        window = query[len(query) - full :]
        for n in sorted(self._grams, reverse=True):
            if len(query) < n:
                continue
            ends = self._grams[n].get(hash(tuple(query[-n:])), [])[-cfg.max_candidates :]
            # Repetitive text puts hundreds of occurrences in agreement over the whole window: find those
            # with one slice comparison each (no occurrence can match longer), before the general scan.
            best_ends = [e for e in ends if full <= e + 1 < n_tok and t[e + 1 - full : e + 1] == window]
            if best_ends:
                return full, best_ends
            scored = [(self._match_len(e, query), e) for e in ends if e + 1 < n_tok]
            scored = [(m, e) for m, e in scored if m >= n]
            if scored:
                best = max(m for m, _ in scored)
                return best, [e for m, e in scored if m == best]
        return 0, []

    def next_tokens(self, query: Sequence[int]) -> list[int]:
        """The tokens that followed the last ``min_match`` tokens of ``query`` (its shortest match), at most
        ``max_candidates`` occurrences, most recent last."""
        n, t = self.config.min_match, self.tokens
        gram = list(query[-n:])
        if len(gram) < n:
            return []
        ends = self._grams[n].get(hash(tuple(gram)), [])[-self.config.max_candidates :]
        return [
            t[e + 1]
            for e in ends
            if e + 1 < len(t) and t[e + 1] != SEPARATOR and t[e + 1 - n : e + 1] == gram
        ]

    def propose(self, query: Sequence[int], max_len: int, source: str = "request") -> SuffixChain | None:
        """The greedy continuation of ``query`` (see the module docstring), or None without a match."""
        match_len, cand = self.occurrences(query)
        if not cand or max_len <= 0:
            return None
        t, n_tok = self.tokens, len(self.tokens)
        toks: list[int] = []
        probs: list[float] = []
        for j in range(1, max_len + 1):
            # candidates are in position order: when the last one has a next token, all do, and one pass
            # reads them (a separator among them, rare, sends the step through the filter)
            nxt = [t[e + j] for e in cand] if cand[-1] + j < n_tok else [SEPARATOR]
            if SEPARATOR in nxt:
                live = [e for e in cand if e + j < n_tok and t[e + j] != SEPARATOR]
                if not live:
                    break
                nxt = [t[e + j] for e in live]
            else:
                live = cand
            if nxt.count(nxt[0]) == len(nxt):  # unanimous (the common case on repetitive text)
                tok, count = nxt[0], len(nxt)
            else:
                votes = Counter(nxt)
                count = max(votes.values())
                # candidates stay in position order, so the last one with a winning token is the most recent
                tok = next(x for x in reversed(nxt) if votes[x] == count)
            p = count / len(live)
            if p < self.config.min_prob:
                break
            toks.append(tok)
            probs.append(p)
            cand = live if count == len(live) else [e for e, x in zip(live, nxt, strict=True) if x == tok]
        if not toks:
            return None
        return SuffixChain(tuple(toks), tuple(probs), match_len, source)


class SuffixCache:
    """Finished requests, concatenated with separators, at most ``cache_tokens`` tokens (oldest dropped).

    A request whose text is already cached is not added again (see the module docstring): each distinct text
    counts once, so serving the same requests again leaves the cache, and the work of every lookup, as it was.
    """

    def __init__(self, config: SuffixConfig | None = None) -> None:
        self.config = config or SuffixConfig()
        self._requests: list[tuple[int, ...]] = []
        self._cached: set[tuple[int, ...]] = set()
        self.index = SuffixIndex(self.config)
        self.version = 0
        """Bumped whenever the corpus changes (lookups computed before then are stale)."""

    def add(self, tokens: Sequence[int]) -> None:
        toks = tuple(int(x) for x in tokens)[-self.config.cache_tokens :]
        if toks in self._cached:
            return
        self.version += 1
        self._requests.append(toks)
        self._cached.add(toks)
        if len(self.index) + len(toks) + 1 > self.config.cache_tokens:
            # rebuild over the newest requests that fit in half the budget: amortised O(1) per token
            keep: list[tuple[int, ...]] = []
            size = 0
            for r in reversed(self._requests):
                if size + len(r) + 1 > max(self.config.cache_tokens // 2, len(toks) + 1):
                    break
                keep.append(r)
                size += len(r) + 1
            self._requests = keep[::-1]
            self._cached = set(self._requests)
            self.index = SuffixIndex(self.config)
            for r in self._requests:
                self.index.extend([*r, SEPARATOR])
        else:
            self.index.extend([*toks, SEPARATOR])

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_requests(self) -> int:
        """Distinct requests held."""
        return len(self._requests)


class SuffixDrafter:
    """Per-request suffix drafter over the request's prompt and output, plus an optional shared cache."""

    def __init__(
        self, prompt: Sequence[int], config: SuffixConfig | None = None, cache: SuffixCache | None = None
    ) -> None:
        self.config = config or (cache.config if cache is not None else SuffixConfig())
        self.index = SuffixIndex(self.config, list(prompt))
        self.cache = cache
        self._ahead: dict[tuple[tuple[int, ...], int], SuffixChain | None] = {}
        self._ahead_stamp: tuple[int, int] = self._stamp()

    def _stamp(self) -> tuple[int, int]:
        """What a proposal depends on besides its query: both corpora (the request's is append-only)."""
        return len(self.index), -1 if self.cache is None else self.cache.version

    @property
    def tokens(self) -> list[int]:
        return self.index.tokens

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed output tokens (call once per step with the accepted tokens)."""
        self.index.extend(tokens)

    def propose(self, extra: Sequence[int] = (), max_len: int = 8) -> SuffixChain | None:
        """Continue the request's text followed by ``extra`` (uncommitted tokens: the tree root, a spine
        prefix, a runner-up); the best-scoring chain of the request and the cache, or None."""
        key = (tuple(int(x) for x in extra), max_len)
        ahead = self._fresh_ahead()
        return ahead[key] if key in ahead else self._propose(*key)

    def look_ahead(self, extra: Sequence[int], max_len: int) -> None:
        """Compute ``propose(extra, max_len)`` now, while the host would wait on the GPU anyway: a later
        identical call returns it as long as neither corpus has changed since."""
        key = (tuple(int(x) for x in extra), max_len)
        self._fresh_ahead()[key] = self._propose(*key)

    def _fresh_ahead(self) -> dict[tuple[tuple[int, ...], int], SuffixChain | None]:
        stamp = self._stamp()
        if stamp != self._ahead_stamp:
            self._ahead, self._ahead_stamp = {}, stamp
        return self._ahead

    def _query(self, extra: Sequence[int]) -> list[int]:
        return (self.index.tokens[-self.config.max_match :] + list(extra))[-self.config.max_match :]

    def _corpora(self) -> list[tuple[SuffixIndex, str]]:
        """The indexes a lookup reads: the request's, then the cache's when it holds anything."""
        out = [(self.index, "request")]
        if self.cache is not None and len(self.cache):
            out.append((self.cache.index, "cache"))
        return out

    def successors(self, extra: Sequence[int] = (), k: int = 3) -> list[int]:
        """The ``k`` tokens that most often followed the shortest match (``min_match`` tokens) of the
        request's text plus ``extra``, in the request and the cache together, most frequent first: the
        candidates to look ahead for, e.g. the root's runner-ups before the drafter has named them."""
        query = self._query(extra)
        votes: Counter[int] = Counter()
        for idx, _ in self._corpora():
            votes.update(idx.next_tokens(query))
        return [tok for tok, _ in votes.most_common(k)]

    def _propose(self, extra: tuple[int, ...], max_len: int) -> SuffixChain | None:
        query = self._query(extra)
        best = None
        for idx, src in self._corpora():
            if not idx.has_gram(query):  # e.g. a runner-up never seen after the root: no scan
                continue
            got = idx.propose(query, max_len, src)
            if got is not None and (best is None or got.score > best.score):
                best = got
        return best

    def finish(self) -> None:
        """Hand the request's text to the cross-request cache (call when the request ends)."""
        if self.cache is not None:
            self.cache.add(self.index.tokens)
