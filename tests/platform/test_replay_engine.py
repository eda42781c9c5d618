"""Replay through the real engine on CPU: a random small Qwen3.5 checkpoint (written by transformers), every
arm this build has, 3 runs, checked against the engine's own per-request results and stored in the db."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from lumotree.db import queries
from lumotree.db.store import Store
from lumotree.platform.actors import ArmHost
from lumotree.platform.replay import CorpusRequest, run_replay, summarize_replay
from lumotree.platform.sweep_config import SERVING_ARMS, ArmSpec

SERVING_TESTS = Path(__file__).resolve().parents[1] / "serving"


def available_arms() -> list[str]:
    import importlib

    from lumotree.serving.arms import ARMS

    out = []
    for name in SERVING_ARMS:
        try:
            importlib.import_module(ARMS[name].split(":")[0])
            out.append(name)
        except ModuleNotFoundError:
            pass
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The arm tests' checkpoint: random trunk, mtp.* weights and an EAGLE head in eagle/, so every arm runs.
    sys.path.insert(0, str(SERVING_TESTS))
    from _arms_fixtures import write_arms_checkpoint

    return write_arms_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")


def engine_llm(path: Path, arm: str):  # -> LLM
    """The engine over the checkpoint without a tokenizer (replay needs token ids only)."""
    import torch

    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.llm import LLM
    from lumotree.serving.loader import load_model

    model, _ = load_model(path, device=torch.device("cpu"), dtype=None)
    return LLM.from_engine(
        Engine(model, None, EngineConfig(model=str(path), arm=arm, device="cpu", max_seqs=2))
    )


def test_replay_on_engine_arms(checkpoint: Path, tmp_path: Path) -> None:
    arms = available_arms()
    assert "ar" in arms
    rng = random.Random(0)
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "presence_penalty": 0.0}
    corpus = [
        CorpusRequest(f"r{i}", [rng.randrange(1, 290) for _ in range(12 + i)], greedy) for i in range(3)
    ]
    hosts = {a: ArmHost(ArmSpec(name=a, model=str(checkpoint)), llm=engine_llm(checkpoint, a)) for a in arms}
    results = run_replay(corpus, hosts, runs=3, max_tokens=8, ignore_eos=True)
    assert [(r.run_index, r.arm) for r in results] == [(run, a) for run in range(3) for a in arms]
    for r in results:
        assert r.requests == 3 and r.stats.tokens == 3 * 8 and r.stats.decode_seconds > 0
    # Independent reference: the engine's own per-request results for the same prompts.
    llm = hosts["ar"].llm
    from lumotree.serving.sampler import SamplingParams

    direct = llm.generate(
        [c.prompt_token_ids for c in corpus], SamplingParams(max_tokens=8, ignore_eos=True, **greedy)
    )
    assert sum(g.num_tokens for g in direct) == 24
    assert all(g.steps == 8 and g.drafts == 0 for g in direct)  # AR: one token per forward, no drafts
    summary = summarize_replay(results)
    ar = summary["arms"]["ar"]
    assert ar["steps"] == 3 * 3 * 7 and ar["acceptance_length"] is None
    assert ar["tok_s_min"] <= ar["pooled_tok_s"] <= ar["tok_s_max"]
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    replay_id = store.create_replay("test", {"arms": arms})
    for r in results:
        store.record_replay_result(replay_id, r.arm, r.run_index, **r.as_row())
    with store.session() as s:
        detail = queries.replay_detail(s, replay_id)
    assert detail is not None and len(detail["results"]) == 3 * len(arms)


def test_replay_cli_passes_arm_options_to_the_engine(tmp_path: Path) -> None:
    """``lumotree replay --mtp-k 2 --draft-vocab 64`` on the built-in model: the options reach the arm (its
    step drafts two tokens) and the report records them."""
    import json

    from typer.testing import CliRunner

    from lumotree.platform.cli import app

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "prompt_token_ids": [5, 6, 7, 8] * 3}) + "\n")
    args = ["replay", "--corpus", str(corpus), "--arms", "mtp", "--runs", "1", "--max-tokens", "6",
            "--ignore-eos", "--no-ray", "--device", "cpu", "--mtp-k", "2", "--draft-vocab", "64",
            "--db", f"sqlite:///{tmp_path / 'r.db'}", "--out", str(tmp_path / "r.json")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["config"]["options"] == {"device": "cpu", "mtp_k": 2, "draft_vocab": 64}
    run = report["runs"][0]
    assert run["arm"] == "mtp" and run["extra"]["draft_tokens"] == 2 * run["extra"]["drafts"] > 0
