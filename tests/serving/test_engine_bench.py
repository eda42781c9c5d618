"""``lumotree bench engine`` runs end to end at tiny shapes on CPU and prints one JSON object."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lumotree.platform.cli import app


def test_engine_bench_tiny_cpu(tmp_path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "engine", "--shape", "tiny", "--batch", "1,2", "--steps", "4", "--prompt-len", "8",
            "--device", "cpu", "--dtype", "float32", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert [r["batch"] for r in report["results"]] == [1, 2]
    assert all(r["engine_step"]["median_ms"] > 0 and r["forward"]["n"] == 2 for r in report["results"])
    assert report["weight_bytes"] > 0 and report["floor_ms"] is None
