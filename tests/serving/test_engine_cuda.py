"""CUDA only: decode through captured CUDA graphs (padded batches) equals eager decode, token for token."""

from __future__ import annotations

import pytest
import torch

from lumotree.serving.engine import Engine, EngineConfig
from lumotree.serving.loader import load_model
from lumotree.serving.sampler import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                                    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=1.0,
                                                   seed=3, max_tokens=20, ignore_eos=True)])  # fmt: skip
def test_graph_decode_equals_eager(tiny_checkpoints, params: SamplingParams) -> None:
    model = load_model(tiny_checkpoints["gdn3_attn1"], "cuda", torch.float32)[0]
    outs = {}
    for graphs in (False, True):
        cfg = EngineConfig(device="cuda", max_seqs=4, max_model_len=128, cuda_graphs=graphs,
                           graph_batch_sizes=(1, 2, 4))  # fmt: skip
        eng = Engine(model, None, cfg)
        assert bool(eng.runner.graphs) == graphs, eng.runner.graph_error
        outs[graphs] = [r.output_ids for r in eng.generate(PROMPTS, params)]  # batch 3 pads to 4, then 2, 1
        eng.check_no_leaks()
    assert outs[True] == outs[False]
