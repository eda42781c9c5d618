"""``lumotree bench arms`` smoke test at tiny shapes on the CPU: every arm and tree shape is timed, the JSON
has the ratios and spans the GPU run reports."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner


def test_bench_arms_tiny_cpu(tmp_path: Path) -> None:
    from lumotree.platform.cli import app

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = ["bench", "arms", "--shapes", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
                "--iters", "1", "--prompt-len", "16", "--draft-vocab", "64", "--rounds", "2",
                "--out", str(tmp_path / "a.json")]  # fmt: skip
        res = CliRunner().invoke(app, args)
    finally:
        torch.set_num_threads(n)
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "a.json").read_text())
    spec = ("mtp5", "eagle", "lumotree")
    assert set(rep["arms"]) == {"ar", *spec, *(f"{a}_dv" for a in spec)}
    assert [rep["arms"][a]["verify_rows"] for a in ("ar", "mtp5", "eagle", "lumotree")] == [1, 6, 8, 32]
    for a in rep["arms"].values():
        assert (
            a["step"]["n"] == 2
            and a["step"]["median_ms"] > 0
            and set(a["spans_mean_ms"]) >= {"drafting", "target_forward"}
        )
        assert a["graph_error"] is None and "failed_capture_retried" not in a
        assert 1 <= a["tokens_per_step"] <= a["verify_rows"]  # a step commits the root at least
    assert rep["arms"]["ar"]["tokens_per_step"] == 1
    assert (
        rep["arms"]["lumotree"]["spans_mean_ms"]["commit"] > 0
        and rep["arms"]["ar"]["spans_mean_ms"]["commit"] == 0
    )
    assert set(rep["trees"]) == {f"{k}{n}" for k in ("chain", "bushy") for n in (8, 16, 32, 64)} | {"hydra27"}
    assert rep["trees"]["chain64"]["max_depth"] == 63 and rep["trees"]["bushy64"]["max_depth"] == 3
    assert all(v["graph_error"] is None and "failed_capture_retried" not in v for v in rep["trees"].values())
    assert rep["ratios"]["lumotree_over_ar"] > 0 and "LumoTree/AR" in res.output
    assert rep["ratios"]["lumotree_dv_over_mtp5_dv"] > 0 and rep["draft_vocab"] == 64
    assert (
        rep["rounds"] == 2
        and rep["run"]["commit"]
        and rep["run"]["device"] == "cpu"
        and rep["run"]["seconds"] >= 0
    )


def test_bench_arms_rejects_more_rounds_than_steps() -> None:
    from lumotree.platform.cli import app

    res = CliRunner().invoke(app, ["bench", "arms", "--shapes", "tiny", "--device", "cpu", "--steps", "2",
                                   "--rounds", "3"])  # fmt: skip
    assert res.exit_code != 0 and "--rounds must be between 1 and --steps (2), got 3" in res.output
