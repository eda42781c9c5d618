"""The audits as CI runs them: quick runs pass on correct code, and broken primitives make them fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))


@pytest.fixture(scope="module")
def audit_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The built-in model when it ships in this build, else a random checkpoint written by transformers."""
    from lumotree.serving.builtin import resolve_model

    try:
        resolve_model("tiny")
        return "tiny"
    except FileNotFoundError:
        from checkpoints import LAYOUTS, write_checkpoint

        return str(
            write_checkpoint(tmp_path_factory.mktemp("ckpt") / "m", LAYOUTS["gdn3_attn1"], seed=0, mtp=True)
        )


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_g_test_accepts_the_right_distribution_and_rejects_a_shifted_one() -> None:
    from lumotree.platform.audits.stats import g_test

    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 1e-5])
    gen = torch.Generator().manual_seed(0)
    good = torch.bincount(torch.multinomial(p, 20000, replacement=True, generator=gen), minlength=5)
    assert g_test(good, p)[2] > 1e-3
    q = torch.tensor([0.45, 0.35, 0.15, 0.05, 1e-5])
    bad = torch.bincount(torch.multinomial(q, 20000, replacement=True, generator=gen), minlength=5)
    assert g_test(bad, p)[2] < 1e-6
    assert g_test(torch.tensor([5, 5, 0]), torch.tensor([0.5, 0.5, 0.0]))[2] == 1.0
    assert g_test(torch.tensor([5, 5, 1]), torch.tensor([0.5, 0.5, 0.0]))[2] == 0.0  # impossible token


def test_oracle_keeps_top_k_boundary_ties_and_applies_min_p() -> None:
    from lumotree.platform.audits.sampler_oracle import row_distribution

    logits = torch.tensor([3.0, 2.0, 1.0, 1.0, 0.0, -5.0])
    p = row_distribution(logits, None, 1.0, 3, 1.0, 0.0, 0.0)
    assert (p > 0).tolist() == [True, True, True, True, False, False]  # tokens 2 and 3 tie at k = 3
    p = row_distribution(logits, None, 1.0, -1, 1.0, 0.3, 0.0)  # keep logit >= 3 + log 0.3 = 1.796
    assert (p > 0).tolist() == [True, True, False, False, False, False]
    present = torch.tensor([True, False, False, False, False, False])
    p = row_distribution(logits, present, 0.0, -1, 1.0, 0.0, 1.5)  # greedy after the penalty: 2.0 wins
    assert int(p.argmax()) == 1 and float(p.max()) == 1.0


def test_gdn_audit_passes_and_catches_a_wrong_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    from lumotree.kernels import dispatch
    from lumotree.platform.audits.gdn import GdnAuditConfig, run_gdn_audit

    rep = run_gdn_audit(GdnAuditConfig(cases=4))
    assert rep.passed, rep.markdown()
    rows = rep.tables["schedules"]
    assert all(r["out_bad"] == 0 and r["state_eq"] == r["state_cells"] for r in rows)
    orig = dispatch.gdn_tree
    monkeypatch.setattr(
        dispatch,
        "gdn_tree",
        lambda q, k, v, g, b, parents, *a: orig(q, k, v, g, b, [-1, *range(len(parents) - 1)], *a),
    )
    assert not run_gdn_audit(GdnAuditConfig(cases=4)).passed


def test_cli_all_quick_passes_with_reports(audit_model: str, tmp_path: Path) -> None:
    """What CI runs: all three quick audits in one command (they must pass, faults included)."""
    from typer.testing import CliRunner

    from lumotree.platform.cli import app

    res = CliRunner().invoke(
        app, ["audit", "all", "--quick", "--model", audit_model, "--json", "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out) == {"gdn", "model", "sampler"} and all(r["passed"] for r in out.values())
    faults = out["model"]["tables"]["faults"]
    assert len(faults) == 10 and all(f["detected"] for f in faults)
    steps = out["sampler"]["tables"]["steps"]
    assert len(steps) == 6 and all(s["correct"] == "pass" for s in steps)
    for name in ("gdn", "model", "sampler"):
        assert (tmp_path / f"audit_{name}.json").is_file() and (tmp_path / f"audit_{name}.md").is_file()


def test_cli_exits_nonzero_when_the_commit_is_broken(
    audit_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that forgets to remap KV: the model audit's checks fail and the command exits 1."""
    from typer.testing import CliRunner

    from lumotree.platform.audits import faults
    from lumotree.platform.cli import app

    with faults.model_fault("kv_not_remapped"):
        res = CliRunner().invoke(
            app, ["audit", "model", "--quick", "--model", audit_model, "--out", str(tmp_path)]
        )
    assert res.exit_code == 1, res.output
    rep = json.loads((tmp_path / "audit_model.json").read_text())
    assert not rep["passed"]


def test_sampler_fault_is_detected_on_a_captured_step(audit_model: str) -> None:
    """Each sampler fault against one captured step: the correct walk passes, every fault fails."""
    from lumotree.platform.audits.capture import load, prefixes
    from lumotree.platform.audits.sampler import STEPS, SamplerAuditConfig, capture_step, run_walks, test_step
    from lumotree.platform.audits.sampler_faults import SAMPLER_FAULTS, sampler_fault

    cfg = SamplerAuditConfig(model=audit_model, vocab_cap=64, min_visits=1000)
    loaded = load(audit_model, "cpu")
    spec = STEPS[1]
    step = capture_step(loaded, spec, prefixes(loaded, 6, 24, 0)[spec.prefix], cfg)
    assert test_step(step, *run_walks(step, 12288, 4096, 1), cfg)["passed"]
    missed = []
    for f in SAMPLER_FAULTS:
        with sampler_fault(f):
            if test_step(step, *run_walks(step, 12288, 4096, 2), cfg)["passed"]:
                missed.append(f)
    assert not missed
