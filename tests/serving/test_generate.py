"""``lumotree generate --json`` and the ``LLM`` facade on a random tiny checkpoint with a tokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lumotree.platform.cli import app
from lumotree.serving.engine import EngineConfig
from lumotree.serving.llm import LLM
from lumotree.serving.sampler import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from _chat_checkpoint import chat_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoints, tmp_path_factory) -> Path:
    return chat_checkpoint(tiny_checkpoints["alternating"], tmp_path_factory.mktemp("gen") / "ckpt")


def run_cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["generate", *args])
    return res.exit_code, res.output


def test_generate_json_matches_llm(ckpt: Path) -> None:
    args = ["--model", str(ckpt), "--prompt", "def add(a, b):", "--max-tokens", "9", "--device", "cpu",
            "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--presence-penalty", "1.0",
            "--seed", "4", "--ignore-eos", "--json"]  # fmt: skip
    code, out = run_cli(*args)
    assert code == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    for key in ("arm", "text", "token_ids", "num_tokens", "steps", "decode_seconds", "decode_tok_s",
                "accepted_per_step", "tokens_per_step", "acceptance_rate"):  # fmt: skip
        assert key in got, key
    assert (
        got["arm"] == "ar" and got["num_tokens"] == 9 and got["steps"] == 9 and got["tokens_per_step"] == 1.0
    )
    assert got["acceptance_rate"] == 0.0 and got["decode_tok_s"] > 0

    llm = LLM(EngineConfig(model=str(ckpt), device="cpu", max_seqs=2))
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=1.0, seed=4, max_tokens=9,
                            ignore_eos=True)  # fmt: skip
    want = llm.generate("def add(a, b):", params)[0]
    assert got["token_ids"] == want.token_ids and got["text"] == want.text
    counters = llm.counters()
    assert counters["generation_tokens"] == 9 and counters["decode_steps"] == 8

    chat = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=5))
    assert chat.message["role"] == "assistant" and 1 <= chat.num_tokens <= 5


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "{empty}"], "has no config.json"),
        (["--model", "/no/such/dir"], "no such directory"),
        (["--temperature", "-1"], "temperature"),
        (["--arm", "nope"], "unknown arm"),
    ],
)
def test_generate_errors_are_clear(ckpt: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    # A checkpoint folder with weights but no config.json: the error must name the missing file.
    (tmp_path / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes())
    base = ["--model", str(ckpt), "--prompt", "x", "--device", "cpu"]
    code, out = run_cli(*base, *[a.format(empty=tmp_path) for a in args])
    assert code == 2 and needle in " ".join(out.split()), out


def test_generate_builtin_lumotree_accepts_several_tokens_per_step() -> None:
    """The shipped model through the LumoTree arm: on a repetitive prompt the suffix drafts are accepted."""
    prompt = "x = 1\ny = 2\n" * 8
    code, out = run_cli("--model", "tiny", "--arm", "lumotree", "--prompt", prompt, "--max-tokens", "16",
                        "--device", "cpu", "--ignore-eos", "--json")  # fmt: skip
    assert code == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert got["arm"] == "lumotree" and got["model"] == "lumo-tiny" and got["num_tokens"] == 16
    for key in ("accepted_per_step", "tokens_per_step", "acceptance_rate"):
        assert key in got, key
    assert got["tokens_per_step"] > 1.0 and got["steps"] < got["num_tokens"]
    assert 0.0 < got["acceptance_rate"] <= 1.0
    assert got["accepted_per_step"] > 0
    assert got["accepted_per_step"] == pytest.approx(got["accepted_tokens"] / (got["steps"] - 1))
    assert got["tokens_per_step"] == pytest.approx(got["num_tokens"] / got["steps"])


def test_generate_draft_vocab_keeps_the_greedy_text() -> None:
    """``--draft-vocab`` narrows what the drafter may propose; greedy output stays the AR output."""
    prompt = "x = 1\ny = 2\n" * 4
    outs = {}
    for extra in ([], ["--draft-vocab", "512"]):
        code, out = run_cli("--model", "tiny", "--arm", "mtp", "--prompt", prompt, "--max-tokens", "12",
                            "--device", "cpu", "--ignore-eos", "--json", *extra)  # fmt: skip
        assert code == 0, out
        outs[bool(extra)] = json.loads(out.strip().splitlines()[-1])
    assert outs[True]["token_ids"] == outs[False]["token_ids"]
    code, out = run_cli("--model", "tiny", "--prompt", "x", "--device", "cpu", "--draft-vocab", "-1")
    assert code == 2 and "draft-vocab" in out
