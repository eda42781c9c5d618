"""The target-only walk: selection for every arm (AR is the root-only tree, chains are trees of fanout 1).

For one request: at the root, draw x from the target's transformed next-token distribution (presence
penalty over the generated history plus the root-to-node path); if x is the token of an active child, move
there and repeat; otherwise stop and x is the bonus token b*. Every draw is from the target's own
conditional, so the emitted sequence has exactly the distribution of plain sampling. The draw at tree depth
d uses the random stream of output position ``out_pos + d`` (see ``rng``), the noise AR uses there.

Everything runs batched over requests on the logits' device; host values are tree sizes and max depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumotree.serving.sampling.rng import gumbel
from lumotree.serving.sampling.transforms import (
    RowParams,
    apply_presence,
    argmax_lowest,
    filter_logits,
    probabilities,
)


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
    def roots(tokens: torch.Tensor) -> TreeBatch:
        """One root-only tree per request (AR, and the first draw after prefill)."""
        b = tokens.shape[0]
        dev = tokens.device
        return TreeBatch(
            tokens=tokens.long(),
            parents=torch.full((b,), -1, dtype=torch.int64, device=dev),
            active=torch.ones(b, dtype=torch.bool, device=dev),
            sizes=[1] * b,
            max_depth=0,
        )


@dataclass
class WalkResult:
    """Per request: the accepted path (local node indices, root first, -1 padded) and the bonus token."""

    accepted: torch.Tensor  # [B, max_depth + 1] int64
    num_accepted: torch.Tensor  # [B] int64, >= 1 (the root is always accepted)
    bonus: torch.Tensor  # [B] int64, b*
    drawn: torch.Tensor  # [N] int64, the token drawn at every node (audits)


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


@dataclass
class _Nodes:
    """Per-node view of a TreeBatch: owning request, global parent, ancestors, depth, parameters, history."""

    req: torch.Tensor  # [N] request of each node
    gpar: torch.Tensor  # [N] global parent index, -1 at roots
    depth: torch.Tensor  # [N] root = 0
    offsets: torch.Tensor  # [B + 1]
    rp: RowParams  # per node
    present: torch.Tensor | None  # [N, V] bool: generated history + the node's root-to-node path tokens


def _nodes(trees: TreeBatch, history: torch.Tensor | None, params: RowParams, vocab: int) -> _Nodes:
    dev = trees.tokens.device
    n, b, depth_max = sum(trees.sizes), len(trees.sizes), trees.max_depth
    offsets = torch.tensor(trees.offsets, dtype=torch.int64).to(dev, non_blocking=True)
    sizes = torch.tensor(trees.sizes, dtype=torch.int64).to(dev, non_blocking=True)
    req = torch.repeat_interleave(torch.arange(b, device=dev), sizes, output_size=n)
    gpar = torch.where(trees.parents >= 0, trees.parents + offsets[req], trees.parents)

    # anc[:, d] = d-th ancestor (0 = self), -1 past the root; depth = number of proper ancestors.
    anc = torch.full((n, depth_max + 1), -1, dtype=torch.int64, device=dev)
    anc[:, 0] = torch.arange(n, device=dev)
    for d in range(1, depth_max + 1):
        prev = anc[:, d - 1]
        anc[:, d] = torch.where(prev >= 0, gpar[prev.clamp(min=0)], prev)
    depth = (anc >= 0).sum(-1) - 1

    present = None
    if history is not None and params.any_penalty:
        present = history[req]
        if depth_max > 0:
            # Path tokens: ancestors-or-self except the root (whose token the history already holds).
            on_path = (anc >= 0) & (gpar[anc.clamp(min=0)] >= 0)
            cols = torch.where(on_path, trees.tokens[anc.clamp(min=0)], vocab)
            ext = torch.zeros(n, vocab + 1, dtype=torch.bool, device=dev)
            ext[:, :vocab] = present
            present = ext.scatter_(1, cols, True)[:, :vocab]
    return _Nodes(req, gpar, depth, offsets, params.index(req), present)


def node_probabilities(
    trees: TreeBatch, logits: torch.Tensor, history: torch.Tensor | None, params: RowParams
) -> torch.Tensor:
    """The exact distribution [N, V] the walk draws from at every node (audits, enumeration tests)."""
    nodes = _nodes(trees, history, params, logits.shape[-1])
    return probabilities(logits, nodes.present, nodes.rp)


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
    b, depth_max = len(trees.sizes), trees.max_depth
    assert n == sum(trees.sizes), (n, trees.sizes)
    if depth_max == 0:  # root-only trees (AR): one draw per request, no path bookkeeping
        present = history if params.any_penalty else None
        noise = None if params.all_greedy else gumbel(seeds, out_pos, vocab)
        x = draw(logits, present, params, noise)
        zero = torch.zeros(b, 1, dtype=torch.int64, device=dev)
        return WalkResult(accepted=zero, num_accepted=zero[:, 0] + 1, bonus=x, drawn=x)
    nodes = _nodes(trees, history, params, vocab)

    noise = None
    if not params.all_greedy:
        # Nodes at the same depth of one request share the noise of that output position.
        slots = torch.arange(depth_max + 1, device=dev)
        table = gumbel(
            seeds.long().repeat_interleave(depth_max + 1),
            (out_pos.long()[:, None] + slots[None, :]).reshape(-1),
            vocab,
        )
        noise = table[nodes.req * (depth_max + 1) + nodes.depth]
    x = draw(logits, nodes.present, nodes.rp, noise)

    # nxt[i] = lowest-index active child of i whose token is x[i], else n.
    gpar = nodes.gpar
    child = (gpar >= 0) & trees.active & (trees.tokens == x[gpar.clamp(min=0)])
    nxt = torch.full((n,), n, dtype=torch.int64, device=dev)
    idx = torch.arange(n, device=dev)
    nxt.scatter_reduce_(0, gpar.clamp(min=0), torch.where(child, idx, n), reduce="amin", include_self=True)

    start = nodes.offsets[:-1]
    cur = start.clone()
    accepted = torch.full((b, depth_max + 1), -1, dtype=torch.int64, device=dev)
    accepted[:, 0] = 0
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    for d in range(1, depth_max + 1):
        step = nxt[cur]
        alive = alive & (step < n)
        cur = torch.where(alive, step, cur)
        accepted[:, d] = torch.where(alive, cur - start, -1)
    return WalkResult(accepted=accepted, num_accepted=(accepted >= 0).sum(-1), bonus=x[cur], drawn=x)
