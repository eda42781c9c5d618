"""Path plans: the paper's hydra27 levels, chains, and structural soundness on random trees."""

from __future__ import annotations

import random

import pytest

from lumotree.kernels.tree_plan import WyPlan, plan_paths, plan_tree

HYDRA_DRAFT_PARENT = [-1, -1, -1, 0, 0, 0, 1, 2, 3, 3, 3, 6, 7, 8, 8, 8, 11, 12, 13, 13, 13, 16, 17, 18, 22,
                      23, 24, 25, 27, 28, 29]  # fmt: skip
HYDRA = [-1] + [p + 1 for p in HYDRA_DRAFT_PARENT]


def test_hydra27_levels_match_the_paper(shared_data) -> None:
    import json

    spec = json.loads((shared_data / "trees" / "hydra27_fixed32.json").read_text())
    parents = [-1] + [p + 1 for p in spec["draft_parent"]]
    plan = plan_paths(parents)
    assert plan.path_counts == tuple(spec["gdn_levels"]["path_counts"]) == (1, 11)
    assert plan.max_lengths == tuple(spec["gdn_levels"]["max_lengths"]) == (5, 7)
    # level 1 = root + spine to depth 4; its 5 states are the cut states
    assert plan.paths[0][0][1] == (0, 1, 4, 9, 14)
    assert plan.num_cut == 5
    assert plan.cut_buffer_bytes(48, 128, 128) == 15 * 2**20


def test_chain_is_one_path() -> None:
    plan = plan_paths([-1] + list(range(9)))
    assert plan.path_counts == (1,) and plan.max_lengths == (10,) and plan.num_cut == 0


def test_flat_mode_is_root_to_leaf() -> None:
    plan = plan_paths(HYDRA, mode="flat")
    assert plan.path_counts == (11,) and plan.max_lengths == (12,) and plan.num_cut == 0


def test_side_mode_rides_hydra27_runner_ups_along_the_spine() -> None:
    flat, side = plan_paths(HYDRA, mode="flat"), plan_paths(HYDRA, mode="side")
    assert flat.path_lengths == (12, 8, 6, 6, 6, 5, 5, 4, 4, 3, 3) and flat.updates == 62
    # the spine carries the two runner-ups of depths 2-5; the two rescue chains keep their own routes
    assert side.path_counts == (3,) and side.path_lengths == (12, 8, 6) and side.num_cut == 0
    assert side.updates == 34 and side.levels[0].num_side == 2
    spine, spine_sides = side.paths[0][0][1], side.levels[0].side[0].tolist()
    assert all(len(x) == 2 and {HYDRA[n] for n in x} == {spine[t]} for t, x in enumerate(spine_sides[1:5], 1))
    assert all(x == [-1, -1] for x in spine_sides[:1] + spine_sides[5:])
    _check(HYDRA, [0, len(HYDRA)], "side")
    # sidecar: the spine runs plain; a recomputed copy of its first five nodes carries the eight leaves
    # (launched first: 5 steps + 8 leaves are the most updates, ahead of the spine's 12 steps)
    car = plan_paths(HYDRA, mode="sidecar")
    assert car.path_lengths == (5, 12, 8, 6) and car.updates == 39
    assert car.levels[0].sided.tolist() == [1, 0, 0, 0] and car.levels[0].write[0].sum() == 0
    _check(HYDRA, [0, len(HYDRA)], "sidecar")
    # split: the same routes as two independent launches, the plain ones without side slots
    split = plan_paths(HYDRA, mode="split")
    assert split.independent and split.path_counts == (3, 1) and split.updates == 39
    assert split.levels[0].side is None and split.levels[1].num_side == 2
    _check(HYDRA, [0, len(HYDRA)], "split")


def test_side_slots_overflow_into_routes() -> None:
    star = [-1] + [0] * 5  # five leaves under the root: one ends the route, two ride along, two get routes
    plan = plan_paths(star, mode="side")
    assert plan.path_counts == (3,) and plan.updates == 3 * 2 + 2
    _check(star, [0, len(star)], "side")


def test_only_levels_that_export_cut_states_say_so() -> None:
    """``has_cut`` compiles the cut export out of the scan: it must be exact, also across ``to``."""
    levels = plan_paths(HYDRA, mode="levels").levels
    assert [lv.has_cut for lv in levels] == [True, False]
    for mode in ("flat", "side", "sidecar", "split"):
        assert not any(lv.has_cut for lv in plan_paths(HYDRA, mode=mode).levels)
    for lv in levels:
        assert lv.has_cut == bool((lv.cut >= 0).any()) == lv.to("cpu").has_cut


def _check(parents: list[int], cu: list[int], mode: str) -> None:
    plan = plan_paths(parents, cu, mode=mode)
    gpar = []
    for s in range(len(cu) - 1):
        gpar += [p + cu[s] if p >= 0 else -1 for p in parents[cu[s] : cu[s + 1]]]
    written = [0] * len(parents)
    ready = {}  # cut slot -> level that produced it
    for li, lv in enumerate(plan.levels):
        nodes, lens, start = lv.nodes.tolist(), lv.lens.tolist(), lv.start.tolist()
        write, cut = lv.write.tolist(), lv.cut.tolist()
        side = lv.side.tolist() if lv.side is not None else [[[]] * lv.max_len] * lv.num_paths
        assert mode in ("side", "sidecar", "split") or lv.side is None
        for p in range(lv.num_paths):
            path = nodes[p][: lens[p]]
            assert all(x == -1 for x in nodes[p][lens[p] :])
            for a, b in zip(path, path[1:], strict=False):
                assert gpar[b] == a, "consecutive path nodes must be parent and child"
            for t, leaves in enumerate(side[p]):
                for n in (x for x in leaves if x >= 0):
                    assert t < lens[p] and gpar[n] == path[t] and n not in gpar, "a side leaf is a leaf child"
                    written[n] += 1
            if start[p] >= 0:
                assert ready.get(start[p], li) < li, "a path must start from a cut state of an earlier level"
            else:
                assert gpar[path[0]] == -1 and cu[-start[p] - 1] <= path[0] < cu[-start[p]]
            for t, n in enumerate(path):
                written[n] += write[p][t]
                if cut[p][t] >= 0:
                    ready[cut[p][t]] = li
    assert written == [1] * len(parents), "every row written exactly once"


@pytest.mark.parametrize("mode", ["levels", "flat", "side", "sidecar", "split"])
@pytest.mark.parametrize("seed", range(20))
def test_random_forests_are_sound(seed: int, mode: str) -> None:
    rng = random.Random(seed)
    parents, cu = [], [0]
    for _ in range(rng.randint(1, 3)):
        n = rng.randint(1, 64)
        window = rng.choice([1, 2, 64])
        parents += [-1] + [rng.randint(max(0, i - window), i - 1) for i in range(1, n)]
        cu.append(len(parents))
    _check(parents, cu, mode)


def test_rejects_bad_parents() -> None:
    with pytest.raises(ValueError, match="parents before children"):
        plan_paths([-1, 2, 0])
    with pytest.raises(ValueError, match="cu_seqlens"):
        plan_paths([-1, 0], [0, 3])


def test_auto_mode_picks_one_launch_only_when_recomputation_stays_small() -> None:
    assert plan_paths(HYDRA, mode="auto").mode == "sidecar"  # 39 updates for 32 rows
    comb = [-1] + list(range(9))  # a spine of 10 with a two-node branch under every spine node
    for i in range(10):
        comb += [i, len(comb)]
    auto = plan_paths(comb, mode="auto")  # sidecar would recompute every branch's prefix: 75 updates, 30 rows
    assert plan_paths(comb, mode="sidecar").updates == 75
    assert auto.mode == "levels" and sum(auto.path_lengths) == len(comb)
    with pytest.raises(ValueError, match="unknown plan mode"):
        plan_paths(HYDRA, mode="bogus")


def test_plan_tree_sends_small_trees_to_wy_under_auto() -> None:
    """``auto`` with ``wy_max_rows``: the matrix form when no packed sequence is longer, path plans else."""
    assert isinstance(plan_tree(HYDRA, wy_max_rows=32), WyPlan)
    assert plan_tree(HYDRA, wy_max_rows=31).mode == "sidecar" == plan_tree(HYDRA).mode  # 0 = never
    two = HYDRA + [-1, 0, 1]
    assert isinstance(plan_tree(two, [0, 32, 35], wy_max_rows=32), WyPlan)  # each sequence fits
    assert plan_tree(two, [0, 32, 35], wy_max_rows=16).mode == "sidecar"
    assert plan_tree(HYDRA, mode="levels", wy_max_rows=32).mode == "levels"  # only auto picks wy
    assert isinstance(plan_tree([-1, *range(40)], mode="wy"), WyPlan)
    # short chains are scanned (one route each): a batch of chains of up to scan_max_chain rows, not longer
    # ones, not a tree among them, not a sequence holding two chains
    six, nine = [-1, *range(5)], [-1, *range(8)]
    assert plan_tree(six + six, [0, 6, 12], wy_max_rows=32, scan_max_chain=8).mode == "sidecar"
    assert isinstance(plan_tree(six + nine, [0, 6, 15], wy_max_rows=32, scan_max_chain=8), WyPlan)
    assert isinstance(plan_tree(six + [-1, 0, 0], [0, 6, 9], wy_max_rows=32, scan_max_chain=8), WyPlan)
    assert isinstance(plan_tree([-1, 0, -1, 2], wy_max_rows=32, scan_max_chain=8), WyPlan)
    assert isinstance(plan_tree(six, wy_max_rows=32), WyPlan)  # 0 = never
    with pytest.raises(ValueError, match="do not cover"):
        plan_tree(six, [0, 7], wy_max_rows=32, scan_max_chain=8)


def test_skipped_padded_rows_leave_every_path(shared_data) -> None:
    """hydra27's four padded slots (the tail under root runner-up 2) are dropped from every plan, which
    shortens that route from 8 to 4 updates; skipping must keep whole subtrees and the roots."""
    import json

    spec = json.loads((shared_data / "trees" / "hydra27_fixed32.json").read_text())
    skip = [1 + i for i, on in enumerate(spec["active"]) if not on]
    assert skip == [18, 23, 25, 27]
    full, cut = plan_paths(HYDRA, mode="sidecar"), plan_paths(HYDRA, mode="sidecar", skip=skip)
    assert (full.updates, cut.updates) == (39, 35)
    assert sorted(len(r) for lv in cut.paths for _, r in lv) == [4, 5, 6, 12]
    for mode in ("levels", "flat", "side", "split"):
        plan = plan_paths(HYDRA, mode=mode, skip=skip)
        rows = {n for lv in plan.paths for _, r in lv for n in r}
        rows |= {int(n) for lv in plan.levels if lv.side is not None for n in lv.side.flatten() if n >= 0}
        assert rows == set(range(32)) - set(skip), mode
    with pytest.raises(ValueError, match="parent 18 is skipped"):
        plan_paths(HYDRA, skip=[18])
    with pytest.raises(ValueError, match="root"):
        plan_paths(HYDRA, skip=[0])
    with pytest.raises(ValueError, match="outside"):
        plan_paths(HYDRA, skip=[32])


def test_pack_paths_balances_short_paths_into_fewer_programs() -> None:
    from lumotree.kernels.tree_plan import pack_paths

    # hydra27's sidecar plan without its padded rows: 13 (5 steps + 8 side leaves), 12, 6, 4
    assert pack_paths([13, 12, 6, 4], 1.5) == [[1, 2], [0, 3]]
    assert pack_paths([13, 12, 6, 4], 0.0) is None  # off
    assert pack_paths([12], 1.5) is None  # one path
    assert pack_paths([5, 5, 5], 1.0) is None  # nothing fits beside the longest
    groups = pack_paths([9, 1, 1, 1, 1, 1, 1, 1, 1, 1], 1.0)
    assert groups is not None and sorted(i for g in groups for i in g) == list(range(10))
    assert max(sum([9, 1, 1, 1, 1, 1, 1, 1, 1, 1][i] for i in g) for g in groups) <= 9
    plan = plan_paths(HYDRA, mode="sidecar", skip=[18, 23, 25, 27])
    (grp,) = plan.groups(1.5, "cpu")
    assert grp is not None and grp.tolist() == [[1, 2], [0, 3]]  # spine + 6, sidecar + 4 (launch order)
