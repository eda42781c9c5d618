"""End to end on Docker: ``lumotree sweep`` with an engine arm in a Ray actor on an astropy-synth task, then
``lumotree replay --from-sweep`` of what it recorded (a random tiny chat checkpoint stands in for the
model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_fixtures import docker_available, make_chat_checkpoint, serve, synth_instances_ready
from sqlalchemy import select

from lumotree.db import models as dbm
from lumotree.db.store import Store

CLI = "from lumotree.platform.cli import main; main()"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.skipif(not docker_available(), reason="no Docker daemon answers")
@pytest.mark.skipif(
    not synth_instances_ready(), reason="astropy-synth instances not generated (lumotree tasks list)"
)
def test_sweep_then_replay(tmp_path: Path) -> None:
    ckpt = make_chat_checkpoint(tmp_path / "model")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sweep = [sys.executable, "-c", CLI, "sweep", "--db", url, "--model", str(ckpt), "--arms", "ar"]
    sweep += ["--suite", "astropy-synth", "--limit", "1", "--attempts", "1", "--step-limit", "2"]
    sweep += ["--max-tokens", "16", "--device", "cpu", "--json"]
    with serve(ckpt) as server_url:  # the same model behind the OpenAI-compatible server: an external arm
        sweep += ["--arm-url", f"ext={server_url}"]
        done = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout)
    assert [a["arm"] for a in summary["arms"]] == ["ar", "ext"]
    assert all(a["done"] == 1 and a["requests"] >= 1 for a in summary["arms"])
    store = Store(url)
    with store.session() as s:
        rows = s.execute(select(dbm.Attempt, dbm.Arm.name).join(dbm.Arm)).all()
        for attempt, arm in rows:
            requests = s.scalars(select(dbm.Request).where(dbm.Request.attempt_id == attempt.id)).all()
            assert attempt.status == dbm.DONE and attempt.resolved is False  # a random model fixes nothing
            assert attempt.exit_status in ("step_limit", "context_length", "submitted")
            assert len(requests) == attempt.requests
            # Only the hosted arm knows the exact prompt token ids (what replay re-issues).
            assert all(bool(r.prompt_token_ids) == (arm == "ar") for r in requests)

    replay = [sys.executable, "-c", CLI, "replay", "--db", url, "--from-sweep", str(summary["sweep_id"])]
    replay += [
        "--source-arm",
        "ar",
        "--arms",
        "ar",
        "--runs",
        "3",
        "--max-tokens",
        "8",
        "--model",
        str(ckpt),
        "--device",
        "cpu",
    ]
    replay += ["--no-ray", "--json", "--out", str(tmp_path / "replay.json")]
    done = subprocess.run(replay, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["arms"]["ar"]["runs"] == 3 and report["arms"]["ar"]["pooled_tok_s"] > 0
    assert json.loads((tmp_path / "replay.json").read_text())["replay_id"] == report["replay_id"]
    assert len(report["runs"]) == 3
