"""Exports: mini-swe-agent trajectories, the append-only event log, SWE-bench predictions, summary tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
from swebench.harness.run_evaluation import get_dataset_from_preds
from swebench.harness.utils import get_predictions_from_file
from typer.testing import CliRunner

from lumotree.dashboards.export import TRAJECTORY_FORMAT
from lumotree.db.store import AttemptResult, Store
from lumotree.db.synthetic import SyntheticSweep, fill_synthetic_sweep
from lumotree.platform.cli import app


def _export(db_url: str, sweep: int, fmt: str, out: Path) -> None:
    result = CliRunner().invoke(
        app, ["export", "--sweep", str(sweep), "--format", fmt, "--out", str(out), "--db", db_url]
    )
    assert result.exit_code == 0, result.output


def test_traj_files_follow_mini_swe_agent(store: Store, db_url: str, tmp_path: Path) -> None:
    sweep = fill_synthetic_sweep(store, SyntheticSweep(tasks=2, attempts=1, requests_per_attempt=2))
    _export(db_url, sweep, "traj", tmp_path)
    files = sorted(tmp_path.glob("traj/*/attempt-*/*/*.traj.json"))
    assert len(files) == 8
    for path in files:
        traj = json.loads(path.read_text())
        assert traj["trajectory_format"] == TRAJECTORY_FORMAT == "mini-swe-agent-1"
        assert path.name == f"{traj['instance_id']}.traj.json" and path.parent.name == traj["instance_id"]
        info = traj["info"]
        assert set(info) >= {"exit_status", "submission", "model_stats"}
        assert info["model_stats"]["api_calls"] == 2 and info["model_stats"]["instance_cost"] == 0.0
        assert info["submission"].startswith("diff --git") and info["exit_status"] in (
            "Submitted",
            "LimitsExceeded",
        )
        assert [m["role"] for m in traj["messages"]] == ["assistant", "assistant"]
        assert all(isinstance(m["content"], str) for m in traj["messages"])
        stats = info["lumotree"]
        assert len(stats["per_request"]) == 2 and stats["arm"] == path.parts[-4]


def test_events_log_is_append_only(store: Store, db_url: str, tmp_path: Path) -> None:
    sweep = store.create_sweep("ev", {})
    arm = store.upsert_arm(sweep, "ar")
    task = store.upsert_task("s", "i")
    store.plan_attempts(sweep, [arm], [task], 1)
    claim = store.claim_attempt(sweep, "w")
    assert claim is not None
    store.record_event(claim.attempt_id, "message", {"role": "system", "content": "hi"})
    _export(db_url, sweep, "jsonl", tmp_path)
    first = (tmp_path / "events.jsonl").read_text()
    store.record_event(claim.attempt_id, "command", {"command": "ls", "output": ""})
    _export(db_url, sweep, "jsonl", tmp_path)
    text = (tmp_path / "events.jsonl").read_text()
    assert text.startswith(first)  # appended, earlier lines untouched
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(e["seq"], e["kind"]) for e in lines] == [(0, "message"), (1, "command")]
    assert (
        lines[0]["instance_id"] == "i"
        and lines[0]["arm"] == "ar"
        and lines[0]["attempt_id"] == claim.attempt_id
    )


def test_predictions_load_in_swebench(store: Store, db_url: str, tmp_path: Path, shared_data: Path) -> None:
    dataset = shared_data / "swebench" / "astropy.jsonl"
    instances = [json.loads(line) for line in dataset.read_text().splitlines()[:3]]
    sweep = store.create_sweep("preds", {})
    arms = [store.upsert_arm(sweep, name) for name in ("ar", "lumotree")]
    tasks = [store.upsert_task("astropy", inst["instance_id"], inst) for inst in instances]
    store.plan_attempts(sweep, arms, tasks, 1)
    while (claim := store.claim_attempt(sweep, "w")) is not None:
        patch = f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+{claim.arm_name}\n"
        store.finish_attempt(claim.attempt_id, "w", AttemptResult(resolved=False, patch=patch))
    _export(db_url, sweep, "preds", tmp_path)
    files = sorted((tmp_path / "preds").glob("*.jsonl"))
    assert [f.name for f in files] == ["ar__attempt-0.jsonl", "lumotree__attempt-0.jsonl"]
    for path in files:
        # The harness's own loading path: predictions file -> {instance_id: pred} -> instances to evaluate.
        preds = get_predictions_from_file(str(path), str(dataset), "test")
        assert all(set(p) == {"instance_id", "model_name_or_path", "model_patch"} for p in preds)
        by_id = {p["instance_id"]: p for p in preds}
        selected = get_dataset_from_preds(str(dataset), "test", [], by_id, "lumotree-test", False)
        assert sorted(i["instance_id"] for i in selected) == sorted(i["instance_id"] for i in instances)
        assert (
            len({p["model_name_or_path"] for p in preds}) == 1 and "/" not in preds[0]["model_name_or_path"]
        )
        arm = path.name.split("__")[0]
        assert all(p["model_patch"].endswith(f"+{arm}\n") for p in preds)


def test_summary_tables_csv_and_parquet(store: Store, db_url: str, tmp_path: Path) -> None:
    sweep = store.create_sweep("tab", {})
    arm = store.upsert_arm(sweep, "mtp")
    tasks = [store.upsert_task("s", f"i{i}") for i in range(3)]
    store.plan_attempts(sweep, [arm], tasks, 1)
    for resolved in (True, False):
        claim = store.claim_attempt(sweep, "w")
        assert claim is not None
        store.finish_attempt(
            claim.attempt_id,
            "w",
            AttemptResult(resolved=resolved, completion_tokens=100, decode_seconds=4.0, decode_tok_s=25.0),
        )
    _export(db_url, sweep, "csv", tmp_path)
    _export(db_url, sweep, "parquet", tmp_path)
    with (tmp_path / "attempts.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and sorted(r["status"] for r in rows) == ["done", "done", "pending"]
    arms = pq.read_table(tmp_path / "arms.parquet").to_pylist()
    assert len(arms) == 1 and arms[0]["resolved"] == 1 and arms[0]["done"] == 2
    assert arms[0]["decode_tok_s"] == 25.0 and 0 < arms[0]["solve_low"] < 0.5 < arms[0]["solve_high"] < 1
    assert pq.read_table(tmp_path / "attempts.parquet").num_rows == 3


def test_export_errors(db_url: str, tmp_path: Path, store: Store) -> None:
    result = CliRunner().invoke(
        app, ["export", "--sweep", "42", "--format", "csv", "--out", str(tmp_path), "--db", db_url]
    )
    assert result.exit_code == 1 and "not found" in result.output
    result = CliRunner().invoke(
        app, ["export", "--sweep", "1", "--format", "xml", "--out", str(tmp_path), "--db", db_url]
    )
    assert result.exit_code == 2
