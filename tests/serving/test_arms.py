"""Speculative arms against AR on random tiny checkpoints (MTP weights and a random EAGLE head): greedy
outputs token-identical to AR for every arm at batch 1 and batch 4, counters with vLLM's definitions, drafter
KV bookkeeping. Prompts are repetitive so that suffix drafts (and some MTP drafts) get accepted and the
commit path publishes multi-token paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.loader import load_model
from lumotree.serving.sampler import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from _arms_fixtures import write_arms_checkpoint  # noqa: E402

PROMPTS = [
    [5, 6, 7, 8, 9, 10] * 4,
    [20, 21, 22, 23] * 5 + [1],
    [100, 3, 100, 4, 100, 5, 100, 6] * 3,
    [7] * 10,
]
ARMS = {
    "mtp1": ("mtp", {"mtp_k": 1}),
    "mtp3": ("mtp", {"mtp_k": 3}),
    "mtp5": ("mtp", {"mtp_k": 5}),
    "eagle": ("eagle", {}),
    "lumotree": ("lumotree", {"tree": "hydra27"}),
    "adaptive": ("lumotree", {"tree": "adaptive"}),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Two shared cores: intra-op threads only contend on these tiny shapes (10x slower).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arms_checkpoint(tmp_path_factory.mktemp("arms") / "model")


@pytest.fixture(scope="module")
def model(ckpt: Path):
    return load_model(ckpt, "cpu", torch.float32)[0]


def run(model, ckpt: Path, arm: str, batch: int, n: int, prompts=PROMPTS, params=None, **config) -> Engine:
    name, opts = ARMS.get(arm, ("ar", {}))
    if name == "eagle":
        opts = {**opts, "eagle_path": str(ckpt / "eagle")}
    cfg = EngineConfig(arm=name, arm_options=opts, max_seqs=batch, max_model_len=n + 64, **config)
    eng = Engine(model, None, cfg)
    params = params or SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    eng.results = eng.generate(prompts, params)
    eng.check_no_leaks()
    return eng


@pytest.fixture(scope="module")
def ar_256(model, ckpt):
    return [r.output_ids for r in run(model, ckpt, "ar", 1, 256).results]


def _check(eng: Engine, want: list[list[int]], arm: str) -> None:
    got = [r.output_ids for r in eng.results]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        first = next((j for j, (a, b) in enumerate(zip(g, w, strict=True)) if a != b), None)
        assert g == w, f"{arm}: prompt {i} differs from AR at output token {first}"
    c = eng.counters
    d = c.as_dict()
    assert c.drafts > 0 and c.draft_tokens >= c.drafts
    assert d["acceptance_rate"] == c.accepted_tokens / c.draft_tokens
    assert d["mean_acceptance_length"] == 1 + c.accepted_tokens / c.drafts
    assert sum(c.accepted_per_pos) == c.accepted_tokens
    for r, w in zip(eng.results, want, strict=True):  # every emitted token: a step's bonus or an acceptance
        made = r.stats.decode_steps + r.stats.accepted_tokens
        assert len(w) - 1 <= made < len(w) + 31  # the last step may accept beyond max_tokens
    if arm in ("lumotree", "adaptive"):
        assert c.accepted_tokens > 0, "repetitive prompts must get suffix drafts accepted"


@pytest.mark.parametrize("arm", list(ARMS))
def test_greedy_equals_ar_short_batch4(model, ckpt, arm: str) -> None:
    want = [r.output_ids for r in run(model, ckpt, "ar", 4, 64).results]
    _check(run(model, ckpt, arm, 4, 64), want, arm)


@pytest.mark.parametrize("arm", ["mtp3", "eagle", "lumotree", "adaptive"])
def test_static_tree_buffers_equal_ar(model, ckpt, arm: str) -> None:
    """The graph-shaped verify path (static per-topology buffers, run eagerly on the CPU) is the eager one."""
    want = [r.output_ids for r in run(model, ckpt, "ar", 4, 48).results]
    eng = run(model, ckpt, arm, 4, 48, static_decode=True)
    _check(eng, want, arm)
    assert eng.runner.tree_graphs, "verification went through the static tree buffers"
    assert eng.runner.fn_graphs is not None
    kinds = {key[0] for key in eng.runner.fn_graphs.entries}
    assert {"draft", "walk"} <= kinds, f"and so did drafting and the walk: {kinds}"


@pytest.mark.parametrize("arm", ["mtp3", "lumotree"])
def test_static_sampled_walk_equals_eager(model, ckpt, arm: str) -> None:
    """Seeded sampling with mixed parameters (temperature, top-k, top-p, min-p, presence penalty, greedy):
    the structure-keyed walk over static inputs emits the plain engine's tokens."""
    opts = dict(max_tokens=32, ignore_eos=True)
    params = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=0.5, seed=1, **opts),
        SamplingParams(temperature=0.0, **opts),
        SamplingParams(temperature=1.0, min_p=0.1, seed=2, **opts),
        SamplingParams(temperature=0.6, top_p=0.8, presence_penalty=-0.5, seed=3, **opts),
    ]
    want = [r.output_ids for r in run(model, ckpt, arm, 4, 32, params=params).results]
    eng = run(model, ckpt, arm, 4, 32, params=params, static_decode=True)
    assert [r.output_ids for r in eng.results] == want
    assert eng.counters.accepted_tokens > 0, "no draft was accepted: the walk's paths went untested"
    assert eng.runner.fn_graphs is not None and any(k[0] == "walk" for k in eng.runner.fn_graphs.entries)


def test_topologies_beyond_the_graph_budget_run_eagerly(model, ckpt) -> None:
    """Tree shapes change as requests finish (batch 4, 2, 1): past the budget of per-topology buffers the
    verifier, walk and drafter fall back to eager calls, and the outputs stay AR's."""
    import dataclasses

    want = [r.output_ids for r in run(model, ckpt, "ar", 4, 40).results]
    name, opts = ARMS["adaptive"]
    cfg = EngineConfig(arm=name, arm_options=opts, max_seqs=4, max_model_len=104, static_decode=True)
    eng = Engine(model, None, cfg)
    eng.runner.config = dataclasses.replace(eng.runner.config, max_tree_graphs=1)
    assert eng.runner.fn_graphs is not None
    eng.runner.fn_graphs.max_entries = 2
    shapes: set = set()
    forward = eng.runner.tree_forward

    def recording(batch):  # type: ignore[no-untyped-def]
        shapes.add(tuple(map(tuple, batch.parents_host)))
        return forward(batch)

    eng.runner.tree_forward = recording  # type: ignore[method-assign]
    eng.results = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert [r.output_ids for r in eng.results] == want
    assert len(shapes) > 1, "more tree shapes than the budget, or this test means nothing"
    assert len(eng.runner.tree_graphs) == 1 and len(eng.runner.fn_graphs.entries) == 2
    eng.check_no_leaks()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("arm", list(ARMS))
def test_greedy_equals_ar_256_tokens(model, ckpt, ar_256, arm: str, batch: int) -> None:
    _check(run(model, ckpt, arm, batch, 256), ar_256, arm)


def test_chain_shapes_and_mtp_kv(model, ckpt) -> None:
    """MTP-k verifies k + 1 rows per step; EAGLE 8 (7 head steps + the root); the MTP KV of committed
    positions equals a drafter run over the final text in one pass (accepted rows keep their KV, rejected
    ones are overwritten)."""
    for arm, rows in (("mtp3", 4), ("eagle", 8)):
        eng = run(model, ckpt, arm, 4, 24)
        assert eng.arm.max_tree_rows() == rows
        assert eng.counters.draft_tokens == (rows - 1) * eng.counters.drafts
    # MTP KV after decoding = one extend pass over prompt + output with the target's own features.
    name, opts = ARMS["mtp3"]
    eng = Engine(model, None, EngineConfig(arm=name, arm_options=opts, max_seqs=1, max_model_len=96))
    req = eng.add_request(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    while len(req.output_ids) < 12:
        eng.step()
    ctx = req.context_len
    kv_layer = len(model.config.attn_layers)
    blocks = eng.caches.seqs[req.req_id].blocks
    bs = eng.caches.block_size
    slots = [blocks[p // bs] * bs + p % bs for p in range(ctx - 1)]
    got = eng.caches.kv.k[kv_layer].flatten(0, 1)[slots].clone()
    text = req.prompt_ids + req.output_ids
    from lumotree.serving.cache import CacheConfig, StateCaches

    fresh = StateCaches(model.config, CacheConfig(max_seqs=1, num_blocks=16, block_size=bs))
    fresh.allocate(0, len(text))
    hidden = model(fresh.make_batch("prefill", [0], [text[:ctx]], [0]), fresh)
    model.forward_mtp(fresh.make_batch("prefill", [0], [text[1 : ctx + 1]], [0]), hidden, fresh)
    fb = fresh.seqs[0].blocks
    want = fresh.kv.k[kv_layer].flatten(0, 1)[[fb[p // bs] * bs + p % bs for p in range(ctx - 1)]]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_arm_options_are_checked(model) -> None:
    with pytest.raises(ValueError, match="unknown tree"):
        Engine(model, None, EngineConfig(arm="lumotree", arm_options={"tree": "bushy"}))
    with pytest.raises(FileNotFoundError, match="EAGLE head"):
        Engine(model, None, EngineConfig(arm="eagle", arm_options={"eagle_path": "/nonexistent"}))


def test_restricted_draft_vocabulary_keeps_outputs_and_drafts_inside_it(model, ckpt) -> None:
    """A drafter restricted to the first 64 ids proposes only those ids; verification keeps the outputs."""
    want = [r.output_ids for r in run(model, ckpt, "ar", 4, 40).results]
    name, opts = ARMS["lumotree"]
    cfg = EngineConfig(arm=name, arm_options={**opts, "draft_vocab": 64}, max_seqs=4, max_model_len=104)
    eng = Engine(model, None, cfg)
    seen: list[torch.Tensor] = []
    eng.arm.drafter.draft = _recording(eng.arm.drafter.draft, seen)  # type: ignore[method-assign]
    eng.results = eng.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert [r.output_ids for r in eng.results] == want
    assert seen and all(int(t.max()) < 64 for t in seen)
    with pytest.raises(ValueError, match="draft_vocab"):
        Engine(model, None, EngineConfig(arm="mtp", arm_options={"draft_vocab": -1}))


def _recording(draft, seen: list):
    def wrapped(*args):
        d = draft(*args)
        seen.append(d.tokens)
        return d

    return wrapped


@pytest.mark.parametrize("accepted", [1, 4, 8])
def test_static_drafting_grows_kv_room_for_the_chain(model, ckpt, accepted: int) -> None:
    """The chain passes write KV past the extend rows (up to ctx + depth - 2): fixed-shape drafting must
    reserve those blocks itself, also when a block boundary falls between them, and draft as the eager
    path does."""
    name, opts = ARMS["eagle"]
    cfg = EngineConfig(arm=name, arm_options={**opts, "eagle_path": str(ckpt / "eagle")}, max_seqs=1,
                       max_model_len=128, static_decode=True)  # fmt: skip
    drafter = Engine(model, None, cfg).arm.drafter
    hidden = model.config.hidden_size
    start = 2 * drafter.caches.block_size - accepted - 1  # rows end one short of a block boundary
    feats = torch.randn(start + accepted, hidden, generator=torch.Generator().manual_seed(accepted))
    toks = [(7 * i + 3) % 200 for i in range(start + accepted)]
    graphs = drafter.graphs
    got = []
    for static in (True, False):
        drafter.graphs = graphs if static else None
        drafter.feed("s", 0, toks[:start], feats[:start])
        drafter.draft(["s"], [start])
        drafter.feed("s", start, toks[start:], feats[start:])
        got.append(drafter.draft(["s"], [start + accepted]))
        drafter.release("s")
    assert torch.equal(got[0].tokens, got[1].tokens)
    torch.testing.assert_close(got[0].probs, got[1].probs)


def test_absorbing_the_prompt_at_prefill_drafts_like_one_pass(model, ckpt) -> None:
    """``absorb`` runs the drafter over all prompt rows but the last at prefill; the first draft from the
    remaining row equals the draft of one pass over the whole prompt."""
    name, opts = ARMS["eagle"]  # its own caches: the drafter can be fed without an engine request
    cfg = EngineConfig(arm=name, arm_options={**opts, "eagle_path": str(ckpt / "eagle")}, max_seqs=1,
                       max_model_len=128)  # fmt: skip
    drafter = Engine(model, None, cfg).arm.drafter
    feats = torch.randn(20, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    toks = [(5 * i + 2) % 200 for i in range(20)]
    got = []
    for absorb in (True, False):
        drafter.feed("s", 0, toks, feats)
        if absorb:
            drafter.absorb(["s"])
            assert drafter._pending["s"].start == 19 and len(drafter._pending["s"].tokens) == 1
        got.append(drafter.draft(["s"], [20]))
        drafter.release("s")
    assert torch.equal(got[0].tokens, got[1].tokens)
    torch.testing.assert_close(got[0].probs, got[1].probs)
