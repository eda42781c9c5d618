"""Verifier glue: descriptors -> one tree forward -> exact walk -> commit equals native decoding bitwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lumotree.serving.cache import CacheConfig, StateCaches
from lumotree.serving.loader import load_model
from lumotree.serving.sampler import SamplingParams
from lumotree.serving.tree import TreeDescriptor, hydra27
from lumotree.serving.verifier import Verifier

PROMPT = [5, 17, 99, 3, 42, 7, 7, 150, 23, 8]


def _surfaces(c: StateCaches) -> list[torch.Tensor]:
    return [c.recurrent.state, c.conv.state, c.kv.k, c.kv.v]


def _setup(path: Path):
    model, cfg = load_model(path)
    caches = StateCaches(cfg, CacheConfig(max_seqs=2, num_blocks=64, block_size=4))
    caches.allocate(0, len(PROMPT) + 40)
    model(caches.make_batch("prefill", [0], [PROMPT], [0]), caches)
    return model, caches, [x.clone() for x in _surfaces(caches)]


def _restore(caches: StateCaches, snap: list[torch.Tensor]) -> None:
    for dst, src in zip(_surfaces(caches), snap, strict=True):
        dst.copy_(src)


def _decode(model, caches: StateCaches, ctx: int, toks: list[int]) -> list[int]:
    """Native decoding of forced tokens; returns the greedy token after each."""
    out = []
    for j, t in enumerate(toks):
        h = model(caches.make_batch("decode", [0], [[t]], [ctx + j]), caches)
        out.append(int(model.compute_logits(h)[0].argmax()))
    return out


def _replay_one_by_one(record, rows: list[int], state0: torch.Tensor) -> torch.Tensor:
    """``dispatch.gdn_decode`` with T = 1 per call, like AR decoding, over each GDN layer's operands."""
    from lumotree.kernels.dispatch import gdn_decode

    out = []
    for li, rep in enumerate(record.layers):
        st = state0[li][None]
        for r in rows:
            ops = [x[r][None, None] for x in (rep.q, rep.k, rep.v, rep.g, rep.beta)]
            _, st = gdn_decode(*ops, record.scale, st)
        out.append(st[0])
    return torch.stack(out)


@pytest.fixture
def tiny(tiny_checkpoints: dict[str, Path]):
    return _setup(tiny_checkpoints["gdn3_attn1"])


def _hydra(root: int, prefix: int, seed: int) -> TreeDescriptor:
    gen = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, 300, (32,), generator=gen)
    toks[0] = root
    return TreeDescriptor(hydra27(), toks, prefix)


def _rows_of(d: TreeDescriptor, row: int) -> list[int]:
    path = [row]
    while d.parents[path[-1]] >= 0:
        path.append(d.parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("target", ["spine5", "spine11", "rescue1", "runner_up_leaf", "root"])
def test_committing_any_path_equals_native_decoding(tiny, target: str) -> None:
    model, caches, snap = tiny
    ctx = len(PROMPT)
    d = _hydra(root=11, prefix=ctx, seed=1)
    topo = d.topology
    leaf = {
        "spine5": topo.row_of_route[(0,) * 5],
        "spine11": topo.row_of_route[(0,) * 11],
        "rescue1": topo.row_of_route[(1, 0, 0, 0, 0)],
        "runner_up_leaf": topo.row_of_route[(0, 0, 2)],
        "root": 0,
    }[target]
    rows = _rows_of(d, leaf)
    ver = Verifier(model, caches)
    out = ver.verify([0], [d])
    acc = torch.tensor([rows])
    lens = model.commit(out.record, acc, caches)
    assert lens.tolist() == [len(rows)]
    tree_state = [x.clone() for x in _surfaces(caches)]
    tree_logits = out.logits[rows].clone()

    _restore(caches, snap)
    toks = d.token_ids[rows].tolist()
    logits = []
    for j, t in enumerate(toks):
        h = model(caches.make_batch("decode", [0], [[t]], [ctx + j]), caches)
        logits.append(model.compute_logits(h)[0])
    native = _surfaces(caches)
    # bitwise: the native decode kernel stepping the recorded operands of the path one token per call
    replay = _replay_one_by_one(out.record, rows, snap[0][:, caches.seqs[0].state_row])
    assert torch.equal(tree_state[0][:, caches.seqs[0].state_row], replay)
    # native decoding recomputes the operands with 1-row projections (not batch-invariant on this backend):
    # equal up to rounding
    for name, a, b in (("recurrent", tree_state[0], native[0]), ("conv", tree_state[1], native[1])):
        rel = float((a.double() - b.double()).norm() / b.double().norm())
        assert rel < 1e-5, f"{name} state differs from native decoding beyond rounding: rel L2 {rel:.2e}"
    # KV at the committed positions (tree rows were remapped to native slots)
    blocks = caches.seqs[0].blocks
    slots = [blocks[p // 4] * 4 + p % 4 for p in range(ctx + len(rows))]
    for t_kv, n_kv in zip(tree_state[2:], native[2:], strict=True):
        flat_t, flat_n = t_kv.flatten(1, 2)[:, slots], n_kv.flatten(1, 2)[:, slots]
        torch.testing.assert_close(flat_t, flat_n, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tree_logits, torch.stack(logits), rtol=1e-4, atol=1e-4)


def test_greedy_step_accepts_the_native_continuation(tiny) -> None:
    model, caches, snap = tiny
    ctx = len(PROMPT)
    root = 11
    greedy = _decode(model, caches, ctx, [root] * 1)  # the token after the root
    seq = [root]
    for _ in range(7):  # the greedy continuation, natively
        _restore(caches, snap)
        seq.append(_decode(model, caches, ctx, seq)[-1])
    assert seq[1] == greedy[0]
    _restore(caches, snap)
    d = _hydra(root=root, prefix=ctx, seed=2)
    spine = d.topology.spine
    toks = d.token_ids.clone()
    toks[list(spine[:6])] = torch.tensor(seq[:6])  # spine to depth 5 follows the greedy continuation
    toks[spine[6]] = (seq[6] + 1) % 300  # ... and then diverges
    d = TreeDescriptor(d.topology, toks, ctx)
    ver = Verifier(model, caches)
    params = [SamplingParams(temperature=0.0)]
    out, walk, lens = ver.step([0], [d], params, torch.tensor([0]), torch.tensor([0]))
    assert walk.accepted[0, :6].tolist() == list(spine[:6]) and lens.tolist() == [6]
    assert int(walk.bonus[0]) == seq[6]
    row = caches.seqs[0].state_row
    replay = _replay_one_by_one(out.record, list(spine[:6]), snap[0][:, row])
    assert torch.equal(caches.recurrent.state[:, row], replay)


def test_a_batch_prepared_ahead_serves_only_its_own_shapes(tiny) -> None:
    """``prepare`` builds a fixed tree's batch while the drafter runs: ``verify`` of exactly those shapes
    takes it, anything else builds its own, and the logits are the same either way."""
    model, caches, snap = tiny
    ctx = len(PROMPT)
    d = _hydra(root=11, prefix=ctx, seed=4)
    ver = Verifier(model, caches)
    want = ver.verify([0], [d]).logits.clone()
    for prefix, used in ((ctx, True), (ctx + 1, False)):
        _restore(caches, snap)
        ver.prepare([0], [prefix], [hydra27().parents], [hydra27().padded_rows])
        ahead = ver._ahead
        assert ahead is not None
        out = ver.verify([0], [d])
        assert (out.batch is ahead[1]) == used and ver._ahead is None
        assert torch.equal(out.logits, want)


def test_padded_rows_are_skipped_without_touching_the_sampled_ones(tiny) -> None:
    """The verify forward skips hydra27's padded slots in the GDN scan (their outputs zero): every row that
    can be sampled has the logits of the forward that computes all 32 rows, bit for bit."""
    model, caches, snap = tiny
    d = _hydra(root=11, prefix=len(PROMPT), seed=4)
    pad = list(d.topology.padded_rows)
    keep = [r for r in range(d.num_rows) if r not in pad]
    assert len(pad) == 4 and all(not d.active_mask[r] for r in pad)
    skipped = Verifier(model, caches).verify([0], [d])
    assert skipped.batch.padded_host == [tuple(pad)]
    _restore(caches, snap)
    batch = caches.make_batch("tree", [0], [d.token_ids.tolist()], [d.prefix_len], [list(d.parents)])
    full = model.compute_logits(model(batch, caches))
    assert torch.equal(skipped.logits[keep], full[keep])
    assert not torch.equal(skipped.logits[pad], full[pad])  # they were not computed
