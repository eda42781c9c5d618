"""``lumotree bench profile`` on CPU at tiny shapes: per-step times by operator, grouped, for two arms."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from lumotree.platform.benches.profile import device_gaps, group_of, summarize
from lumotree.platform.cli import app


def test_kernel_names_fall_in_their_groups() -> None:
    names = {
        "_tree_scan_kernel": "tree_scan",
        "fused_recurrent_gated_delta_rule_fwd_kernel": "gdn_native",
        "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": "gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64": "gemm",
        "_decode_attention_kernel": "attention",
        "_rms_norm_kernel": "norm",
        "void at::native::vectorized_elementwise_kernel<4, ...>": "elementwise_copy",
        "aten::mul": "torch_ops",
        "my_kernel": "other",
    }
    assert {n: group_of(n) for n in names} == names


def test_summary_is_per_step_and_sorted() -> None:
    s = summarize([("a_gemm", 4, 4000.0), ("_rms_norm_kernel", 8, 1000.0), ("idle", 2, 0.0)], steps=2, top=5)
    assert s["ms_per_step"] == 2.5 and [k["name"] for k in s["top"]] == ["a_gemm", "_rms_norm_kernel"]
    assert s["top"][0]["calls_per_step"] == 2 and s["groups_ms_per_step"] == {"gemm": 2.0, "norm": 0.5}


def test_device_gaps_merge_overlaps_and_name_both_sides() -> None:
    # two steps: draft kernels overlap (no gap), 30 us of host work before the verify, 5 us launch gaps
    ks = [(0.0, 10.0, "draft_a"), (5.0, 20.0, "draft_b"), (50.0, 60.0, "embed"), (65.0, 70.0, "gemm"),
          (100.0, 110.0, "draft_a"), (108.0, 120.0, "draft_b"), (150.0, 160.0, "embed")]  # fmt: skip
    g = device_gaps(ks, steps=2, top=5)
    assert g["busy_ms_per_step"] == (20 + 10 + 5 + 20 + 10) / 2e3
    assert g["idle_ms_per_step"] == (30 + 5 + 30 + 30) / 2e3
    assert [(r["after"], r["before"], r["per_step"]) for r in g["gaps"]] == [
        ("draft_b", "embed", 1.0),
        ("gemm", "draft_a", 0.5),
        ("embed", "gemm", 0.5),
    ]
    assert g["gaps"][0]["ms_per_step"] == 0.03 and g["gaps"][0]["max_us"] == 30
    assert device_gaps([], 1, 5)["gaps"] == []


def test_profile_command_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    base = ["bench", "profile", "--shapes", "tiny", "--device", "cpu"]
    args = [*base, "--arms", "ar,lumotree", "--steps", "2", "--warmup", "1", "--prompt-len", "24",
            "--top", "10", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert set(report["arms"]) == {"ar", "lumotree"} and report["run"]["command"]
    for r in report["arms"].values():
        assert r["ms_per_step"] > 0 and len(r["top"]) == 10
        assert abs(sum(r["groups_ms_per_step"].values()) - r["ms_per_step"]) < 1e-6 * r["ms_per_step"] + 1e-9
        times = [k["ms_per_step"] for k in r["top"]]
        assert times == sorted(times, reverse=True)
        assert r["device_gaps"] is None  # no device timeline on the CPU
    # a speculative step does more work than an AR step on the same model
    assert report["arms"]["lumotree"]["ms_per_step"] > report["arms"]["ar"]["ms_per_step"]
    bad = CliRunner().invoke(app, [*base, "--arms", "nope"])
    assert bad.exit_code != 0 and "unknown arm" in bad.output


def test_profile_of_the_built_in_checkpoint_on_cpu(tmp_path: Path) -> None:
    """``--model tiny``: the built-in model with its own MTP layer and EAGLE head, on a held-out prompt."""
    out = tmp_path / "p.json"
    args = ["bench", "profile", "--model", "tiny", "--device", "cpu", "--arms", "eagle,lumotree",
            "--steps", "2", "--warmup", "1", "--prompt-len", "48", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["model"] == "tiny" and report["shapes"] is None
    assert all(r["ms_per_step"] > 0 for r in report["arms"].values())
