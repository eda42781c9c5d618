"""The target-only walk: selection for every arm (AR is the root-only tree, chains are trees of fanout 1).

For one request: at the root, draw x from the target's transformed next-token distribution (presence
penalty over the generated history plus the root-to-node path); if x is the token of an active child, move
there and repeat; otherwise stop and x is the bonus token b*. Every draw is from the target's own
conditional, so the emitted sequence has exactly the distribution of plain sampling. The draw at tree depth
d uses the random stream of output position ``out_pos + d`` (see ``rng``), the noise AR uses there.

Everything runs batched over requests on the logits' device; host values are tree sizes and max depth.
The selection itself (``_select``) is fixed-shape and sync-free given the trees' topology tables, so
``walk_static`` can replay it as one CUDA graph per structure; ``walk`` runs the same code eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from lumotree.serving.sampling.rng import gumbel
from lumotree.serving.sampling.transforms import (
    RowParams,
    apply_presence,
    argmax_lowest,
    filter_logits,
    probabilities,
)

if TYPE_CHECKING:
    from lumotree.serving.graphs import StaticGraphs

Topology = tuple[tuple[int, ...], ...]
"""Host parents of every request's tree (local indices, -1 at the root): what the walk's tables depend on."""


@dataclass
class TreeBatch:
    """B request trees packed node after node: request b owns nodes offsets[b] .. offsets[b+1]-1.

    Within a request node 0 is the root (the pending token), parents precede children, and parent = -1
    only at node 0.
    """

    tokens: torch.Tensor  # [N] int64 token id of each node
    parents: torch.Tensor  # [N] int64 parent index local to the request, -1 for the root
    active: torch.Tensor  # [N] bool; inactive (padded) nodes are never entered by the walk
    sizes: list[int]  # host: nodes per request
    max_depth: int  # host: deepest node depth over all trees (root = 0)
    topology: Topology | None = None
    """Host parents when the builder knows them (``from_topology``): the walk then reads cached tables."""

    def __post_init__(self) -> None:
        n = sum(self.sizes)
        assert self.tokens.shape == (n,) and self.parents.shape == (n,) and self.active.shape == (n,)
        assert all(s >= 1 for s in self.sizes), self.sizes

    @property
    def offsets(self) -> list[int]:
        out = [0]
        for s in self.sizes:
            out.append(out[-1] + s)
        return out

    @staticmethod
    def build(
        trees: Sequence[tuple[Sequence[int] | torch.Tensor, Sequence[int], Sequence[bool] | None]],
        device: torch.device | str,
    ) -> TreeBatch:
        """From per-request (tokens, parents, active or None = all active); checks invariants on host."""
        toks, pars, acts, sizes, depth = [], [], [], [], 0
        for tokens, parents, active in trees:
            parents = [int(p) for p in parents]
            n = len(parents)
            assert parents[0] == -1 and all(0 <= p < i for i, p in enumerate(parents) if i), parents
            d = [0] * n
            for i in range(1, n):
                d[i] = d[parents[i]] + 1
            depth = max(depth, max(d))
            toks.append(torch.as_tensor(tokens, dtype=torch.int64).to(device))
            pars.extend(parents)
            acts.extend([True] * n if active is None else [bool(a) for a in active])
            sizes.append(n)
        return TreeBatch(
            tokens=torch.cat(toks),
            parents=torch.tensor(pars, dtype=torch.int64).to(device, non_blocking=True),
            active=torch.tensor(acts, dtype=torch.bool).to(device, non_blocking=True),
            sizes=sizes,
            max_depth=depth,
        )

    @staticmethod
    def from_topology(
        tokens: torch.Tensor, topology: Topology, active: tuple[tuple[bool, ...], ...]
    ) -> TreeBatch:
        """Trees whose shape and active masks are host tuples (verification): parents and masks come from
        per-structure caches, so a repeated tree shape costs no host->device copy; tokens stay as given."""
        dev = str(tokens.device)
        t = tree_tables(topology, dev)
        return TreeBatch(tokens, t.parents, _active_mask(active, dev), list(t.sizes), t.max_depth, topology)

    @staticmethod
    def roots(tokens: torch.Tensor) -> TreeBatch:
        """One root-only tree per request (AR, and the first draw after prefill). With its host topology,
        so AR's draws take the same per-structure graphs (``walk_static``) as the speculative arms' walks."""
        b = tokens.shape[0]
        return TreeBatch.from_topology(tokens.long(), ((-1,),) * b, ((True,),) * b)


@dataclass
class WalkResult:
    """Per request: the accepted path (local node indices, root first, -1 padded) and the bonus token."""

    accepted: torch.Tensor  # [B, max_depth + 1] int64
    num_accepted: torch.Tensor  # [B] int64, >= 1 (the root is always accepted)
    bonus: torch.Tensor  # [B] int64, b*
    drawn: torch.Tensor  # [N] int64, the token drawn at every node (audits)
    path_tokens: torch.Tensor | None = None
    """[B, max_depth + 1] int64 token of each accepted node, -1 padded (every walk here fills it)."""


@dataclass(eq=False)
class TreeTables:
    """What the walk derives from the trees' shape alone (device tensors plus host sizes).

    Identity equality: a ``walk_static`` graph key holds the very tables its graph reads, which keeps
    their memory alive after ``tree_tables``' cache has dropped them."""

    sizes: tuple[int, ...]
    max_depth: int
    parents: torch.Tensor  # [N] local parent, -1 at roots
    req: torch.Tensor  # [N] request of each node
    gpar: torch.Tensor  # [N] global parent index, -1 at roots
    depth: torch.Tensor  # [N] root = 0
    anc: torch.Tensor  # [N, max_depth + 1] d-th ancestor (0 = self), -1 past the root
    path: torch.Tensor  # [N, max_depth + 1] ancestors-or-self below the root (path tokens), else -1
    offsets: torch.Tensor  # [B + 1]


def _tables(parents: torch.Tensor, sizes: Sequence[int], max_depth: int) -> TreeTables:
    dev = parents.device
    n, b = sum(sizes), len(sizes)
    offsets = torch.tensor([0, *sizes], dtype=torch.int64).cumsum(0).to(dev, non_blocking=True)
    req = torch.repeat_interleave(torch.arange(b, device=dev), offsets.diff(), output_size=n)
    gpar = torch.where(parents >= 0, parents + offsets[req], parents)
    anc = torch.full((n, max_depth + 1), -1, dtype=torch.int64, device=dev)
    anc[:, 0] = torch.arange(n, device=dev)
    for d in range(1, max_depth + 1):
        prev = anc[:, d - 1]
        anc[:, d] = torch.where(prev >= 0, gpar[prev.clamp(min=0)], prev)
    depth = (anc >= 0).sum(-1) - 1
    # The root's token is already in the generated history, so a node's path starts below the root.
    path = torch.where((anc >= 0) & (gpar[anc.clamp(min=0)] >= 0), anc, -1)
    return TreeTables(tuple(sizes), max_depth, parents, req, gpar, depth, anc, path, offsets)


def _tables_of(trees: TreeBatch) -> TreeTables:
    if trees.topology is not None:
        return tree_tables(trees.topology, str(trees.tokens.device))
    return _tables(trees.parents, trees.sizes, trees.max_depth)


@lru_cache(maxsize=256)
def tree_tables(topology: Topology, device: str) -> TreeTables:
    """The tables of one topology, built once (a repeated tree shape costs no host work or copies)."""
    depth = 0
    for par in topology:
        d = [0] * len(par)
        for i, p in enumerate(par):
            assert (p == -1) == (i == 0) and p < i, par
            d[i] = d[p] + 1 if p >= 0 else 0
        depth = max(depth, max(d))
    flat = torch.tensor([p for par in topology for p in par], dtype=torch.int64, device=device)
    return _tables(flat, [len(p) for p in topology], depth)


@lru_cache(maxsize=256)
def _active_mask(active: tuple[tuple[bool, ...], ...], device: str) -> torch.Tensor:
    return torch.tensor([a for act in active for a in act], dtype=torch.bool, device=device)


def draw(
    logits: torch.Tensor,
    present: torch.Tensor | None,
    rp: RowParams,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """One token per row [R]: greedy rows take argmax (lowest id), others argmax(filtered + Gumbel noise)."""
    penalized = apply_presence(logits, present, rp)
    greedy = argmax_lowest(penalized)
    if rp.all_greedy:
        return greedy
    assert noise is not None
    sampled = argmax_lowest(filter_logits(penalized, rp) + noise)
    return torch.where(rp.temperature == 0, greedy, sampled)


def _node_view(
    t: TreeTables, tokens: torch.Tensor, history: torch.Tensor | None, params: RowParams, vocab: int
) -> tuple[torch.Tensor | None, RowParams]:
    """Per node: presence [N, V] (generated history + the node's path tokens) or None, and parameters."""
    present = None
    if history is not None and params.any_penalty:
        present = history[t.req]
        if t.max_depth > 0:
            cols = torch.where(t.path >= 0, tokens[t.path.clamp(min=0)], vocab)
            ext = torch.zeros(present.shape[0], vocab + 1, dtype=torch.bool, device=present.device)
            ext[:, :vocab] = present
            present = ext.scatter_(1, cols, True)[:, :vocab]
    return present, params.index(t.req)


def node_probabilities(
    trees: TreeBatch, logits: torch.Tensor, history: torch.Tensor | None, params: RowParams
) -> torch.Tensor:
    """The exact distribution [N, V] the walk draws from at every node (audits, enumeration tests)."""
    present, rp = _node_view(_tables_of(trees), trees.tokens, history, params, logits.shape[-1])
    return probabilities(logits, present, rp)


def _select(
    t: TreeTables,
    tokens: torch.Tensor,
    active: torch.Tensor,
    logits: torch.Tensor,
    history: torch.Tensor | None,
    params: RowParams,
    seeds: torch.Tensor,
    out_pos: torch.Tensor,
) -> WalkResult:
    """The walk on fixed shapes: no host value besides the tables' sizes, no sync, no host->device copy."""
    dev = logits.device
    n, vocab = logits.shape
    b, slots = len(t.sizes), t.max_depth + 1
    present, rp = _node_view(t, tokens, history, params, vocab)
    noise = None
    if not params.all_greedy:
        # Nodes at the same depth of one request share the noise of that output position.
        pos = out_pos.long()[:, None] + torch.arange(slots, device=dev)[None, :]
        table = gumbel(seeds.long()[:, None].expand(b, slots).reshape(-1), pos.reshape(-1), vocab)
        noise = table[t.req * slots + t.depth]
    x = draw(logits, present, rp, noise)

    # nxt[i] = lowest-index active child of i whose token is x[i], else n.
    idx = torch.arange(n, device=dev)
    parent = t.gpar.clamp(min=0)
    child = (t.gpar >= 0) & active & (tokens == x[parent])
    nxt = torch.full((n,), n, dtype=torch.int64, device=dev)
    nxt.scatter_reduce_(0, parent, torch.where(child, idx, n), reduce="amin", include_self=True)
    # A node is on the accepted path iff the walk moved into every node of its path (roots: always):
    # at most one node per (request, depth), so the path scatters into place without a per-depth loop.
    moved = (t.gpar < 0) | (nxt[parent] == idx)
    reached = (moved[t.anc.clamp(min=0)] | (t.anc < 0)).all(-1)
    cell = torch.where(reached, t.req * slots + t.depth, b * slots)
    flat = torch.full((b * slots + 1,), -1, dtype=torch.int64, device=dev)
    accepted = flat.scatter_(0, cell, idx - t.offsets[t.req])[:-1].view(b, slots)
    num = (accepted >= 0).sum(-1)
    start = t.offsets[:-1]
    last = start + accepted.gather(1, (num - 1)[:, None])[:, 0]
    path_tokens = torch.where(accepted >= 0, tokens[start[:, None] + accepted.clamp(min=0)], -1)
    return WalkResult(accepted, num, x[last], x, path_tokens)


def walk(
    trees: TreeBatch,
    logits: torch.Tensor,
    history: torch.Tensor | None,
    params: RowParams,
    seeds: torch.Tensor,
    out_pos: torch.Tensor,
) -> WalkResult:
    """Select the accepted path and bonus token of every request.

    logits [N, V] fp32: the target's logits at every tree node (raw, before any transform).
    history [B, V] bool or None: tokens already generated by each request, the root's token included when
      it is a generated token; the walk adds each node's path tokens (root excluded) on top.
    params: per-request RowParams [B]; seeds [B] int64; out_pos [B] int64: the output index that the
      root's draw produces.
    """
    dev = logits.device
    n, vocab = logits.shape
    b = len(trees.sizes)
    assert n == sum(trees.sizes), (n, trees.sizes)
    if trees.max_depth == 0:  # root-only trees (AR): one draw per request, no path bookkeeping
        present = history if params.any_penalty else None
        noise = None if params.all_greedy else gumbel(seeds, out_pos, vocab)
        x = draw(logits, present, params, noise)
        zero = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        return WalkResult(zero, zero[:, 0] + 1, x, x, trees.tokens[:, None])
    return _select(_tables_of(trees), trees.tokens, trees.active, logits, history, params, seeds, out_pos)


def walk_static(
    graphs: StaticGraphs,
    trees: TreeBatch,
    logits: torch.Tensor,
    history: torch.Tensor | None,
    params: RowParams,
    seeds: torch.Tensor,
    out_pos: torch.Tensor,
) -> WalkResult:
    """``walk`` of trees with a host topology through ``graphs``: one graph per structure (topology,
    vocabulary and the parameters' host facts), replayed over static copies of the step's tensors (on the
    CPU the same code runs eagerly on those copies)."""
    assert trees.topology is not None, "walk_static needs the trees' host topology"
    t = tree_tables(trees.topology, str(logits.device))
    p = params
    use_history = history is not None and p.any_penalty
    facts = (p.all_greedy, p.sort_width, p.any_penalty, p.any_min_p)
    key = ("walk", t, logits.shape[-1], logits.dtype, *facts, use_history)
    inputs = [trees.tokens, trees.active, logits, seeds.long(), out_pos.long(),
              p.temperature, p.top_k, p.top_p, p.min_p, p.presence_penalty]  # fmt: skip
    if use_history:
        assert history is not None
        inputs.append(history)

    def run(x: list[torch.Tensor]) -> torch.Tensor:
        tokens, active, lg, sd, op, temp, top_k, top_p, min_p, penalty = x[:10]
        rp = RowParams(temp, top_k, top_p, min_p, penalty, *facts)
        r = _select(t, tokens, active, lg, x[10] if use_history else None, rp, sd, op)
        assert r.path_tokens is not None
        return torch.cat([r.accepted.view(-1), r.path_tokens.view(-1), r.num_accepted, r.bonus, r.drawn])

    # Graph outputs live in the memory pool the runner's graphs share; the commit graph, captured before
    # this one and replayed after it, reuses that memory for its own work. So the result leaves the pool
    # at once, in one copy.
    b, s, n = len(t.sizes), t.max_depth + 1, logits.shape[0]
    acc, path, num, bonus, drawn = graphs(key, run, inputs).clone().split([b * s, b * s, b, b, n])
    return WalkResult(acc.view(b, s), num, bonus, drawn, path.view(b, s))
