"""Counter-based random stream: the draw for output position t of a request depends only on (seed, t).

Why not one ``torch.Generator`` per request: a generator's state advances with every draw, so an arm
that draws at several tree depths in one step would consume a different stream than AR. Here the Gumbel
noise for output position t is a pure function of (seed, t, token id), computed for a whole batch in a few
elementwise kernels, on any device, with identical bits on CPU and GPU. Every arm therefore sees exactly
the noise AR sees for each position: with equal logits, a seeded speculative arm emits AR's tokens, not
merely AR's distribution.

All integer arithmetic is 32-bit hashing carried in int64 tensors, with products kept below 2**63.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 without int64 overflow: split c into 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer: a bijection with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent 32-bit keys per (seed, position); seeds are any int64, positions >= 0."""
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    base = _fmix32(lo ^ _fmix32(hi ^ 0x5BD1E995))
    k1 = _fmix32((base + _mul32(positions & _M32, _GOLDEN)) & _M32)
    k2 = _fmix32(k1 ^ 0x27D4EB2F)
    return k1, k2


def uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniform(0, 1) noise [R, vocab] float32 for rows (seeds[r], positions[r]); never exactly 0 or 1."""
    assert seeds.shape == positions.shape and seeds.dim() == 1, (seeds.shape, positions.shape)
    k1, k2 = _row_keys(seeds.long(), positions.long())
    tok = _mul32(torch.arange(vocab, device=seeds.device, dtype=torch.int64), _GOLDEN)
    h = _fmix32(_fmix32((k1[:, None] + tok[None, :]) & _M32) ^ k2[:, None])
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    # (2^24 - 0.5) / 2^24 rounds to exactly 1.0 in float32 (a tie, to even): the Gumbel noise would be +inf
    # and a filtered token's -inf + inf = NaN breaks the argmax. Clamp that one value to the largest float
    # below 1; every other value is unchanged.
    return u.clamp(max=1.0 - 2.0**-24)


def gumbel(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [R, vocab] float32: argmax(logits + gumbel) is a draw from softmax(logits)."""
    return -torch.log(-torch.log(uniform(seeds, positions, vocab)))


def random_seed() -> int:
    """A fresh 63-bit seed for requests that did not pass one (host side, no device sync)."""
    import secrets

    return secrets.randbits(63)
