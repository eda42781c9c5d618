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

``mode="packed"`` runs the flat routes with several short ones back to back in one program (first-fit
decreasing into programs no longer than the longest route; the state is reloaded from the committed state
where a route begins). The scan is latency-bound and one program per route overflows the GPU's resident
program slots at hydra27's size (11 routes x 48 heads x 8 tile pairs = 4,224 one-warp programs), so the flat
launch runs in two waves; packing the 11 routes into 6 programs fits one.

Everything here is host-side bookkeeping over small integer lists; results are cached per topology, and the
device copies are cached per device so a fixed tree costs no host work after the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

PLAN_MODES = ("levels", "flat", "packed", "auto")


@dataclass(frozen=True)
class LevelPlan:
    """One launch of the scan: ``P`` independent paths, padded to ``max_len`` nodes.

    nodes [P, L] int32: global row of the t-th node of path p (-1 past the path's end).
    lens [P] int32: number of nodes of each path.
    start [P] int32: ``>= 0`` a cut-buffer slot to start from; ``< 0`` the committed state of sequence
        ``-start - 1``.
    write [P, L] int32: 1 where this path writes the node's output (each row is written exactly once).
    cut [P, L] int32: cut-buffer slot receiving the state after the node, or -1.
    reload [P, L] int32 or None (packed plans only): ``< 0`` where a new route begins at that step, reloading
        the committed state of sequence ``-reload - 1``; 0 elsewhere (step 0 always starts from ``start``).
    has_cut: whether any node exports a cut state (None: read from ``cut``, which must then be on the host);
        the kernel compiles the export out when none does (flat and packed plans, a last level).
    """

    nodes: torch.Tensor
    lens: torch.Tensor
    start: torch.Tensor
    write: torch.Tensor
    cut: torch.Tensor
    reload: torch.Tensor | None = None
    has_cut: bool | None = None

    def __post_init__(self) -> None:
        if self.has_cut is None:
            assert self.cut.device.type == "cpu", "has_cut must be given for a plan built on a device"
            object.__setattr__(self, "has_cut", bool((self.cut >= 0).any()))

    @property
    def num_paths(self) -> int:
        return int(self.nodes.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.nodes.shape[1])

    def to(self, device: torch.device | str) -> LevelPlan:
        nodes, lens, start, write, cut = (
            t.to(device) for t in (self.nodes, self.lens, self.start, self.write, self.cut)
        )
        reload = None if self.reload is None else self.reload.to(device)
        return LevelPlan(nodes, lens, start, write, cut, reload, self.has_cut)


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
    _device_cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def path_counts(self) -> tuple[int, ...]:
        return tuple(lv.num_paths for lv in self.levels)

    @property
    def path_lengths(self) -> tuple[int, ...]:
        """Node updates of every path, all levels (the scan's work per value tile)."""
        return tuple(len(rows) for lv in self.paths for _, rows in lv)

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
        return self._device_cache[key]


def _children(parents: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
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


def _decompose_levels(parents: list[int]) -> list[list[tuple[int, list[int]]]]:
    """Paths per level as (start row, rows); start row's parent state is where the path starts."""
    kids = _children(parents)
    height = [1] * len(parents)
    for i in reversed(range(len(parents))):
        if kids[i]:
            height[i] = 1 + max(height[c] for c in kids[i])

    def heavy(n: int) -> int:
        return max(kids[n], key=lambda c: (height[c], -c))

    levels: list[list[tuple[int, list[int]]]] = []
    frontier = [i for i, p in enumerate(parents) if p < 0]
    while frontier:
        level: list[tuple[int, list[int]]] = []
        nxt: list[int] = []
        for s in frontier:
            route = [s]
            while kids[route[-1]]:
                route.append(heavy(route[-1]))
            branch_at = [j for j, n in enumerate(route) if len(kids[n]) > 1]
            path = route[: branch_at[-1] + 1] if branch_at else route
            on_path = set(path)
            for n in path:
                nxt += [c for c in kids[n] if c not in on_path]
            level.append((s, path))
        levels.append(level)
        frontier = nxt
    return levels


def _decompose_flat(parents: list[int]) -> list[list[tuple[int, list[int]]]]:
    kids = _children(parents)
    paths = []
    for leaf in (i for i in range(len(parents)) if not kids[i]):
        route = [leaf]
        while parents[route[-1]] >= 0:
            route.append(parents[route[-1]])
        route.reverse()
        paths.append((route[0], route))
    paths.sort(key=lambda sp: (-len(sp[1]), sp[1]))
    return [paths]


def _packed_plan(
    gp: list[int], seq: list[int], routes: list[tuple[int, list[int]]], num_seqs: int
) -> PathPlan:
    """Flat routes (longest first) packed first-fit into programs of at most the longest route's length."""
    cap = max(len(r) for _, r in routes)
    programs: list[list[tuple[int, list[int]]]] = []
    for s, route in routes:
        home = next((pr for pr in programs if sum(len(r) for _, r in pr) + len(route) <= cap), None)
        if home is None:
            programs.append([(s, route)])
        else:
            home.append((s, route))
    written: set[int] = set()
    nodes, writes, reloads, starts, host = [], [], [], [], []
    for pr in programs:
        row_list, w, rl = [], [], []
        for j, (s, route) in enumerate(pr):
            committed = -seq[s] - 1
            rl += [committed if j > 0 else 0] + [0] * (len(route) - 1)
            w += [int(n not in written) for n in route]
            written.update(route)
            row_list += route
        nodes.append(row_list)
        writes.append(w)
        reloads.append(rl)
        starts.append(-seq[pr[0][0]] - 1)
        host.append((starts[-1], tuple(row_list)))
    assert written == set(range(len(gp))), "every row must be covered by a path"
    width = max(len(n) for n in nodes)
    level = LevelPlan(
        nodes=_pad(nodes, width, -1),
        lens=torch.tensor([len(n) for n in nodes], dtype=torch.int32),
        start=torch.tensor(starts, dtype=torch.int32),
        write=_pad(writes, width, 0),
        cut=_pad([[-1] * len(n) for n in nodes], width, -1),
        reload=_pad(reloads, width, 0),
    )
    return PathPlan(mode="packed", num_rows=len(gp), num_seqs=num_seqs, num_cut=0, levels=(level,),
                    paths=(tuple(host),))  # fmt: skip


def _pad(rows: list[list[int]], width: int, fill: int) -> torch.Tensor:
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.int32).reshape(-1, width)


@lru_cache(maxsize=512)
def _plan_cached(parents: tuple[int, ...], cu_seqlens: tuple[int, ...], mode: str) -> PathPlan:
    gp, seq = _global_parents(parents, cu_seqlens)
    raw = _decompose_levels(gp) if mode == "levels" else _decompose_flat(gp)
    if mode == "packed":
        return _packed_plan(gp, seq, raw[0], len(cu_seqlens) - 1)
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
            cuts.append([cut_slot.get(n, -1) if mode == "levels" else -1 for n in path])
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
    assert written == set(range(len(gp))), "every row must be covered by a path"
    return PathPlan(
        mode=mode,
        num_rows=len(gp),
        num_seqs=len(cu_seqlens) - 1,
        num_cut=len(cut_nodes),
        levels=tuple(levels),
        paths=tuple(host_paths),
    )


def plan_paths(
    parents: Sequence[int] | torch.Tensor,
    cu_seqlens: Sequence[int] | torch.Tensor | None = None,
    mode: str = "levels",
) -> PathPlan:
    """Plan the scan of a packed batch of trees.

    parents [R]: parent row *local to its sequence*, -1 = the sequence's committed state; every sequence's
        rows are ordered parents before children. A tensor is read on the host (a device sync), so hot
        paths should pass host lists or reuse the plan of their tree descriptor.
    cu_seqlens [S+1]: row ranges per sequence (None = one sequence).
    mode: "levels" (Algorithm 2, cut states between levels), "flat" (root-to-leaf paths, one launch),
        "packed" (flat routes packed into fewer programs) or "auto" (flat unless its recomputed prefixes
        more than double the node updates, else levels).
    """
    if mode == "auto":
        flat = plan_paths(parents, cu_seqlens, "flat")
        # Recomputing shared prefixes costs node updates but saves a launch and the cut-state round trip
        # per level: on the H200 one launch wins for hydra27 (62 updates for 32 nodes), not for bushy trees.
        return flat if sum(flat.path_lengths) <= 2 * flat.num_rows else plan_paths(parents, cu_seqlens)
    if mode not in PLAN_MODES:
        raise ValueError(f"unknown plan mode {mode!r}; choose one of {PLAN_MODES}")
    p = tuple(int(x) for x in (parents.tolist() if isinstance(parents, torch.Tensor) else parents))
    if not p:
        raise ValueError("empty tree")
    if cu_seqlens is None:
        cu: tuple[int, ...] = (0, len(p))
    else:
        cu = tuple(
            int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)
        )
    return _plan_cached(p, cu, mode)
