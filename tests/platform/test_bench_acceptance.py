"""``lumotree bench acceptance`` on the built-in model: a few held-out prompts, 16 greedy tokens per arm.

The report's figures are checked against their definitions recomputed from the raw counters, the greedy
equality check against real speculative outputs (and shown to catch a changed token), the prompt feeding
against the tokenizer's chat template, and ``--record`` against a copy of the model directory (the shipped
card is never touched by tests)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from lumotree.platform.benches.acceptance import (
    AcceptanceConfig,
    Prompt,
    load_prompts,
    mismatches,
    run,
)
from lumotree.serving.builtin import BUILTIN

PATH = BUILTIN["tiny"]
pytestmark = pytest.mark.skipif(
    not (PATH / "config.json").is_file(), reason="built-in model not in this build"
)
SPEC = ["mtp", "eagle", "lumotree", "lumotree-adaptive"]


@pytest.fixture(scope="module")
def report() -> dict:
    # Prompts 0, 1 are agent chats and 2 is code: both kinds, mixed in one continuous batch of 2.
    cfg = AcceptanceConfig(arms=["ar", *SPEC], limit=3, max_tokens=16, batch=2, device="cpu", threads=1)
    return run(cfg)


def test_report_fields_follow_their_definitions(report: dict) -> None:
    assert report["ok"] and report["mismatched_prompts"] == 0
    assert report["prompts"]["count"] == 3 and report["prompts"]["kinds"] == {"chat": 2, "code": 1}
    assert report["command"].startswith("lumotree bench acceptance --model tiny --arms ar,mtp,eagle")
    assert list(report["arms"]) == ["ar", *SPEC]
    ar = report["arms"]["ar"]
    assert ar["drafts"] == ar["accepted_tokens"] == 0 and ar["tokens_per_step"] == 1.0
    # Without EOS cut, AR takes one verify step per token after the prefill's first token.
    if ar["finish_reasons"] == {"length": 3}:
        assert ar["verify_steps"] == 3 * 15 and ar["generated_tokens"] == 48
    for name in SPEC:
        a = report["arms"][name]
        assert a["greedy_equal_ar"] and a["mismatches"] == [], (name, a["mismatches"])
        assert a["generated_tokens"] == ar["generated_tokens"]
        assert a["accepted_per_step"] == pytest.approx(a["accepted_tokens"] / a["verify_steps"])
        assert a["tokens_per_step"] == pytest.approx(1 + a["accepted_per_step"])
        assert a["acceptance_rate"] == pytest.approx(a["accepted_tokens"] / a["draft_tokens"])
        assert a["acceptance_length"] == pytest.approx(1 + a["accepted_tokens"] / a["drafts"])
        pos = a["per_position_acceptance"]
        # A draft at depth d is accepted only if its parent at depth d - 1 was: rates never rise with depth.
        assert all(x >= y for x, y in zip(pos, pos[1:], strict=False)) and 0 < pos[0] <= 1
        assert sum(pos) * a["drafts"] == pytest.approx(a["accepted_tokens"])
        # Every accepted draft is emitted except past the length cut: at most 1 + accepted tokens per step.
        assert a["emitted_per_step"] <= a["tokens_per_step"] + 1e-9
        assert a["verify_steps"] < ar["verify_steps"] and a["tokens_per_step"] > 1.5, (name, a)
        assert a["decode_tok_s"] > 0 and a["wall_seconds"] > 0
        kinds = a["by_kind"]
        assert sum(k["verify_steps"] for k in kinds.values()) == a["verify_steps"]


def test_mismatch_check_catches_a_changed_token(report: dict) -> None:
    ps = [Prompt(f"p{i}", "code", [1]) for i in range(3)]
    ref = [[5, 6, 7, 8], [1, 2], [3]]
    assert mismatches(ps, ref, [list(r) for r in ref]) == []
    bad = mismatches(ps, ref, [[5, 6, 9, 8], [1, 2, 4], [3]])
    assert [(m["id"], m["index"], m["ar_token"], m["arm_token"]) for m in bad] == [
        ("p0", 2, 7, 9),
        ("p1", 2, None, 4),
    ]


def test_chat_prompts_are_fed_through_the_chat_template(tmp_path) -> None:
    from lumotree.serving.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(PATH)
    rows = [json.loads(x) for x in (PATH / "heldout_prompts.jsonl").read_text().splitlines()[:3]]
    chats = [r for r in rows if r["kind"] == "chat"]
    assert chats, "the held-out prompts start with agent chats"
    only_messages = tmp_path / "m.jsonl"
    only_messages.write_text(
        "".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in chats)
    )
    fed = load_prompts(PATH / "heldout_prompts.jsonl", tok, 3)
    rendered = load_prompts(only_messages, tok, None)
    by_id = {p.id: p.token_ids for p in fed}
    for p in rendered:
        assert p.token_ids == by_id[p.id]
        assert p.token_ids[0] == tok.encode("<|im_start|>")[0]  # special tokens parsed, not spelled out


def test_cli_writes_json_and_records_into_a_model_copy(tmp_path) -> None:
    from typer.testing import CliRunner

    from lumotree.platform.cli import app

    shipped = (PATH / "metrics.json").read_bytes()
    model = tmp_path / "lumo-tiny"
    shutil.copytree(PATH, model)
    out = tmp_path / "acc.json"
    args = ["bench", "acceptance", "--model", str(model), "--arms", "ar,lumotree", "--limit", "2"]
    args += ["--max-tokens", "8", "--batch", "2", "--device", "cpu", "--threads", "1"]
    res = CliRunner().invoke(app, [*args, "--json", "--out", str(out), "--record"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["ok"] and set(report["arms"]) == {"ar", "lumotree"}
    acc = json.loads((model / "metrics.json").read_text())["acceptance"]
    row = acc["lumotree hydra27"]
    assert row["tokens_per_step"] == report["arms"]["lumotree"]["tokens_per_step"]
    assert row["command"] == report["command"] and row["prompts"] == 2
    card = (model / "MODEL_CARD.md").read_text()
    assert f"| lumotree hydra27 | {row['tokens_per_step']:.2f} | {row['acceptance_rate']:.3f} |" in card
    digest = hashlib.sha256((model / "metrics.json").read_bytes()).hexdigest()
    assert f"`{digest}`" in card  # the card's hash table was rewritten with the new metrics.json
    assert (PATH / "metrics.json").read_bytes() == shipped
    # A saved report records without measuring again, under its own settings: the same row comes back.
    (model / "metrics.json").write_text(json.dumps({**json.loads(shipped), "acceptance": None}))
    res = CliRunner().invoke(app, ["bench", "acceptance", "--from-report", str(out), "--record"])
    assert res.exit_code == 0, res.output
    assert json.loads((model / "metrics.json").read_text())["acceptance"]["lumotree hydra27"] == row
