"""Every arm on the built-in model lumo-tiny (trained MTP layer and EAGLE head: drafts are really accepted):
greedy outputs token-identical to AR on held-out prompts, at batch 4, with multi-token acceptance."""

from __future__ import annotations

import json

import pytest
import torch

from lumotree.serving.builtin import BUILTIN
from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.sampler import SamplingParams

PATH = BUILTIN["tiny"]
pytestmark = pytest.mark.skipif(
    not (PATH / "config.json").is_file(), reason="built-in model not in this build"
)
ARMS = [
    ("mtp", {"mtp_k": 5}),
    ("eagle", {}),
    ("lumotree", {"tree": "hydra27"}),
    ("lumotree", {"tree": "adaptive"}),
]


@pytest.fixture(scope="module")
def setup():
    from lumotree.serving.loader import load_model
    from lumotree.serving.tokenizer import Tokenizer

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    model, _ = load_model(PATH, "cpu", torch.float32)
    tok = Tokenizer.from_pretrained(PATH)
    lines = [json.loads(x) for x in (PATH / "heldout_prompts.jsonl").read_text().splitlines()[:4]]
    prompts = [tok.encode(x["prompt"])[-160:] for x in lines]
    yield model, tok, prompts
    torch.set_num_threads(n)


def _run(setup, arm: str, opts: dict) -> Engine:
    model, tok, prompts = setup
    eng = Engine(
        model, tok, EngineConfig(model="tiny", arm=arm, arm_options=opts, max_seqs=4, max_model_len=320)
    )
    eng.results = eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True))
    eng.check_no_leaks()
    return eng


@pytest.fixture(scope="module")
def ar(setup) -> list[list[int]]:
    return [r.output_ids for r in _run(setup, "ar", {}).results]


@pytest.mark.parametrize("arm,opts", ARMS, ids=["mtp5", "eagle", "hydra27", "adaptive"])
def test_builtin_greedy_equals_ar_with_acceptance(setup, ar, arm: str, opts: dict) -> None:
    eng = _run(setup, arm, opts)
    assert [r.output_ids for r in eng.results] == ar
    c = eng.counters.as_dict()
    assert c["mean_acceptance_length"] > 2.0, c  # measured 4.4 (MTP-5) to 6.4 (adaptive) tokens per draft
