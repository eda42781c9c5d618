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


VERIFY_PARAMS = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
                 SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, presence_penalty=1.0,
                                seed=5, max_tokens=40, ignore_eos=True)]  # fmt: skip


@pytest.mark.parametrize("params", VERIFY_PARAMS, ids=["greedy", "sampled"])
@pytest.mark.parametrize("arm,opts", [("mtp", {"mtp_k": 3}), ("eagle", {}), ("lumotree", {"tree": "hydra27"}),
                                      ("lumotree", {"tree": "adaptive"})])  # fmt: skip
def test_graph_verify_and_commit_equal_eager(tmp_path, arm: str, opts: dict, params: SamplingParams) -> None:
    """Speculative steps whose tree forward, walk and commit replay as CUDA graphs emit what eager steps
    emit."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _arms_fixtures import write_arms_checkpoint

    ckpt = write_arms_checkpoint(tmp_path / "model")
    model = load_model(ckpt, "cuda", torch.float32)[0]
    if arm == "eagle":
        opts = {**opts, "eagle_path": str(ckpt / "eagle")}
    prompts = [[5, 6, 7, 8, 9, 10] * 4, [20, 21, 22, 23] * 5 + [1], [7] * 10]
    outs = {}
    for graphs in (False, True):
        cfg = EngineConfig(arm=arm, arm_options=opts, device="cuda", max_seqs=4, max_model_len=128,
                           cuda_graphs=graphs, graph_batch_sizes=(1, 2, 4))  # fmt: skip
        eng = Engine(model, None, cfg)
        outs[graphs] = [r.output_ids for r in eng.generate(prompts, params)]
        if graphs:
            captured = [t for t in eng.runner.tree_graphs.values() if t.graph is not None]
            assert captured and all(t.commit_graph is not None for t in captured)
            fn = eng.runner.fn_graphs
            walks = [e for k, e in fn.entries.items() if k[0] == "walk"] if fn is not None else []
            assert walks and all(e is not None and e.graph is not None for e in walks), "walks captured"
        eng.check_no_leaks()
    assert outs[True] == outs[False]
