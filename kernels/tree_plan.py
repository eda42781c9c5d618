"""Path plans for the path-parallel GDN tree scan (Algorithm 2 of the LumoTree design).

A draft tree is cut into *paths* (chains of nodes, each node the parent of the next). A GPU program walks
one path for one (value head, value tile), carrying its state tile on chip from node to node. Paths are
grouped into *levels*: a level-1 path starts from a sequence's committed (pre-tree) state; a level-l path
(l > 1) starts from a *cut state* - the state after a node of an earlier level, exported to a buffer.

Decomposition rule (``mode="levels"``), applied recursively from every root:
  a path starting at node s follows the *heavy* child (deepest subtree, ties to the lowest row, which is the
  drafter's top choice) and stops at the **last branching node** of that route (or at the leaf if the route
  never branches). Every child of a path node that is not on the path starts a path one level later, and the
  state of its parent becomes a cut state. For hydra27_fixed32 this gives level 1 = root + spine to depth 4
  (5 nodes), level 2 = 11 branch paths of max length 7. A chain is a single level-1 path. Stopping at the
  last branch point keeps the level count minimal (every branch of a path is ready one level later) while
  moving the unbranched tail into the next level, where it runs in parallel with the other branches.

``mode="flat"`` instead runs every root-to-leaf route as a level-1 path from the committed state (shared
prefixes are recomputed; each node's output is written by exactly one path): one launch, no cut buffer.
Routes follow heavy children too; a route that branches off another starts over from the committed state
and recomputes their shared prefix without writing it.

``mode="side"`` is flat plus *side leaves*: a leaf child of a route's node is evaluated beside the route (the
node's state updated by the leaf and read for its output, then dropped) by the program that holds that
state anyway, up to ``SIDE_CAP`` per step. The scan is latency-bound and the state of one program per
route of hydra27 (11 routes x 48 heads x 16 [128, 8] fp32 tiles = 33 MB) fills the H200's register file,
so flat runs in two waves; its eight runner-up leaves ride along the spine instead, leaving 3 routes. A side
leaf runs the very node update its own route would, on the same parent state, so its output is bitwise
that of the flat plan.

``mode="sidecar"`` moves a route's side leaves onto a copy of the route's prefix up to its last side leaf
(recomputed, not written), so the long route itself runs the plain, cheaper node loop: the side updates
no longer lengthen the spine, which sets the launch's span. ``auto`` picks it for hydra27.

``mode="split"`` is sidecar as two launches, the plain routes and the sidecars, which the scan runs on two
CUDA streams at once: the plain kernel then needs no side registers (96 instead of 168 per thread with one
tile), so more of its programs fit the GPU at a time.

Everything here is host-side bookkeeping over small integer lists; results are cached per topology, and the
device copies are cached per device so a fixed tree costs no host work after the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

PLAN_MODES = ("levels", "flat", "side", "sidecar", "split", "auto")
SIDE_CAP = 2
"""Side leaves per route step (hydra27 has two runner-ups per depth; the scan kernel has two slots); more
become routes of their own."""


@dataclass(frozen=True)
class LevelPlan:
    """One launch of the scan: ``P`` independent paths, padded to ``max_len`` nodes.

    nodes [P, L] int32: global row of the t-th node of path p (-1 past the path's end).
    lens [P] int32: number of nodes of each path.
    start [P] int32: ``>= 0`` a cut-buffer slot to start from; ``< 0`` the committed state of sequence
        ``-start - 1``.
    write [P, L] int32: 1 where this path writes the node's output (each row is written exactly once).
    cut [P, L] int32: cut-buffer slot receiving the state after the node, or -1.
    side [P, L, S] int32 or None (side plans only): rows of leaf children evaluated from the state after
        the t-th node (-1 = empty slot); each is written by this path.
    sided [P] int32 or None (with ``side``): 1 for paths with side slots in use; the others run without.
    has_cut: whether any node exports a cut state (None: read from ``cut``, which must then be on the host);
        the kernel compiles the export out when none does (flat and side plans, a last level).
    """

    nodes: torch.Tensor
    lens: torch.Tensor
    start: torch.Tensor
    write: torch.Tensor
    cut: torch.Tensor
    side: torch.Tensor | None = None
    sided: torch.Tensor | None = None
    has_cut: bool | None = None

    def __post_init__(self) -> None:
        P, L = self.nodes.shape
        assert self.lens.shape == self.start.shape == (P,) and self.write.shape == self.cut.shape == (P, L)
        assert (self.side is None) == (self.sided is None)
        assert self.side is None or (self.side.shape[:2] == (P, L) and self.sided.shape == (P,))  # type: ignore[union-attr]
        if self.has_cut is None:
            assert self.cut.device.type == "cpu", "has_cut must be given for a plan built on a device"
            object.__setattr__(self, "has_cut", bool((self.cut >= 0).any()))

    @property
    def num_paths(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.nodes.shape[1])

    @property
    def num_side(self) -> int:
        """Side-leaf slots per step (0: none)."""
        return 0 if self.side is None else int(self.side.shape[2])

    def to(self, device: torch.device | str) -> LevelPlan:
        nodes, lens, start, write, cut = (
            t.to(device) for t in (self.nodes, self.lens, self.start, self.write, self.cut)
        )
        side = None if self.side is None else self.side.to(device)
        sided = None if self.sided is None else self.sided.to(device)
        return LevelPlan(nodes, lens, start, write, cut, side, sided, self.has_cut)


@dataclass(frozen=True)
class PathPlan:
    """Levels of dependent path groups for a packed batch of trees.

    num_rows: rows R of the packed batch; num_seqs: sequences (one committed state each);
    num_cut: cut-buffer slots needed (states exported by one level and read by a later one);
    paths: host copy of the paths, ``paths[level][p] = (start, (rows...))`` for inspection and tests.
    """

    mode: str
    num_rows: int
    num_seqs: int
    num_cut: int
    levels: tuple[LevelPlan, ...]
    paths: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    independent: bool = False
    """The levels read only committed states (no cut buffer between them), so they may run concurrently."""
    skipped: tuple[int, ...] = ()
    """Rows no path computes (``plan_paths(skip=...)``); the first launch writes zeros there."""
    _device_cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def path_counts(self) -> tuple[int, ...]:
        return tuple(lv.num_paths for lv in self.levels)

    @property
    def path_lengths(self) -> tuple[int, ...]:
        """Node updates along every path, all levels (without side leaves)."""
        return tuple(len(rows) for lv in self.paths for _, rows in lv)

    @property
    def updates(self) -> int:
        """Node updates of the whole scan per value tile: path steps plus side leaves."""
        sides = sum(int((lv.side >= 0).sum()) for lv in self.levels if lv.side is not None)
        return sum(self.path_lengths) + sides

    @property
    def max_lengths(self) -> tuple[int, ...]:
        return tuple(lv.max_len for lv in self.levels)

    def cut_buffer_bytes(self, num_v_heads: int, k_dim: int, v_dim: int) -> int:
        """Size of the fp32 cut-state buffer: 4 * N_cut * Hv * K * V bytes (reused across layers)."""
        return 4 * self.num_cut * num_v_heads * k_dim * v_dim

    def on(self, device: torch.device | str) -> tuple[LevelPlan, ...]:
        """The level tensors on ``device``, copied once per device and kept."""
        key = str(torch.device(device))
        if key not in self._device_cache:
            self._device_cache[key] = tuple(lv.to(device) for lv in self.levels)
        return self._device_cache[key]  # type: ignore[no-any-return]

    def zero_rows(self, device: torch.device | str) -> torch.Tensor | None:
        """``skipped`` as int32 on ``device`` (None when nothing is skipped), kept."""
        key = (str(torch.device(device)), "zero")
        if key not in self._device_cache:
            rows = torch.tensor(self.skipped, dtype=torch.int32, device=device) if self.skipped else None
            self._device_cache[key] = rows
        return self._device_cache[key]  # type: ignore[no-any-return]

    def groups(self, pack: float, device: torch.device | str) -> tuple[torch.Tensor | None, ...]:
        """Per level, the paths each program walks back to back ([G, M] int32 path indices, -1 = none; None
        = one path per program), from ``pack_paths`` over the paths' node updates; kept per device."""
        key = (str(torch.device(device)), "groups", pack)
        if key not in self._device_cache:
            out = []
            for lv in self.levels:
                cost = lv.lens.tolist()
                if lv.side is not None:
                    cost = [
                        c + int(n) for c, n in zip(cost, (lv.side >= 0).sum((1, 2)).tolist(), strict=True)
                    ]
                grouped = pack_paths(cost, pack)
                out.append(None if grouped is None else _pad(grouped, max(map(len, grouped)), -1).to(device))
            self._device_cache[key] = tuple(out)
        return self._device_cache[key]  # type: ignore[no-any-return]


def pack_paths(cost: Sequence[int], pack: float) -> list[list[int]] | None:
    """Group paths into programs that walk them back to back, each program's node updates at most about
    ``pack`` times the longest path's (None: one path per program, when ``pack`` <= 0 or nothing packs).

    A launch of P paths runs P x heads x tiles programs; when that overflows what the GPU holds at once, the
    short paths wait for a second wave behind the long ones and the launch's span is the sum of both waves.
    Walking short paths after one another in fewer programs keeps the work and shortens the span: for
    hydra27's sidecar plan (paths of 13, 12, 6 and 4 updates) two programs of 17 and 18 updates per
    (head, tile) instead of four. The group count is first-fit decreasing under the cap, the grouping
    longest-first onto the least loaded group (balanced), heaviest group first."""
    if pack <= 0 or len(cost) < 2:
        return None
    order = sorted(range(len(cost)), key=lambda i: (-cost[i], i))
    cap = pack * max(cost)
    bins: list[int] = []
    for i in order:
        j = next((j for j, b in enumerate(bins) if b + cost[i] <= cap), None)
        if j is None:
            bins.append(cost[i])
        else:
            bins[j] += cost[i]
    if len(bins) == len(cost):
        return None
    load = [0] * len(bins)
    groups: list[list[int]] = [[] for _ in bins]
    for i in order:
        j = min(range(len(load)), key=lambda j: (load[j], j))
        groups[j].append(i)
        load[j] += cost[i]
    return sorted(groups, key=lambda g: (-sum(cost[i] for i in g), g))


def _children(parents: Sequence[int], skip: frozenset[int] = frozenset()) -> list[list[int]]:
    """Children of every row, skipped rows left out (so no path reaches them)."""
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0 and i not in skip:
            kids[p].append(i)
    return kids


def _check_forest(parents: Sequence[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"row {i}: parent {p} must be -1 or an earlier row (parents before children)")


def _global_parents(parents: Sequence[int], cu_seqlens: Sequence[int]) -> tuple[list[int], list[int]]:
    """Local parents (-1 = committed state) to global rows, plus each row's sequence."""
    if (
        cu_seqlens[0] != 0
        or cu_seqlens[-1] != len(parents)
        or any(a > b for a, b in zip(cu_seqlens, cu_seqlens[1:], strict=False))
    ):
        raise ValueError(f"cu_seqlens {list(cu_seqlens)} do not cover {len(parents)} rows")
    gp: list[int] = []
    seq: list[int] = []
    for s in range(len(cu_seqlens) - 1):
        bos, eos = cu_seqlens[s], cu_seqlens[s + 1]
        local = list(parents[bos:eos])
        _check_forest(local)
        gp += [p + bos if p >= 0 else -1 for p in local]
        seq += [s] * (eos - bos)
    return gp, seq


def _heavy(parents: list[int], skip: frozenset[int]) -> tuple[list[list[int]], list[int]]:
    """Children of every row and its heavy child (deepest subtree, ties to the lowest row, which is the
    drafter's top choice; -1 for a leaf), skipped rows left out."""
    kids = _children(parents, skip)
    height = [1] * len(parents)
    heavy = [-1] * len(parents)
    for i in reversed(range(len(parents))):
        if kids[i]:
            heavy[i] = max(kids[i], key=lambda c: (height[c], -c))
            height[i] = 1 + height[heavy[i]]
    return kids, heavy


def _route(heavy: list[int], s: int) -> list[int]:
    route = [s]
    while heavy[route[-1]] >= 0:
        route.append(heavy[route[-1]])
    return route


def _decompose_levels(parents: list[int], skip: frozenset[int]) -> list[list[tuple[int, list[int]]]]:
    """Paths per level as (start row, rows); start row's parent state is where the path starts."""
    kids, heavy = _heavy(parents, skip)
    levels: list[list[tuple[int, list[int]]]] = []
    frontier = [i for i, p in enumerate(parents) if p < 0]
    while frontier:
        level: list[tuple[int, list[int]]] = []
        nxt: list[int] = []
        for s in frontier:
            route = _route(heavy, s)
            branch_at = [j for j, n in enumerate(route) if len(kids[n]) > 1]
            path = route[: branch_at[-1] + 1] if branch_at else route
            on_path = set(path)
            for n in path:
                nxt += [c for c in kids[n] if c not in on_path]
            level.append((s, path))
        levels.append(level)
        frontier = nxt
    return levels


Route = tuple[list[int], int, list[list[int]]]
"""(rows, prefix length not written, side leaves per step)."""


def _decompose_routes(parents: list[int], skip: frozenset[int], side_cap: int, sidecar: bool) -> list[Route]:
    """Flat routes from the committed state as (rows, prefix length not written, side leaves per step)."""
    kids, heavy = _heavy(parents, skip)
    routes: list[Route] = []
    todo: list[tuple[list[int], int]] = [
        ([], i) for i, p in enumerate(parents) if p < 0
    ]  # (prefix, first row)
    while todo:
        prefix, s = todo.pop()
        route = prefix + _route(heavy, s)
        sides: list[list[int]] = [[] for _ in route]
        routes.append((route, len(prefix), sides))
        for j in range(len(prefix), len(route)):
            for c in kids[route[j]]:
                if c == heavy[route[j]]:
                    continue
                if not kids[c] and len(sides[j]) < side_cap:
                    sides[j].append(c)
                else:
                    todo.append((route[: j + 1], c))
    if sidecar:
        for i, (route, k, sides) in enumerate(list(routes)):
            used = [j for j, x in enumerate(sides) if x]
            if used:
                routes[i] = (route, k, [[] for _ in route])
                routes.append((route[: used[-1] + 1], used[-1] + 1, sides[: used[-1] + 1]))
    return routes


def _launch_order(routes: list[Route]) -> list[Route]:
    """Most node updates first (path steps plus side leaves): the GPU dispatches a launch's programs in
    order, so the longest ones start at once and set the span (a sidecar of 5 steps and 8 leaves before the
    12-step spine of hydra27: 0.96 against 1.01 ms per 48 layers on the H200)."""
    return sorted(routes, key=lambda r: (-(len(r[0]) + sum(len(x) for x in r[2])), r[0]))


def _routes_level(routes: list[Route], seq: list[int]) -> LevelPlan:
    """One launch over flat routes (in ``_launch_order``) with their side leaves."""
    routes = _launch_order(routes)
    width = max(len(r) for r, _, _ in routes)
    slots = max(len(x) for _, _, sd in routes for x in sd)
    side = [
        [x + [-1] * (slots - len(x)) for x in sd] + [[-1] * slots] * (width - len(sd)) for _, _, sd in routes
    ]
    return LevelPlan(
        nodes=_pad([r for r, _, _ in routes], width, -1),
        lens=torch.tensor([len(r) for r, _, _ in routes], dtype=torch.int32),
        start=torch.tensor([-seq[r[0]] - 1 for r, _, _ in routes], dtype=torch.int32),
        write=_pad([[0] * k + [1] * (len(r) - k) for r, k, _ in routes], width, 0),
        cut=torch.full((len(routes), width), -1, dtype=torch.int32),
        side=None if slots == 0 else torch.tensor(side, dtype=torch.int32),
        sided=None if slots == 0 else torch.tensor([int(any(sd)) for _, _, sd in routes], dtype=torch.int32),
        has_cut=False,
    )


def _routes_plan(gp: list[int], seq: list[int], num_seqs: int, mode: str, skip: frozenset[int]) -> PathPlan:
    """Flat routes from the committed state: one launch, or for ``split`` the plain routes and the sidecars
    as two launches that depend on nothing but the committed state."""
    routes = _decompose_routes(
        gp, skip, 0 if mode == "flat" else SIDE_CAP, sidecar=mode in ("sidecar", "split")
    )
    written = sorted(
        [n for r, k, _ in routes for n in r[k:]] + [n for _, _, sd in routes for x in sd for n in x]
    )
    assert written == _live(gp, skip), "every row not skipped must be written by exactly one path"
    groups = [routes]
    if mode == "split":
        groups = [g for g in ([r for r in routes if not any(r[2])], [r for r in routes if any(r[2])]) if g]
    levels = tuple(_routes_level(g, seq) for g in groups)
    host = tuple(tuple((-seq[r[0]] - 1, tuple(r)) for r, _, _ in _launch_order(g)) for g in groups)
    return PathPlan(mode=mode, num_rows=len(gp), num_seqs=num_seqs, num_cut=0, levels=levels, paths=host,
                    independent=mode == "split", skipped=tuple(sorted(skip)))  # fmt: skip


def _live(gp: list[int], skip: frozenset[int]) -> list[int]:
    return [r for r in range(len(gp)) if r not in skip]


def _check_skip(gp: list[int], skip: frozenset[int]) -> None:
    """Skipped rows must be whole subtrees below a root: no path may need a skipped row's state."""
    for r in sorted(skip):
        if not 0 <= r < len(gp):
            raise ValueError(f"skipped row {r} is outside the batch's {len(gp)} rows")
        if gp[r] < 0:
            raise ValueError(f"row {r} is a tree's root and cannot be skipped")
    for i, p in enumerate(gp):
        if p in skip and i not in skip:
            raise ValueError(f"row {i} is computed but its parent {p} is skipped")


def _pad(rows: list[list[int]], width: int, fill: int) -> torch.Tensor:
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.int32).reshape(-1, width)


@lru_cache(maxsize=512)
def _plan_cached(
    parents: tuple[int, ...], cu_seqlens: tuple[int, ...], mode: str, skip: frozenset[int]
) -> PathPlan:
    gp, seq = _global_parents(parents, cu_seqlens)
    _check_skip(gp, skip)
    if mode != "levels":
        return _routes_plan(gp, seq, len(cu_seqlens) - 1, mode, skip)
    raw = _decompose_levels(gp, skip)
    # A node's state is exported iff a later-level path starts at one of its children.
    cut_nodes = sorted({gp[s] for lv in raw[1:] for s, _ in lv})
    cut_slot = {n: i for i, n in enumerate(cut_nodes)}
    written: set[int] = set()
    levels = []
    host_paths = []
    for lv in raw:
        lv = sorted(lv, key=lambda sp: -len(sp[1]))  # long programs first: they set the level's span
        width = max(len(p) for _, p in lv)
        starts, writes, cuts = [], [], []
        for s, path in lv:
            parent = gp[s]
            starts.append(cut_slot[parent] if parent >= 0 else -seq[s] - 1)
            writes.append([int(n not in written) for n in path])
            written.update(path)
            cuts.append([cut_slot.get(n, -1) for n in path])
        levels.append(
            LevelPlan(
                nodes=_pad([p for _, p in lv], width, -1),
                lens=torch.tensor([len(p) for _, p in lv], dtype=torch.int32),
                start=torch.tensor(starts, dtype=torch.int32),
                write=_pad(writes, width, 0),
                cut=_pad(cuts, width, -1),
            )
        )
        host_paths.append(tuple((st, tuple(p)) for st, (_, p) in zip(starts, lv, strict=True)))
    assert written == set(_live(gp, skip)), "every row not skipped must be covered by a path"
    return PathPlan(
        mode=mode,
        num_rows=len(gp),
        num_seqs=len(cu_seqlens) - 1,
        num_cut=len(cut_nodes),
        levels=tuple(levels),
        paths=tuple(host_paths),
        skipped=tuple(sorted(skip)),
    )


def plan_paths(
    parents: Sequence[int] | torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    mode: str = "levels",
    skip: Sequence[int] = (),
) -> PathPlan:
    """Plan the scan of a packed batch of trees.

    parents [R]: parent row *local to its sequence*, -1 = the sequence's committed state; every sequence's
        rows are ordered parents before children. A tensor is read on the host (a device sync), so hot
        paths should pass host lists or reuse the plan of their tree descriptor.
    cu_seqlens [S+1]: row ranges per sequence (None = one sequence).
    mode: "levels" (Algorithm 2, cut states between levels), "flat" (root-to-leaf paths, one launch),
        "side" (flat with leaves evaluated beside their parent's route), "sidecar" (those leaves on a
        recomputed copy of the route's prefix), "split" (sidecar as two concurrent launches) or "auto"
        (sidecar unless its recomputed prefixes more than double the node updates, else levels).
    skip: global rows whose outputs nobody reads (a tree's padded slots): no path computes them and the
        scan writes zeros there. Their subtrees must be skipped too, and no root.
    """
    if mode == "auto":
        car = plan_paths(parents, cu_seqlens, "sidecar", skip)
        # Recomputing shared prefixes costs node updates but saves a launch and the cut-state round trip
        # per level: one launch wins for hydra27 (39 updates for 32 rows; on the H200 sidecar 1.02 ms, side
        # 1.18, levels 1.31, flat 1.37 over 48 layers), not for bushy trees.
        return car if car.updates <= 2 * car.num_rows else plan_paths(parents, cu_seqlens, "levels", skip)
    if mode not in PLAN_MODES:
        raise ValueError(f"unknown plan mode {mode!r}; choose one of {PLAN_MODES}")
    p, cu = _host_tree(parents, cu_seqlens)
    return _plan_cached(p, cu, mode, frozenset(int(r) for r in skip))


def _host_tree(
    parents: Sequence[int] | torch.Tensor, cu_seqlens: Sequence[int] | torch.Tensor | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Parents and row ranges as host tuples (the cache keys), one sequence when ``cu_seqlens`` is None."""
    p = tuple(int(x) for x in (parents.tolist() if isinstance(parents, torch.Tensor) else parents))
    if not p:
        raise ValueError("empty tree")
    if cu_seqlens is None:
        return p, (0, len(p))
    cu = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens
    return p, tuple(int(x) for x in cu)


def plan_tree(
    parents: Sequence[int] | torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    mode: str = "auto",
    skip: Sequence[int] = (),
    wy_max_rows: int = 0,
    scan_max_chain: int = 0,
) -> PathPlan | WyPlan:
    """The verify plan of a packed batch of trees for a ``TreeScanConfig.plan_mode``: the matrix-form
    verifier's tables for ``wy``, and for ``auto`` when no sequence has more than ``wy_max_rows`` rows,
    unless every sequence is a chain of at most ``scan_max_chain`` rows (the scan walks each as one route);
    otherwise a scan's path plan (``plan_paths``). Arguments as ``plan_paths``."""
    p, cu = _host_tree(parents, cu_seqlens)
    if mode == "auto" and _auto_wy(p, cu, wy_max_rows, scan_max_chain):
        mode = "wy"
    return plan_wy(p, cu, skip) if mode == "wy" else plan_paths(p, cu, mode, skip)


@lru_cache(maxsize=256)
def _auto_wy(p: tuple[int, ...], cu: tuple[int, ...], wy_max_rows: int, scan_max_chain: int) -> bool:
    gp, seq = _global_parents(p, cu)  # validates
    longest = max(b - a for a, b in zip(cu[:-1], cu[1:], strict=True))
    chains = longest <= scan_max_chain and all(par == r - 1 for r, par in enumerate(gp) if r != cu[seq[r]])
    return longest <= wy_max_rows and not chains


# ------------------------------------------------- tables of the matrix-form verifier (kernels.tree_wy)

MAX_ROWS = 64
"""Rows per tree: a row's ancestors are one int64 bit mask."""


@dataclass(frozen=True)
class WyPlan:
    """The per-slot tables of one packed batch of trees (host lists; device copies cached per device).

    A *group* is what one program (per value tile and head) verifies: a sequence's whole tree, or, in a
    plan made by ``grouped``, a set of its rows closed under ancestors. A *slot* is a row's place in its
    group; in a plan with one group per sequence, slot i is row i."""

    cu: tuple[int, ...]
    """Slot ranges per group."""
    anc: tuple[int, ...]
    """Per slot: bit j set when slot j of its group is the slot's row itself or one of its ancestors."""
    keep: tuple[int, ...]
    """Per slot: 1 = output written, 0 = a skipped (padded) row, written as zeros, -1 = not written (a row
    another group writes)."""
    depth: int
    """Largest node depth (edges from its sequence's first node); sets the number of squarings."""
    rows: tuple[int, ...] = ()
    """``grouped`` plans: the operand row of each slot (empty: slot i is row i, one group per sequence)."""
    seq: tuple[int, ...] = ()
    """``grouped`` plans: the sequence (state index) of each group."""
    zero: tuple[int, ...] = ()
    """``grouped`` plans: per group, ``zero_width`` skipped rows it writes as zeros (-1 = none)."""
    total_rows: int = 0
    """``grouped`` plans: operand rows of the batch (skipped rows have no slot)."""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)
    """Device copies of the tables and grouped plans, made once."""

    mode = "wy"
    """The ``TreeScanConfig.plan_mode`` that serves this plan."""

    @property
    def path_counts(self) -> tuple[int, ...]:
        """No paths: every node at once."""
        return ()

    @property
    def num_rows(self) -> int:
        return self.total_rows if self.rows else self.cu[-1]

    def cut_buffer_bytes(self, num_v_heads: int, k_dim: int, v_dim: int) -> int:
        """No cut states: every node reads only its sequence's committed state."""
        return 0

    @property
    def num_groups(self) -> int:
        return len(self.cu) - 1

    @property
    def num_seqs(self) -> int:
        return max(self.seq) + 1 if self.seq else self.num_groups

    @property
    def zero_width(self) -> int:
        return len(self.zero) // self.num_groups

    @property
    def block_t(self) -> int:
        """Slots per program: the largest group as a power of two, at least 16 (the dot's minimum)."""
        widest = max(b - a for a, b in zip(self.cu, self.cu[1:], strict=False))
        return max(16, 1 << (widest - 1).bit_length())

    @property
    def squarings(self) -> int:
        """s with 2^(s+1) > depth: (I - A)(I + A^2)...(I + A^(2^s)) is the exact inverse of I + A."""
        s = 0
        while 2 ** (s + 1) <= self.depth:
            s += 1
        return s

    def grouped(self, cap: int) -> WyPlan:
        """This plan with each tree cut into groups of at most ``cap`` rows closed under ancestors
        (``group_rows``), or this plan itself where that does not shrink a program's block of rows."""
        key = ("grouped", cap)
        if key not in self._cache:
            self._cache[key] = _group_rows(self, cap)
        return self._cache[key]  # type: ignore[no-any-return]

    def on(self, device: torch.device | str) -> tuple[torch.Tensor, ...]:
        """(cu int32, anc int64, keep int8, rows int32, seq int32, zero int32) on ``device``, made once (so
        CUDA-graph capture finds them); the last three are ``cu`` again in a plan without groups."""
        key = str(device)
        if key not in self._cache:
            # bit 63 as a signed int64 (a 64-row tree's last row)
            anc = [a - (1 << 64) if a >= 1 << 63 else a for a in self.anc]
            cu = torch.tensor(self.cu, dtype=torch.int32, device=device)
            tables = [torch.tensor(x, dtype=torch.int32, device=device) if x else cu
                      for x in (self.rows, self.seq, self.zero)]  # fmt: skip
            self._cache[key] = (
                cu,
                torch.tensor(anc, dtype=torch.int64, device=device),
                torch.tensor(self.keep, dtype=torch.int8, device=device),
                *tables,
            )
        return self._cache[key]  # type: ignore[no-any-return]


def _bits(mask: int) -> list[int]:
    """The indices of the set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _group_rows(plan: WyPlan, cap: int) -> WyPlan:
    """First-fit decreasing over each tree's root-to-leaf paths (its live leaves' ancestor sets, longest
    first): a path joins the first group it fits, so shared prefixes are computed once per group that holds
    them; each row is written by the first group holding it, each skipped row zeroed by one group."""
    if plan.rows or plan.block_t <= cap:
        return plan
    cu, anc, keep, rows, seq, zeros = [0], [], [], [], [], []
    for s, (a, b) in enumerate(zip(plan.cu, plan.cu[1:], strict=False)):
        live = [r for r in range(a, b) if plan.keep[r]]
        inner = 0  # strict ancestors of live rows
        for r in live:
            inner |= plan.anc[r] & ~(1 << (r - a))
        paths = sorted(
            (plan.anc[r] for r in live if not inner >> (r - a) & 1), key=int.bit_count, reverse=True
        )
        if any(p.bit_count() > cap for p in paths):
            return plan  # a path longer than a group: no cut
        groups: list[int] = []  # member bit masks
        for p in paths:
            fit = next((i for i, m in enumerate(groups) if (m | p).bit_count() <= cap), None)
            if fit is None:
                groups.append(p)
            else:
                groups[fit] |= p
        groups = groups or [0]  # a tree with every row skipped: one group to zero them
        skipped = [r for r in range(a, b) if not plan.keep[r]]
        written = 0
        for gi, members in enumerate(groups):
            slots = [j for j in range(b - a) if members >> j & 1]  # ascending: parents before children
            slot_of = {j: i for i, j in enumerate(slots)}
            for j in slots:
                anc.append(sum(1 << slot_of[jj] for jj in _bits(plan.anc[a + j])))
                keep.append(-1 if written >> j & 1 else 1)
                rows.append(a + j)
            written |= members
            cu.append(len(rows))
            seq.append(s)
            zeros.append(skipped[gi :: len(groups)])
    width = max(map(len, zeros))
    width = 1 << (width - 1).bit_length() if width else 0
    zero = tuple(r for z in zeros for r in z + [-1] * (width - len(z)))
    return WyPlan(
        tuple(cu), tuple(anc), tuple(keep), plan.depth, tuple(rows), tuple(seq), zero, plan.num_rows
    )


def plan_wy(
    parents: Sequence[int] | torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    skip: Sequence[int] = (),
) -> WyPlan:
    """The tables of a packed batch of trees (parents local to each sequence, as ``tree_plan.plan_paths``);
    cached per topology. ``skip``: global rows written as zeros (their subtrees must be skipped too)."""
    p, cu = _host_tree(parents, cu_seqlens)
    return _wy_cached(p, cu, frozenset(int(r) for r in skip))


@lru_cache(maxsize=256)
def _wy_cached(parents: tuple[int, ...], cu: tuple[int, ...], skip: frozenset[int]) -> WyPlan:
    gp, seq = _global_parents(parents, cu)  # validates every sequence's forest
    if any(not 0 <= r < len(gp) for r in skip):
        raise ValueError(f"skip rows {sorted(skip)} out of range for {len(gp)} rows")
    anc: list[int] = []
    depth: list[int] = []
    for r, par in enumerate(gp):
        bos = cu[seq[r]]
        if r - bos >= MAX_ROWS:
            raise ValueError(f"a tree of more than {MAX_ROWS} rows (sequence {seq[r]})")
        if par >= 0 and par in skip and r not in skip:
            raise ValueError(f"row {r} is kept but its parent {par} is skipped")
        anc.append((anc[par] if par >= 0 else 0) | 1 << (r - bos))
        depth.append(depth[par] + 1 if par >= 0 else 0)
    keep = tuple(0 if r in skip else 1 for r in range(len(gp)))
    return WyPlan(cu, tuple(anc), keep, max(depth))
