"""TreeTopology / TreeDescriptor: the built-in hydra27 bucket, chains, row layout and validation errors."""

from __future__ import annotations

import json

import pytest
import torch

from lumotree.serving.tree import TreeDescriptor, TreeError, TreeTopology, chain, hydra27


def test_hydra27_matches_the_shared_file(shared_data) -> None:
    spec = json.loads((shared_data / "trees" / "hydra27_fixed32.json").read_text())
    topo = hydra27()
    assert topo.num_rows == 32 and topo.max_depth == 11
    assert sum(topo.default_active) == 28  # the root + 27 live candidates
    # bit i of the mask = draft node i active
    mask = sum(1 << i for i, a in enumerate(spec["active"]) if a)
    assert mask == 0x7ABDFFFF
    # the draft parents of the file, re-expressed in rows
    for i, p in enumerate(spec["draft_parent"]):
        row, prow = topo.node_to_row[i + 1], topo.node_to_row[p + 1]
        assert topo.parents[row] == prow
        assert topo.routes[row] == tuple(spec["paths"][i])
        assert topo.default_active[row] == spec["active"][i]
    assert topo.spine == tuple(range(12)), "the spine occupies rows 0..11"
    plan = topo.plan("levels")
    assert plan.path_counts == (1, 11) and plan.max_lengths == (5, 7)
    # the served plan: spine, two rescue chains and a recomputed spine prefix carrying the eight leaves
    car = topo.plan()
    assert car.mode == "sidecar" and car.path_counts == (4,) and car.updates <= 2 * topo.num_rows
    assert max(len(c) for c in topo.children) == 3


def test_chain_and_ancestor_mask() -> None:
    topo = chain(5)
    assert topo.parents == (-1, 0, 1, 2, 3, 4) and topo.spine == tuple(range(6))
    assert torch.equal(topo.ancestor_mask(), torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    assert chain(0).num_rows == 1


def test_ancestor_mask_is_ancestry() -> None:
    topo = hydra27()
    m = topo.ancestor_mask()
    for i in range(topo.num_rows):
        anc = {i}
        j = i
        while topo.parents[j] >= 0:
            j = topo.parents[j]
            anc.add(j)
        assert set(torch.nonzero(m[i]).flatten().tolist()) == anc


def test_spine_first_layout_puts_parents_first() -> None:
    # logical order lists a runner-up before the top choice; the spine must still be rows 0..2
    topo = TreeTopology.from_paths([[1], [0], [0, 0], [1, 0]])
    assert topo.routes[:3] == ((), (0,), (0, 0))
    assert all(p < i for i, p in enumerate(topo.parents))


def test_descriptor_positions_and_rows() -> None:
    parents = [-1, 0, 0, 1]
    d = TreeDescriptor.from_arrays([7, 8, 9, 10], parents, [5, 6, 6, 7], prefix_len=5)
    assert d.positions == [5, 6, 7, 6]  # row order: root, spine (nodes 1, 3), node 2
    # node 3 (child of node 1, the top choice) is on the spine: row 2
    assert d.node_to_row == (0, 1, 3, 2)
    assert d.token_ids.tolist() == [7, 8, 10, 9]


@pytest.mark.parametrize(
    ("parents", "kw", "msg"),
    [
        ([-1, 2, 1], {}, "cycle"),
        ([-1, 0, 5], {}, "out of range"),
        ([-1, -1, 0], {}, "exactly one root"),
        ([0, -1], {}, "cycle|root must be node 0"),
        ([-1, 2, 0], {}, "parents must precede"),
        ([-1, 0, 0], {"slots": [0, 1, 1]}, "duplicate slots"),
        ([-1, 0, 1], {"slots": [0, 2, 1]}, "before its parent"),
        ([-1] + [0] * 20, {}, "children; the limit"),
        ([-1] + list(range(64)), {}, "limit is 64"),
        ([-1, 0, 1], {"active": [True, False, True]}, "inactive parent"),
    ],
)
def test_malformed_trees_raise(parents, kw, msg) -> None:
    with pytest.raises(TreeError, match=msg):
        TreeTopology.from_parents(parents, **kw)


def test_wrong_positions_and_shapes_raise() -> None:
    with pytest.raises(TreeError, match="position"):
        TreeDescriptor.from_arrays([1, 2, 3], [-1, 0, 0], [4, 5, 6], prefix_len=4)
    with pytest.raises(TreeError, match="token_ids"):
        TreeDescriptor(chain(3), torch.zeros(3, dtype=torch.long), 0)
    with pytest.raises(TreeError, match="padded slot|inactive"):
        topo = hydra27()
        act = list(topo.default_active)
        act[topo.default_active.index(False)] = True
        TreeDescriptor(topo, torch.zeros(32, dtype=torch.long), 0, active=tuple(act))
    with pytest.raises(TreeError, match="appears twice"):
        TreeTopology.from_paths([[0], [0]])
    with pytest.raises(TreeError, match="before its parent route"):
        TreeTopology.from_paths([[0, 0], [0]])
