"""The engine end to end on random tiny checkpoints: greedy parity with transformers, continuous batching,
chunked prefill, seeded sampling, stop rules, capacity limits, cache leaks, and the tree path of the Arm
protocol driven by a scripted drafter (its output must equal AR's, token for token)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from lumotree.serving.arms import PrefillFeedback, StepFeedback
from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.loader import load_model
from lumotree.serving.request import Request
from lumotree.serving.sampler import SamplingParams
from lumotree.serving.tree import TreeDescriptor

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [3]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=1.0, max_tokens=10, seed=5,
                         ignore_eos=True)  # fmt: skip


@pytest.fixture(scope="module")
def model(tiny_checkpoints: dict[str, Path]):
    return load_model(tiny_checkpoints["gdn3_attn1"], "cpu", torch.float32)[0]


def make_engine(model, **kw) -> Engine:
    kw.setdefault("max_seqs", 4)
    kw.setdefault("max_model_len", 128)
    return Engine(model, None, EngineConfig(**kw))


@pytest.mark.usefixtures("hf_torch_fallback")
def test_greedy_matches_transformers_generate(model, tiny_checkpoints) -> None:
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(tiny_checkpoints["gdn3_attn1"], dtype=torch.float32).eval()
    prompt = PROMPTS[2]
    n = 24
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    eng = make_engine(model)
    got = eng.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0]
    assert got.output_ids == ref
    assert got.finish_reason == "length" and got.stats.decode_steps == n - 1
    eng.check_no_leaks()


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_batched_equals_alone(model, static: bool, params: SamplingParams) -> None:
    alone = [make_engine(model).generate([p], params)[0].output_ids for p in PROMPTS]
    eng = make_engine(model, static_decode=static, graph_batch_sizes=(1, 2))
    # Staggered arrivals: requests join a running batch (continuous batching).
    reqs = [eng.add_request(PROMPTS[0], params)]
    eng.step()
    eng.step()
    reqs += [eng.add_request(p, params) for p in PROMPTS[1:]]
    while eng.has_unfinished():
        eng.step()
    assert [r.output_ids for r in reqs] == alone
    eng.check_no_leaks()


def test_chunked_prefill_and_capacity_queueing(model) -> None:
    want = make_engine(model).generate(PROMPTS, GREEDY)
    # 3-token prefill chunks; a cache that holds only two requests at a time, so the rest wait.
    eng = make_engine(model, max_prefill_tokens=3, max_seqs=2, num_blocks=4, block_size=16, max_model_len=64)
    got = eng.generate(PROMPTS, GREEDY)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    eng.check_no_leaks()
    with pytest.raises(ValueError, match="prompt has"):
        eng.add_request(list(range(64)), GREEDY)


def test_seeds_reproduce_and_differ(model) -> None:
    eng = make_engine(model)
    a, b, c = eng.generate(
        [PROMPTS[0]] * 3, [SAMPLED, SAMPLED, SamplingParams(**{**SAMPLED.__dict__, "seed": 6})]
    )
    assert a.output_ids == b.output_ids != c.output_ids


def test_stop_rules(model) -> None:
    eng = make_engine(model)
    free = eng.generate([PROMPTS[1]], GREEDY)[0].output_ids
    stop_tok = free[5]
    first = free.index(stop_tok)
    r = eng.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=14, stop_token_ids=[stop_tok]))[
        0
    ]
    assert r.output_ids == free[: first + 1] and r.finish_reason == "stop"
    eng.eos_ids = frozenset({stop_tok})
    r = eng.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=14))[0]
    assert r.output_ids == free[: first + 1] and r.finish_reason == "stop"
    r = eng.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert len(r.output_ids) == 3 and r.finish_reason == "length"
    c = eng.counters
    assert c.prompt_tokens == 4 * len(PROMPTS[1]) and c.generation_tokens == 14 + 2 * (first + 1) + 3
    eng.check_no_leaks()


class ScriptedArm:
    """A drafter that knows a reference continuation: it proposes trees mixing right and wrong tokens.

    Shapes: a chain, and a tree whose root has a wrong first child, a right second child with a chain below,
    plus an inactive slot that carries the right token (the walk must never enter it).
    """

    name = "scripted"

    def __init__(self, reference: dict[str, list[int]], shape: str) -> None:
        self.reference = reference
        self.shape = shape
        self.steps = 0
        self.seen: list[StepFeedback] = []

    def max_tree_rows(self) -> int:
        return 8

    def start(self, engine) -> None:
        self.vocab = engine.model_config.vocab_size

    def on_prefill(self, feedback: PrefillFeedback) -> None:
        assert feedback.hidden.shape[0] == feedback.row_offsets[-1]

    def propose(self, requests: Sequence[Request]) -> list[TreeDescriptor]:
        self.steps += 1
        trees = []
        for r in requests:
            ref = self.reference[r.req_id]
            nxt = ref[len(r.output_ids) : len(r.output_ids) + 5]
            nxt = [t if (self.steps + j) % 4 else (t + 1) % self.vocab for j, t in enumerate(nxt)]
            if self.steps % 3 == 0 or not nxt:
                trees.append(TreeDescriptor.root(r.pending_token, r.context_len))
            elif self.shape == "chain":
                trees.append(
                    TreeDescriptor.build([r.pending_token] + nxt, range(-1, len(nxt)), r.context_len)
                )
            else:
                wrong = (nxt[0] + 7) % self.vocab
                toks = [r.pending_token, nxt[0], wrong, nxt[0]] + nxt[1:]
                parents = [-1, 0, 0, 0] + list(range(3, 3 + len(nxt) - 1))
                active = [True, False, True, True] + [True] * (len(nxt) - 1)
                trees.append(TreeDescriptor.build(toks, parents, r.context_len, active))
        return trees

    def on_step(self, feedback: StepFeedback) -> None:
        self.seen.append(feedback)
        for tree, acc in zip(feedback.trees, feedback.accepted, strict=True):
            assert all(tree.active_mask[i] for i in acc)

    def release(self, request: Request) -> None:
        pass


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculative_tree_path_reproduces_ar(model, shape: str, params: SamplingParams) -> None:
    ar = make_engine(model).generate(PROMPTS, params)
    reference = {f"req-{i}": r.output_ids for i, r in enumerate(ar)}
    arm = ScriptedArm(reference, shape)
    eng = Engine(model, None, EngineConfig(max_seqs=4, max_model_len=128), arm=arm)
    got = eng.generate(PROMPTS, params)
    assert [r.output_ids for r in got] == [r.output_ids for r in ar]
    c = eng.counters
    assert c.drafts > 0 and 0 < c.accepted_tokens < c.draft_tokens
    assert c.decode_steps < sum(len(r.output_ids) - 1 for r in ar) // 2 + 4  # fewer steps than AR's
    assert c.accepted_per_pos[0] >= c.accepted_per_pos[-1]
    eng.check_no_leaks()
