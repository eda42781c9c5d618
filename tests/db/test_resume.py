"""SIGKILL a worker process mid-sweep, resume in another: every attempt done exactly once, no stray rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from lumotree.db import models as m
from lumotree.db.store import AttemptResult, RequestRecord, Store

WORKER = """
import sys, time
from lumotree.db.store import AttemptResult, RequestRecord, Store
store = Store(sys.argv[1])
sweep = int(sys.argv[2])
while (claim := store.claim_attempt(sweep, "victim", lease_seconds=1.0)) is not None:
    for i in range(2):
        store.record_request(claim.attempt_id, RequestRecord(index=i, completion_tokens=1))
        print("request", claim.attempt_id, i, flush=True)
        time.sleep(0.05)
    store.finish_attempt(claim.attempt_id, "victim", AttemptResult(resolved=True, requests=2))
    print("done", claim.attempt_id, flush=True)
"""


def test_sigkill_mid_sweep_then_resume(store: Store, db_url: str, tmp_path: Path) -> None:
    sweep = store.create_sweep("resume", {})
    arms = [store.upsert_arm(sweep, name) for name in ("ar", "mtp")]
    tasks = [store.upsert_task("s", f"t{i}") for i in range(4)]
    store.plan_attempts(sweep, arms, tasks, 2)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen(
        [sys.executable, str(script), db_url, str(sweep)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    seen_done = 0
    # Kill it between two requests of an attempt, after it finished a few.
    for line in proc.stdout:
        seen_done += line.startswith("done")
        if seen_done >= 3 and line.startswith("request") and line.split()[2] == "0":
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert store.progress(sweep)["running"] == 1

    # Resume: the killed attempt's lease expires and it is run again, with its half-written requests gone.
    deadline = time.monotonic() + 30
    while store.progress(sweep)["done"] < 16 and time.monotonic() < deadline:
        claim = store.claim_attempt(sweep, "resumer")
        if claim is None:
            time.sleep(0.2)
            continue
        for i in range(2):
            store.record_request(claim.attempt_id, RequestRecord(index=i, completion_tokens=1))
        assert store.finish_attempt(claim.attempt_id, "resumer", AttemptResult(resolved=True, requests=2))
    assert store.progress(sweep) == {
        "pending": 0,
        "running": 0,
        "done": 16,
        "error": 0,
        "total": 16,
        "resolved": 16,
    }
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(m.Attempt)) == 16
        assert s.scalar(select(func.count()).select_from(m.Request)) == 32  # 2 per attempt, none duplicated
        tries = s.scalars(select(m.Attempt.tries).order_by(m.Attempt.id)).all()
        assert sorted(tries) == [1] * 15 + [2]
