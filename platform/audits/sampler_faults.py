"""Injected sampler faults: each wraps one primitive of ``lumotree.serving.sampling.walk`` for the
duration of a ``with`` block (the product code carries no fault switches).

- ``temperature_twice``: the draw divides the logits by T before the native transforms divide again.
- ``rows_shifted``: node i draws from node i+1's target row.
- ``fixed_residual``: the same uniforms are reused at every depth (the noise ignores the output position).
- ``unconditional_accept``: the walk always moves to the top (first active) child, whatever was drawn.
- ``correlated_draws``: for even token ids the uniforms of depth d repeat those of depth d-1 (each draw
  is still uniform on its own, but draws across depths are dependent).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

SAMPLER_FAULTS = (
    "temperature_twice",
    "rows_shifted",
    "fixed_residual",
    "unconditional_accept",
    "correlated_draws",
)


@contextlib.contextmanager
def sampler_fault(name: str) -> Iterator[None]:
    from lumotree.serving.sampling import rng
    from lumotree.serving.sampling import walk as wm

    saved = {k: getattr(wm, k) for k in ("draw", "gumbel", "walk")}
    draw, gumbel, walk = saved["draw"], saved["gumbel"], saved["walk"]
    if name == "temperature_twice":

        def draw_t2(logits, present, rp, noise):  # type: ignore[no-untyped-def]
            t = torch.where(rp.temperature > 0, rp.temperature, torch.ones_like(rp.temperature))
            return draw(logits / t[:, None], present, rp, noise)

        wm.draw = draw_t2
    elif name == "rows_shifted":

        def draw_shift(logits, present, rp, noise):  # type: ignore[no-untyped-def]
            return draw(torch.roll(logits, -1, 0), present, rp, noise)

        wm.draw = draw_shift
    elif name == "fixed_residual":

        def gumbel_fixed(seeds, positions, vocab):  # type: ignore[no-untyped-def]
            return gumbel(seeds, torch.zeros_like(positions), vocab)

        wm.gumbel = gumbel_fixed
    elif name == "correlated_draws":

        def gumbel_corr(seeds, positions, vocab):  # type: ignore[no-untyped-def]
            # The audit draws with out_pos 0, so a row's position is its depth. Even token ids reuse the
            # previous depth's uniforms (a stream that ignores the position for half of the vocabulary).
            u = rng.uniform(seeds, torch.zeros_like(positions), vocab)
            even = (torch.arange(vocab, device=seeds.device) % 2 == 0)[None, :]
            out = u.clone()
            for d in range(1, int(positions.max()) + 1):
                fresh = rng.uniform(seeds, torch.full_like(positions, d), vocab)
                u = torch.where(even, u, fresh)
                out = torch.where((positions == d)[:, None], u, out)
            return -torch.log(-torch.log(out))

        wm.gumbel = gumbel_corr
    elif name == "unconditional_accept":

        def walk_top(trees, logits, history, params, seeds, out_pos):  # type: ignore[no-untyped-def]
            res = walk(trees, logits, history, params, seeds, out_pos)
            n = logits.shape[0]
            offs = torch.tensor(trees.offsets, device=logits.device)
            req = torch.repeat_interleave(
                torch.arange(len(trees.sizes), device=logits.device),
                torch.tensor(trees.sizes, device=logits.device),
            )
            gpar = torch.where(trees.parents >= 0, trees.parents + offs[req], trees.parents)
            idx = torch.arange(n, device=logits.device)
            first = torch.full((n,), n, dtype=torch.int64, device=logits.device)
            ok = (gpar >= 0) & trees.active
            first.scatter_reduce_(0, gpar.clamp(min=0), torch.where(ok, idx, n), reduce="amin")
            cur = offs[:-1].clone()
            acc = torch.full_like(res.accepted, -1)
            acc[:, 0] = 0
            alive = torch.ones(len(trees.sizes), dtype=torch.bool, device=logits.device)
            for d in range(1, res.accepted.shape[1]):
                step = first[cur]
                alive &= step < n
                cur = torch.where(alive, step, cur)
                acc[:, d] = torch.where(alive, cur - offs[:-1], -1)
            return type(res)(
                accepted=acc, num_accepted=(acc >= 0).sum(-1), bonus=res.drawn[cur], drawn=res.drawn
            )

        wm.walk = walk_top
    else:
        raise ValueError(f"unknown sampler fault {name!r}; known: {', '.join(SAMPLER_FAULTS)}")
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(wm, k, v)
