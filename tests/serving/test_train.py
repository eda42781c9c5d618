"""lumo-tiny training on CPU at test size: tokenizer, corpus split, loss falls, export loads in our loader and
in transformers with the same logits, MTP weights mean the same thing in training and serving."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from lumotree.serving.train.chats import agent_format, bare_agent_format, render_chat, transcript_messages
from lumotree.serving.train.config import CorpusConfig
from lumotree.serving.train.corpus import build_corpus, is_heldout
from lumotree.serving.train.tokenizer_train import SPECIAL_TOKENS, save_tokenizer, train_tokenizer

pytestmark = pytest.mark.usefixtures("hf_torch_fallback")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny CPU training run through the CLI (tokenizer, trunk + MTP, EAGLE, export)."""
    from lumotree.platform.cli import app
    from lumotree.serving.train.lm import use_torch_gdn

    use_torch_gdn()
    out = tmp_path_factory.mktemp("train")
    result = CliRunner().invoke(app, ["train", "all", "--out", str(out), "--tiny", "--steps", "16"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out


def test_tokenizer_specials_roundtrip_and_chat_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    text = ["def f(x):\n    return x + 1\n" * 20, "import os\nprint(os.getcwd())\n" * 20]
    tok = train_tokenizer(text, 300)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    sample = "class A:\n    def g(self):\n        return 'é'\n"
    assert tok.decode(tok.encode(sample).ids) == sample
    save_tokenizer(tok, tmp_path, 1024)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "```bash\nls\n```"}]
    ours = render_chat(messages, add_generation_prompt=True)
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == ours
    assert ours.endswith("<|im_start|>assistant\n")
    ids = tok.encode(ours).ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and tok.token_to_id("<|im_end|>") in ids
    assert hf.eos_token == "<|im_end|>"


def test_corpus_split_is_by_file_and_deterministic() -> None:
    cfg = CorpusConfig(max_total_bytes=300_000, heldout_percent=20)
    a, b = build_corpus(cfg, seed=0), build_corpus(cfg, seed=0)
    assert [f.key for f in a.files] == [f.key for f in b.files] and a.train_docs == b.train_docs
    assert all(f.heldout == is_heldout(f.key, 20) for f in a.files)
    held = {f.text for f in a.files if f.heldout}
    assert held and not held & {f.text for f in a.files if not f.heldout}
    assert not held & set(a.train_docs), "a held-out file leaked into training"
    m = a.manifest()
    assert m["train"]["files"] + m["heldout"]["files"] == len(a.files)


def test_bare_agent_format_matches_the_agent_config() -> None:
    """The GPU trainer has no pydantic: its reading of the agent format must equal the agent's own."""
    assert bare_agent_format() == agent_format()


def test_transcripts_show_real_command_output() -> None:
    text = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(30))
    for seed in range(8):
        msgs = transcript_messages("stdlib/pkg/mod.py", text, random.Random(seed))
        assert msgs[0]["content"].startswith(agent_format().system.split("\n")[0])
        for cmd, obs in zip(msgs[2::2], msgs[3::2], strict=False):
            out = obs["content"].split("<output>\n", 1)[1].rsplit("\n</output>", 1)[0]
            command = cmd["content"].split("```bash\n", 1)[1].split("\n```")[0]
            if command.startswith("sed -n"):
                a, b = map(int, command.split("'")[1].rstrip("p").split(","))
                assert out == "".join(text.splitlines(keepends=True)[a - 1 : b]).rstrip("\n")
            elif command.startswith("grep -n"):
                word = command.split("'")[1]
                assert all(word in line for line in out.splitlines())


def test_training_loss_falls(run_dir: Path) -> None:
    m = json.loads((run_dir / "metrics.json").read_text())
    for phase, key in (("model", "heldout_lm"), ("eagle", "heldout_loss")):
        hist = m[phase]["history"]
        assert hist[0]["step"] == 0
        first, last = hist[0][key], m[phase]["heldout"][key.removeprefix("heldout_")]
        assert last < first - 0.05, f"{phase}: held-out loss {first:.3f} -> {last:.3f} did not fall"
    assert m["model"]["heldout"]["ce1"] < m["model"]["history"][0]["heldout_ce1"]
    assert m["model"]["tokens_seen"] == 16 * 8 * 48


def test_export_layout_card_and_size(run_dir: Path) -> None:
    model = run_dir / "lumo-tiny"
    names = [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "eagle/config.json",
    ]
    names += ["eagle/model.safetensors", "heldout_prompts.jsonl", "MODEL_CARD.md"]
    for name in names:
        assert (model / name).is_file(), name
    m = json.loads((run_dir / "metrics.json").read_text())
    card = (model / "MODEL_CARD.md").read_text()
    for name, h in m["files"].items():
        if name != "MODEL_CARD.md":
            assert h["sha256"] in card, name
    assert m["shipped_bytes"] <= 16 * 1024 * 1024
    prompts = [json.loads(line) for line in (model / "heldout_prompts.jsonl").read_text().splitlines()]
    held = {k for k, h in json.loads((run_dir / "corpus_files.json").read_text()) if h}
    assert prompts and all(p["source"] in held for p in prompts)
    assert {p["kind"] for p in prompts} == {"code", "chat"}


def test_checkpoint_same_logits_in_transformers_our_loader_and_trainer(run_dir: Path) -> None:
    from transformers import Qwen3_5ForCausalLM

    from lumotree.serving.cache import CacheConfig, StateCaches
    from lumotree.serving.loader import load_model
    from lumotree.serving.train.export import load_checkpoint

    path = run_dir / "lumo-tiny"
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    hf = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
        lm = load_checkpoint(path, "cpu").eval()
        h_train = lm.hidden(torch.tensor([ids]))
        ours_train = lm.logits(h_train)[0].float()
    model, config = load_model(path, "cpu", torch.float32)
    caches = StateCaches(config, CacheConfig(max_seqs=2, num_blocks=32, block_size=8))
    caches.allocate(0, 0)
    hidden = model(caches.make_batch("prefill", [0], [ids], [0]), caches)
    ours_serving = model.compute_logits(hidden)
    scale = ref.abs().max().item()
    assert (ours_train - ref).abs().max().item() <= 1e-4 * scale
    assert (ours_serving - ref).abs().max().item() <= 1e-4 * scale
    # MTP: row t takes embed(token t+1) and the trunk hidden at t, in training and in serving alike.
    with torch.no_grad():
        mtp_train = lm.mtp_step(lm.embed(torch.tensor([ids[1:]])), h_train[:, :-1])[0]
    caches.allocate(1, 0)
    mtp_serving = model.forward_mtp(caches.make_batch("prefill", [1], [ids[1:]], [0]), hidden[:-1], caches)
    assert (mtp_serving - mtp_train).abs().max().item() <= 1e-4 * mtp_train.abs().max().item()
