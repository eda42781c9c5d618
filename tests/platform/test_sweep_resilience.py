"""Sweeps survive failures: the orchestrator SIGKILLed mid-sweep and resumed (SQLite, and PostgreSQL when
LUMOTREE_TEST_PG_URL is set), and an arm actor killed mid-sweep (restarted by Ray, its attempt retried).

One Ray instance serves the whole module; the CLI runs join it with --ray-address."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sweep_helpers import FIX, NOOP, bash, check_sweep, script

from lumotree.agents.clients import ActorModel
from lumotree.db import models as dbm
from lumotree.db.store import Store
from lumotree.platform.actors import start_arm_actors
from lumotree.platform.orchestrator import Orchestrator
from lumotree.platform.sweep_config import ArmSpec, SweepConfig
from lumotree.platform.task_backends import LocalToyBackend

CLI = "from lumotree.platform.cli import main; main()"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    import ray

    from lumotree.platform.ray_runtime import init_ray

    init_ray()
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def db_urls() -> list:
    urls = [pytest.param("sqlite", id="sqlite")]
    pg = os.environ.get("LUMOTREE_TEST_PG_URL")
    urls.append(
        pytest.param(
            pg, id="postgres", marks=[pytest.mark.postgres, pytest.mark.skipif(not pg, reason="no PG URL")]
        )
    )
    return urls


def _count(store: Store, sweep_id: int, status: str) -> int:
    with store.session() as s:
        return int(
            s.scalar(
                select(func.count()).where(dbm.Attempt.sweep_id == sweep_id, dbm.Attempt.status == status)
            )
            or 0
        )


@pytest.mark.parametrize("db", db_urls())
def test_sigkill_orchestrator_then_resume(tmp_path: Path, ray_address: str, db: str) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}" if db == "sqlite" else db
    (tmp_path / "fix.json").write_text(json.dumps({"replies": script(FIX, 1.0), "delay_s": 0.1}))
    (tmp_path / "noop.json").write_text(json.dumps(script(NOOP, 1.0)))
    name = f"sigkill-{os.getpid()}-{time.time_ns()}"
    cli = [sys.executable, "-c", CLI, "sweep", "--db", url, "--ray-address", ray_address]
    args = [
        "--arms",
        "",
        "--arm-script",
        "fix=fix.json",
        "--arm-script",
        "noop=noop.json",
        "--suite",
        "local-toy",
    ]
    args += ["--limit", "3", "--attempts", "2", "--sandboxes", "2", "--lease-seconds", "600", "--name", name]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        [*cli, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    store = Store(url)
    deadline = time.monotonic() + 180
    sweep_id = None
    while time.monotonic() < deadline and first.poll() is None:
        sweep_id = sweep_id or store.find_sweep(name)
        if sweep_id and _count(store, sweep_id, dbm.DONE) >= 3 and _count(store, sweep_id, dbm.RUNNING) >= 1:
            break
        time.sleep(0.2)
    assert first.poll() is None, first.communicate()[0].decode()[-3000:]
    assert sweep_id is not None, "the sweep never started"
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_running = _count(store, sweep_id, dbm.RUNNING)
    assert killed_running >= 1 and _count(store, sweep_id, dbm.DONE) < 12

    # The lease is long (600 s): the rerun must see at once that the old owner process is gone.
    start = time.monotonic()
    second = subprocess.run(
        [*cli, "--resume", str(sweep_id)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert time.monotonic() - start < 300
    attempts = check_sweep(store, sweep_id, {"fix": 3, "noop": 2}, tasks=3, attempts=2)
    assert sum(a.tries == 2 for a in attempts) == killed_running  # exactly the interrupted ones ran again
    assert sum(bool(a.resolved) for a in attempts) == 6
    assert store.get_sweep(sweep_id).status == "done"
    assert "fix" in second.stdout and "noop" in second.stdout  # the summary table
    # A log (no terminal) gets plain progress lines, ending at each arm's total
    assert "fix: 6/6 attempts done, 6 resolved" in second.stdout, second.stdout[-3000:]


def test_arm_actor_killed_mid_sweep_is_restarted_and_attempt_retried(
    tmp_path: Path, ray_address: str
) -> None:
    import ray

    # Long model calls and instant commands: a kill almost surely lands inside a call.
    replies = [bash("cat calc.py"), bash("sed -i 's/a - b/a + b/' calc.py"), FIX[-1]]
    spec = ArmSpec(name="slow", kind="scripted", script=replies, delay_s=1.5)
    config = SweepConfig(name="actor-kill", suite="local-toy", arms=[spec], attempts=1, limit=2, lease_s=30)
    handles = start_arm_actors([spec])
    old_pid = ray.get(handles["slow"].pid.remote())
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    orch = Orchestrator(
        store, config, LocalToyBackend(root=tmp_path / "toy"), {"slow": ActorModel(handles["slow"])}
    )
    sweep_id = orch.plan()
    runner = threading.Thread(target=orch.run, args=(sweep_id,))
    runner.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with store.session() as s:
            if s.scalar(select(func.count()).select_from(dbm.Request)):
                break
        time.sleep(0.05)
    time.sleep(0.4)  # into the second call (1.5 s)
    os.kill(old_pid, signal.SIGKILL)
    runner.join(timeout=180)
    assert not runner.is_alive()
    new_pid = ray.get(handles["slow"].pid.remote())
    assert new_pid != old_pid
    attempts = check_sweep(store, sweep_id, {"slow": 3}, tasks=2, attempts=1)
    assert max(a.tries for a in attempts) == 2, [(a.tries, a.error) for a in attempts]
    assert any("slow" in f for f in orch.failures)
    assert all(a.resolved for a in attempts)
