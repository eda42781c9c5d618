"""The structure-keyed walk (``walk_static``, what verify steps replay as CUDA graphs) equals the plain walk.

Random trees of several requests, mixed sampling parameters (greedy, temperature, top-k, top-p, min-p,
presence penalty) and seeds: every step runs the plain ``walk`` over a ``TreeBatch.build`` batch (tables
built from the device parents) and the static path over cached topology tables and static input copies
(on the CPU ``StaticGraphs`` runs the captured function eagerly on those copies; on CUDA it replays the
captured graph). Results must be equal; the accepted paths are also checked against a host walk over the
drawn tokens, and every node's draw against a root-only AR draw with the node's own history and position.
"""

from __future__ import annotations

import pytest
import torch

from lumotree.serving.graphs import StaticGraphs
from lumotree.serving.sampler import RowParams, Sampler, SamplingParams, TreeBatch, walk

VOCAB = 40
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, presence_penalty=1.5),
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.1, top_p=0.8),
    SamplingParams(temperature=0.7, min_p=0.1, presence_penalty=-0.5),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95, presence_penalty=1.0),
    SamplingParams(temperature=1.0),
]

Tree = tuple[list[int], list[int], list[bool]]


def random_topology(g: torch.Generator, sizes: list[int]) -> list[tuple[list[int], list[bool]]]:
    out = []
    for n in sizes:
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        active = [True] + (torch.rand(n - 1, generator=g) < 0.85).tolist()
        out.append((parents, active))
    return out


def random_step(
    g: torch.Generator, shape: list[tuple[list[int], list[bool]]], params_pool: list[int], boost: float = 6.0
):
    """Trees (fresh tokens on a fixed shape), node logits that favour some child's token by ``boost`` (so
    that paths get accepted), coarse-grid ties, history rows, parameters, seeds and output positions."""
    trees: list[Tree] = []
    logits = []
    for parents, active in shape:
        n = len(parents)
        tokens = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        trees.append((tokens, parents, active))
        for i in range(n):
            row = torch.round(torch.randn(VOCAB, generator=g) * 4) / 2
            kids = [j for j in range(n) if parents[j] == i]
            if kids and float(torch.rand(1, generator=g)) < 0.8:
                row[tokens[kids[int(torch.randint(0, len(kids), (1,), generator=g))]]] += boost
            logits.append(row)
    b = len(shape)
    history = torch.rand(b, VOCAB, generator=g) < 0.2
    params = [
        PARAMS[params_pool[int(torch.randint(0, len(params_pool), (1,), generator=g))]] for _ in range(b)
    ]
    seeds = torch.randint(0, 2**62, (b,), generator=g)
    out_pos = torch.randint(0, 500, (b,), generator=g)
    return trees, torch.stack(logits), history, params, seeds, out_pos


def static_batch(trees: list[Tree], device: str) -> TreeBatch:
    tokens = torch.tensor([t for tree in trees for t in tree[0]], device=device)
    return TreeBatch.from_topology(
        tokens, tuple(tuple(tree[1]) for tree in trees), tuple(tuple(tree[2]) for tree in trees)
    )


def host_walk(tree: Tree, drawn: list[int]) -> list[int]:
    """The accepted path from the drawn tokens: enter the lowest-index active child holding the draw."""
    tokens, parents, active = tree
    path = [0]
    while True:
        kids = [j for j in range(len(parents)) if parents[j] == path[-1] and active[j]]
        hit = [j for j in kids if tokens[j] == drawn[path[-1]]]
        if not hit:
            return path
        path.append(hit[0])


def assert_same(got, want) -> None:
    for name in ("accepted", "num_accepted", "bonus", "drawn", "path_tokens"):
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name).cpu()), name


def check_step(sampler: Sampler, trees, logits, history, params, seeds, out_pos, device: str = "cpu"):
    """The static path's result on this step, after asserting it equals the plain walk's."""
    logits, seeds, out_pos = logits.to(device), seeds.to(device), out_pos.to(device)
    history = None if history is None else history.to(device)
    rp = RowParams.build(params, VOCAB, device)
    want = walk(TreeBatch.build(trees, device), logits, history, rp, seeds, out_pos)
    got = sampler.walk(static_batch(trees, device), logits, history, params, seeds, out_pos)
    assert_same(got, want)
    return got


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_static_walk_equals_walk(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    graphs = StaticGraphs(False, lambda: None, lambda e: None)
    sampler = Sampler(VOCAB, "cpu", graphs)
    shape = random_topology(g, [int(x) for x in torch.randint(1, 13, (4,), generator=g)])
    pools = [[0], [0, 1], list(range(len(PARAMS))), [2, 3, 6], list(range(len(PARAMS)))]
    accepted_drafts = 0
    for step, pool in enumerate(pools):
        trees, logits, history, params, seeds, out_pos = random_step(g, shape, pool)
        res = check_step(sampler, trees, logits, history if step != 4 else None, params, seeds, out_pos)
        off = TreeBatch.build(trees, "cpu").offsets
        for b, tree in enumerate(trees):
            drawn = res.drawn[off[b] : off[b + 1]].tolist()
            path = host_walk(tree, drawn)
            assert res.accepted[b].tolist() == path + [-1] * (res.accepted.shape[1] - len(path))
            assert int(res.bonus[b]) == drawn[path[-1]]
            assert res.path_tokens[b, : len(path)].tolist() == [tree[0][i] for i in path]
            accepted_drafts += len(path) - 1
    assert accepted_drafts > 0, "no draft was accepted: the path bookkeeping went untested"
    assert graphs.entries and all(k[0] == "walk" for k in graphs.entries)


def test_every_draw_is_the_ar_draw_of_its_node() -> None:
    """Node i of request b at depth d draws what AR draws at output position out_pos[b] + d from the node's
    logits, with the request's history plus the node's path tokens (root excluded) as presence. Flat
    logits, so that the path's presence penalties decide many draws."""
    g = torch.Generator().manual_seed(7)
    sampler = Sampler(VOCAB, "cpu", StaticGraphs(False, lambda: None, lambda e: None))
    plain = Sampler(VOCAB, "cpu")
    shape = random_topology(g, [9, 1, 12, 6])
    for _ in range(4):
        trees, logits, history, params, seeds, out_pos = random_step(g, shape, [1, 4, 5], boost=0.0)
        logits = logits / 8
        res = sampler.walk(static_batch(trees, "cpu"), logits, history, params, seeds, out_pos)
        i = 0
        for b, (tokens, parents, _) in enumerate(trees):
            for j in range(len(parents)):
                present, depth, k = history[b].clone(), 0, j
                while parents[k] >= 0:
                    present[tokens[k]] = True
                    depth, k = depth + 1, parents[k]
                x = plain.sample(logits[i : i + 1], present[None], [params[b]], seeds[b : b + 1],
                                 out_pos[b : b + 1] + depth)  # fmt: skip
                assert int(res.drawn[i]) == int(x), (b, j)
                i += 1


def test_one_entry_per_structure_and_cached_tables() -> None:
    g = torch.Generator().manual_seed(3)
    graphs = StaticGraphs(False, lambda: None, lambda e: None)
    sampler = Sampler(VOCAB, "cpu", graphs)
    shape = random_topology(g, [5, 8])
    for _ in range(3):  # same topology and parameter facts: one entry, replayed on new data
        check_step(sampler, *random_step(g, shape, [2]))
    assert len(graphs.entries) == 1
    check_step(sampler, *random_step(g, shape, [0]))  # all greedy: another structure
    check_step(sampler, *random_step(g, random_topology(g, [5, 8]), [2]))  # another topology
    assert len(graphs.entries) == 3
    trees = random_step(g, shape, [0])[0]
    a, b = static_batch(trees, "cpu"), static_batch(trees, "cpu")
    assert a.parents is b.parents and a.active is b.active, "topology tensors cross to the device once"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_walk_equals_eager_walk() -> None:
    """On CUDA each structure is captured (no sync, no host copy inside) and its replays equal the plain
    walk, step after step on new data."""
    failed: list[str] = []
    graphs = StaticGraphs(True, lambda: None, failed.append)
    sampler = Sampler(VOCAB, "cuda", graphs)
    g = torch.Generator().manual_seed(11)
    shape = random_topology(g, [12, 3, 9, 7])
    for pool in ([0], [0, 1], list(range(len(PARAMS))), [2, 3, 6]):
        for _ in range(3):
            check_step(sampler, *random_step(g, shape, pool), device="cuda")
    assert not failed and graphs.entries, failed
    assert all(e is not None and e.graph is not None for e in graphs.entries.values())


def test_root_only_trees_walk_static() -> None:
    """AR's draws (``Sampler.sample``: root-only trees, which carry their host topology) go through the
    structure-keyed walk, one entry per batch size and parameter facts, and equal the eager walk's."""
    trees = TreeBatch.roots(torch.tensor([4, 9, 2], dtype=torch.int32))
    assert trees.topology == ((-1,),) * 3 and trees.tokens.dtype == torch.int64
    assert trees.tokens.tolist() == [4, 9, 2] and trees.active.all() and trees.max_depth == 0
    g = torch.Generator().manual_seed(5)
    graphs = StaticGraphs(False, lambda: None, lambda e: None)
    sampler = Sampler(VOCAB, "cpu", graphs)
    eager = Sampler(VOCAB, "cpu")
    sampled = 0
    for b in (1, 3, 7, 1, 3, 7):
        params = [PARAMS[(i + 2) % len(PARAMS)] for i in range(b)]  # the same per batch size
        logits = torch.round(torch.randn(b, VOCAB, generator=g) * 4) / 2  # coarse grid: ties too
        history = torch.rand(b, VOCAB, generator=g) < 0.2
        seeds = torch.randint(0, 2**62, (b,), generator=g)
        out_pos = torch.randint(0, 500, (b,), generator=g)
        for hist in (history, None):
            got = sampler.sample(logits, hist, params, seeds, out_pos)
            assert torch.equal(got, eager.sample(logits, hist, params, seeds, out_pos))
            rp = RowParams.build(params, VOCAB, "cpu")
            flat = TreeBatch.build([([0], [-1], None)] * b, "cpu")  # no topology: the plain walk
            assert torch.equal(got, walk(flat, logits, hist, rp, seeds, out_pos).bonus)
            greedy = torch.tensor([p.temperature == 0 for p in params])
            sampled += int((got != logits.argmax(-1))[~greedy].sum())
    assert sampled > 0, "every sampled draw was the argmax: the noise went untested"
    walks = [k for k in graphs.entries if k[0] == "walk"]
    assert len(walks) == len(graphs.entries) and all(k[1].max_depth == 0 for k in walks)
    # Per batch size: with and without the history rows (b = 1 has no penalty, so it never reads them);
    # repeated batch sizes replay their entries.
    assert sorted(len(k[1].sizes) for k in walks) == [1, 3, 3, 7, 7]


def test_ar_engine_samples_through_static_walk(tiny_checkpoints) -> None:
    """An AR engine with the static decode path emits the default engine's tokens for seeded mixed
    sampling, and its draws (prefill's first token and every decode step) went through the keyed walk."""
    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.loader import load_model

    model = load_model(tiny_checkpoints["gdn3_attn1"], "cpu", torch.float32)[0]
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16], [3]]
    opts = dict(max_tokens=12, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=0.5, seed=1, **opts),
        SamplingParams(temperature=0.0, **opts),
        SamplingParams(temperature=1.0, min_p=0.1, seed=2, **opts),
        SamplingParams(temperature=0.6, top_p=0.8, presence_penalty=-0.5, seed=3, **opts),
    ]

    def outputs(**kw) -> tuple[Engine, list[list[int]]]:
        eng = Engine(model, None, EngineConfig(arm="ar", max_seqs=4, max_model_len=64, **kw))
        out = [r.output_ids for r in eng.generate(prompts, params)]
        eng.check_no_leaks()
        return eng, out

    _, want = outputs()
    eng, got = outputs(static_decode=True)
    assert got == want
    assert eng.runner.fn_graphs is not None
    walks = [k for k in eng.runner.fn_graphs.entries if k[0] == "walk"]
    assert walks and all(k[1].max_depth == 0 for k in walks)
    assert 4 in {len(k[1].sizes) for k in walks}, "the batched decode steps walked through an entry"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_argmax_ties_take_the_lowest_id(device: str) -> None:
    """The greedy tie rule on a verify-sized block (32 rows of a large vocabulary) with many exact ties,
    against an independent host rule: the smallest index holding the row maximum."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from lumotree.serving.sampling.transforms import argmax_lowest

    g = torch.Generator().manual_seed(3)
    x = torch.round(torch.randn(32, 248_320, generator=g) * 2) / 2  # coarse grid: thousands of ties per row
    x[5] = 0.0
    x[6, 100:] = float("-inf")
    x[6, :100] = float("-inf")
    top = x.max(-1, keepdim=True).values
    want = [int(torch.nonzero(row == m)[0]) for row, m in zip(x, top, strict=True)]
    assert argmax_lowest(x.to(device)).tolist() == want
    assert want[5] == 0 and want[6] == 0
