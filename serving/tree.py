"""The one tree descriptor that drafting, verification, selection and commit all read.

A ``TreeTopology`` is the immutable shape of a draft tree: parents, depths, routes, the ancestor
(visibility) mask, the logical-node to physical-row map and the GDN scan plan. It is validated once when
built and cached, so a fixed tree (hydra27) costs no host work per step. A ``TreeDescriptor`` is one step's
tree: a topology plus token ids, the prefix length (positions = prefix_len + depth) and the active mask.

Row order (physical) is what every consumer sees: row 0 is the root (the pending token), rows 1..d the
top-choice spine (so an accepted spine prefix sits at slots prefix_len + j and needs no KV remap), then
the other nodes in logical order; parents always precede children. ``node_to_row`` maps the builder's
logical node index (root = 0) to its row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources

import torch

from ..kernels.tree_plan import PathPlan, WyPlan, plan_tree


class TreeError(ValueError):
    """A malformed tree: raised before any kernel sees it."""


@dataclass(frozen=True)
class TreeLimits:
    """Size limits every tree is checked against."""

    max_nodes: int = 64
    """Rows of one tree, root included (the scan and the CUDA-graph buckets are sized for 64)."""
    max_fanout: int = 16
    """Children of one node (the sampler walks at most this many candidates per node)."""


DEFAULT_LIMITS = TreeLimits()


def check_parents(parents: Sequence[int], limits: TreeLimits = DEFAULT_LIMITS) -> None:
    """Validate logical parents: size, index range, one root at node 0, no cycles, parents first, fanout."""
    n = len(parents)
    if n == 0:
        raise TreeError("a tree needs at least its root")
    if n > limits.max_nodes:
        raise TreeError(f"tree has {n} nodes; the limit is {limits.max_nodes}")
    for i, p in enumerate(parents):
        if not isinstance(p, int) or not -1 <= p < n:
            raise TreeError(f"node {i}: parent {p!r} is out of range [-1, {n})")
        if p == i:
            raise TreeError(f"node {i} is its own parent (cycle)")
    roots = [i for i, p in enumerate(parents) if p == -1]
    if len(roots) != 1:
        raise TreeError(f"a tree needs exactly one root (parent -1); found {len(roots)}: {roots[:8]}")
    if roots[0] != 0:
        raise TreeError(f"the root must be node 0, found it at node {roots[0]}")
    for i in range(n):  # a walk up longer than n nodes means a cycle
        j, steps = i, 0
        while j != -1:
            j, steps = parents[j], steps + 1
            if steps > n:
                raise TreeError(f"node {i} is on a parent cycle")
    for i, p in enumerate(parents):
        if p >= i:
            raise TreeError(f"node {i}: parent {p} comes after it (parents must precede children)")
    fan = [0] * n
    for p in parents[1:]:
        fan[p] += 1
    if max(fan) > limits.max_fanout:
        raise TreeError(
            f"node {fan.index(max(fan))} has {max(fan)} children; the limit is {limits.max_fanout}"
        )


def sibling_ranks(parents: Sequence[int]) -> list[int]:
    """Rank of each node among its siblings in logical order (0 = first child = drafter's top choice)."""
    rank = [0] * len(parents)
    seen: dict[int, int] = {}
    for i, p in enumerate(parents[1:], 1):
        rank[i] = seen.get(p, 0)
        seen[p] = rank[i] + 1
    return rank


def spine_first_order(parents: Sequence[int], ranks: Sequence[int]) -> list[int]:
    """Logical nodes in row order: the root, its rank-0 spine, then the rest in logical order."""
    first_child: dict[int, int] = {}
    for i, p in enumerate(parents):
        if p >= 0 and ranks[i] == 0:
            first_child[p] = i
    spine = [0]
    while spine[-1] in first_child:
        spine.append(first_child[spine[-1]])
    on_spine = set(spine)
    return spine + [i for i in range(len(parents)) if i not in on_spine]


@dataclass(frozen=True, eq=False)
class TreeTopology:
    """Immutable tree shape in row order. Build with ``from_parents`` / ``from_paths`` / ``chain``."""

    name: str
    parents: tuple[int, ...]
    """[N] parent row of each row, -1 for the root (row 0)."""
    default_active: tuple[bool, ...]
    """[N] rows that may carry a candidate (padded rows are False and never sampled)."""
    node_to_row: tuple[int, ...]
    """[N] row of each logical node (the builder's numbering, root = 0)."""
    routes: tuple[tuple[int, ...], ...]
    """[N] each row's route from the root as sibling ranks (0 = drafter's top choice); root = ()."""
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        n = len(self.parents)
        assert len(self.default_active) == n and len(self.node_to_row) == n and len(self.routes) == n
        assert sorted(self.node_to_row) == list(range(n))
        assert all(-1 <= p < i for i, p in enumerate(self.parents)) and self.parents[0] == -1
        assert self.default_active[0], "the root is always active"
        for i, p in enumerate(self.parents[1:], 1):
            assert self.default_active[p] or not self.default_active[i], (
                f"active row {i} under an inactive parent"
            )

    # -- builders -------------------------------------------------------------------------------------
    @staticmethod
    def from_parents(
        parents: Sequence[int],
        active: Sequence[bool] | None = None,
        name: str = "tree",
        slots: Sequence[int] | None = None,
        limits: TreeLimits = DEFAULT_LIMITS,
        ranks: Sequence[int] | None = None,
    ) -> TreeTopology:
        """From logical parents (node 0 = root). ``slots`` overrides the spine-first row of each node;
        ``ranks`` the sibling ranks (default: logical order among siblings)."""
        parents = [int(p) for p in parents]
        check_parents(parents, limits)
        n = len(parents)
        act = [True] * n if active is None else [bool(a) for a in active]
        if len(act) != n:
            raise TreeError(f"active mask has {len(act)} entries for {n} nodes")
        if not act[0]:
            raise TreeError("the root must be active")
        for i, p in enumerate(parents[1:], 1):
            if act[i] and not act[p]:
                raise TreeError(f"node {i} is active under inactive parent {p}")
        rank = sibling_ranks(parents) if ranks is None else [int(r) for r in ranks]
        if slots is None:
            order = spine_first_order(parents, rank)
            row_of = [0] * n
            for r, node in enumerate(order):
                row_of[node] = r
        else:
            row_of = [int(s) for s in slots]
            if len(row_of) != n:
                raise TreeError(f"slot map has {len(row_of)} entries for {n} nodes")
            bad = [s for s in row_of if not 0 <= s < n]
            if bad:
                raise TreeError(f"slots {bad[:8]} out of range [0, {n})")
            if len(set(row_of)) != n:
                dup = sorted({s for s in row_of if row_of.count(s) > 1})
                raise TreeError(f"duplicate slots {dup[:8]}")
            if row_of[0] != 0:
                raise TreeError("the root must occupy slot 0")
        node_at = [0] * n
        for node, r in enumerate(row_of):
            node_at[r] = node
        routes: list[tuple[int, ...]] = [()] * n
        for i, p in enumerate(parents[1:], 1):
            routes[i] = routes[p] + (rank[i],)
        row_parents = [-1 if parents[node] < 0 else row_of[parents[node]] for node in node_at]
        for r, p in enumerate(row_parents):
            if p >= r:
                raise TreeError(f"slot map puts row {r} before its parent row {p}")
        return TreeTopology(
            name=name,
            parents=tuple(row_parents),
            default_active=tuple(act[node] for node in node_at),
            node_to_row=tuple(row_of),
            routes=tuple(routes[node] for node in node_at),
        )

    @staticmethod
    def from_paths(
        paths: Sequence[Sequence[int]],
        active: Sequence[bool] | None = None,
        name: str = "tree",
        limits: TreeLimits = DEFAULT_LIMITS,
    ) -> TreeTopology:
        """From routes of the draft nodes (the root is implicit node 0; ``paths[i]`` is node i + 1).

        A route lists sibling ranks from the root, e.g. [0, 2] = the third child of the top choice.
        ``active`` (if given) has one entry per draft node."""
        index: dict[tuple[int, ...], int] = {(): 0}
        parents = [-1]
        for i, route in enumerate(paths, 1):
            route = tuple(int(x) for x in route)
            if not route:
                raise TreeError(f"draft node {i - 1} has an empty route (only the root has one)")
            if route in index:
                raise TreeError(f"route {list(route)} appears twice")
            if route[:-1] not in index:
                raise TreeError(f"route {list(route)} comes before its parent route {list(route[:-1])}")
            index[route] = i
            parents.append(index[route[:-1]])
        if len(parents) > limits.max_nodes:
            raise TreeError(f"tree has {len(parents)} nodes; the limit is {limits.max_nodes}")
        act = None if active is None else [True, *active]
        if act is not None and len(act) != len(parents):
            raise TreeError(f"active mask has {len(act) - 1} entries for {len(paths)} draft nodes")
        ranks = [0] + [int(r[-1]) for r in paths]
        return TreeTopology.from_parents(parents, act, name=name, limits=limits, ranks=ranks)

    # -- derived views (computed once) ----------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.routes)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @property
    def spine(self) -> tuple[int, ...]:
        """Rows of the top-choice route (0, 1, ..., d): contiguous by construction when spine-first."""
        rows = [0]
        kids = self.children
        while kids[rows[-1]]:
            rows.append(min(kids[rows[-1]], key=lambda c: self.routes[c][-1]))
        return tuple(rows)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        if "children" not in self._cache:
            kids: list[list[int]] = [[] for _ in self.parents]
            for i, p in enumerate(self.parents[1:], 1):
                kids[p].append(i)
            self._cache["children"] = tuple(tuple(k) for k in kids)
        return self._cache["children"]  # type: ignore[no-any-return]

    @property
    def row_to_node(self) -> tuple[int, ...]:
        """Logical node of each row (inverse of ``node_to_row``)."""
        out = [0] * self.num_rows
        for node, r in enumerate(self.node_to_row):
            out[r] = node
        return tuple(out)

    @property
    def row_of_route(self) -> dict[tuple[int, ...], int]:
        if "route" not in self._cache:
            self._cache["route"] = {r: i for i, r in enumerate(self.routes)}
        return self._cache["route"]  # type: ignore[no-any-return]

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[N, N] bool: mask[i, j] = row j is row i or one of its ancestors (what row i may attend to)."""
        key = ("anc", str(torch.device(device)))
        if key not in self._cache:
            n = self.num_rows
            m = torch.zeros(n, n, dtype=torch.bool)
            for i, p in enumerate(self.parents):
                if p >= 0:
                    m[i] = m[p]
                m[i, i] = True
            self._cache[key] = m.to(device)
        return self._cache[key]  # type: ignore[no-any-return]

    @property
    def padded_rows(self) -> tuple[int, ...]:
        """Rows never sampled (whole subtrees, since an active row's parent is active): the verify forward
        skips them in the GDN scan and leaves their outputs zero."""
        return tuple(i for i, on in enumerate(self.default_active) if not on)

    def plan(self, mode: str = "auto", wy_max_rows: int = 0, scan_max_chain: int = 0) -> PathPlan | WyPlan:
        """The GDN verify plan of this tree, padded rows skipped (cached per topology): a scan's path plan,
        or the matrix-form verifier's tables (``tree_plan.plan_tree``)."""
        return plan_tree(self.parents, None, mode, self.padded_rows, wy_max_rows, scan_max_chain)

    def tensor(self, what: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """Cached device copies of ``parents`` (int64), ``depth`` (int64) or ``default_active`` (bool)."""
        key = (what, str(torch.device(device)))
        if key not in self._cache:
            dtype = torch.bool if what == "default_active" else torch.long
            self._cache[key] = torch.tensor(getattr(self, what), dtype=dtype, device=device)
        return self._cache[key]  # type: ignore[no-any-return]


@dataclass(frozen=True, eq=False)
class TreeDescriptor:
    """One step's draft tree for one sequence, in row order."""

    topology: TreeTopology
    token_ids: torch.Tensor
    """[N] int64 candidate token of each row (row 0 = the pending token); padded rows carry any id."""
    prefix_len: int
    """Tokens already committed to the state before the root: the root sits at this position."""
    active: tuple[bool, ...] | None = None
    """[N] rows entering sampling this step (None = the topology's default); a subset of the default."""

    def __post_init__(self) -> None:
        n = self.topology.num_rows
        if self.token_ids.shape != (n,):
            raise TreeError(f"token_ids has shape {tuple(self.token_ids.shape)}; the tree has {n} rows")
        if self.prefix_len < 0:
            raise TreeError(f"prefix_len must be >= 0, got {self.prefix_len}")
        if self.active is not None:
            act = self.active
            if len(act) != n or not act[0]:
                raise TreeError("active mask must cover every row and keep the root active")
            for i, p in enumerate(self.topology.parents[1:], 1):
                if act[i] and (not act[p] or not self.topology.default_active[i]):
                    raise TreeError(f"row {i} is active under an inactive parent or on a padded slot")

    @staticmethod
    def from_arrays(
        token_ids: torch.Tensor | Sequence[int],
        parents: Sequence[int],
        positions: Sequence[int],
        prefix_len: int,
        active: Sequence[bool] | None = None,
        slots: Sequence[int] | None = None,
        limits: TreeLimits = DEFAULT_LIMITS,
    ) -> TreeDescriptor:
        """From raw logical arrays (tokens, parents, positions per logical node): checks positions too."""
        topo = TreeTopology.from_parents(parents, active, name="custom", slots=slots, limits=limits)
        depth: list[int] = []
        for p in parents:
            depth.append(0 if p < 0 else depth[p] + 1)
        if len(positions) != len(parents):
            raise TreeError(f"{len(positions)} positions for {len(parents)} nodes")
        for i, (pos, d) in enumerate(zip(positions, depth, strict=True)):
            if pos != prefix_len + d:
                raise TreeError(f"node {i}: position {pos} != prefix_len {prefix_len} + depth {d}")
        toks = torch.as_tensor(token_ids, dtype=torch.long)
        rows = torch.tensor(topo.node_to_row, device=toks.device)
        out = torch.empty_like(toks)
        out[rows] = toks
        return TreeDescriptor(topo, out, prefix_len)

    @staticmethod
    def build(
        token_ids: torch.Tensor | Sequence[int],
        parents: Sequence[int],
        prefix_len: int,
        active: Sequence[bool] | None = None,
        device: torch.device | str | None = None,
    ) -> TreeDescriptor:
        """From a drafter's logical tree (node 0 = root = the pending token, parents first): the topology is
        cached per (parents, active) shape, tokens are placed in row order (they may stay on the device)."""
        topo = _topology(tuple(int(p) for p in parents), None if active is None else tuple(map(bool, active)))
        toks = torch.as_tensor(token_ids, dtype=torch.long)
        if device is not None:
            toks = toks.to(device)
        if topo.node_to_row != tuple(range(topo.num_rows)):
            toks = toks[torch.tensor(topo.row_to_node, device=toks.device)]
        return TreeDescriptor(topo, toks, prefix_len)

    @staticmethod
    def root(token: int, prefix_len: int, device: torch.device | str = "cpu") -> TreeDescriptor:
        """A bare root (AR): one row, no drafts."""
        return TreeDescriptor(
            chain(0), torch.tensor([int(token)], dtype=torch.long, device=device), prefix_len
        )

    @property
    def num_rows(self) -> int:
        return self.topology.num_rows

    @property
    def num_drafts(self) -> int:
        """Draft tokens offered for acceptance this step (active rows other than the root)."""
        return sum(self.active_mask[1:])

    @property
    def parents(self) -> tuple[int, ...]:
        return self.topology.parents

    @property
    def depth(self) -> tuple[int, ...]:
        return self.topology.depth

    @property
    def positions(self) -> list[int]:
        return [self.prefix_len + d for d in self.topology.depth]

    @property
    def active_mask(self) -> tuple[bool, ...]:
        return self.topology.default_active if self.active is None else self.active

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.topology.ancestor_mask(device)

    @property
    def plan(self) -> PathPlan | WyPlan:
        return self.topology.plan()

    @property
    def node_to_row(self) -> tuple[int, ...]:
        return self.topology.node_to_row


@lru_cache(maxsize=1024)
def _topology(parents: tuple[int, ...], active: tuple[bool, ...] | None) -> TreeTopology:
    return TreeTopology.from_parents(parents, active, name="drafted")


def chain(num_draft: int, name: str | None = None) -> TreeTopology:
    """A fanout-1 tree: the root plus ``num_draft`` chained drafts (MTP-k, EAGLE; AR = ``chain(0)``)."""
    return _chain(num_draft, name or f"chain{num_draft}")


@cache
def _chain(num_draft: int, name: str) -> TreeTopology:
    return TreeTopology.from_parents([-1, *range(num_draft)], name=name)


@cache
def load_builtin(name: str) -> TreeTopology:
    """A tree shipped in ``serving/trees/<name>.json`` (keys ``paths`` and optional ``active``)."""
    try:
        text = resources.files("lumotree.serving.trees").joinpath(f"{name}.json").read_text()
    except FileNotFoundError as e:
        raise TreeError(f"no built-in tree named {name!r}") from e
    spec = json.loads(text)
    return TreeTopology.from_paths(spec["paths"], spec.get("active"), name=spec.get("name", name))


def hydra27() -> TreeTopology:
    """The paper's fixed 32-row bucket: root + 31 slots, 27 active drafts (mask 0x7abdffff)."""
    return load_builtin("hydra27_fixed32")
