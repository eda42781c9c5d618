"""The user-facing commands: ``lumotree dashboard`` serves, ``lumotree bench dashboard`` reports JSON."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lumotree.db.store import Store
from lumotree.db.synthetic import SyntheticSweep, fill_synthetic_sweep

LUMOTREE = [sys.executable, "-c", "from lumotree.platform.cli import main; main()"]


def test_dashboard_command_serves(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    store = Store(str(db))
    sweep = fill_synthetic_sweep(store, SyntheticSweep(tasks=1, attempts=1, requests_per_attempt=0))
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*LUMOTREE, "dashboard", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/sweeps/{sweep}", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.3)
        assert response.status_code == 200 and response.json()["progress"]["done"] == 4
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_bench_dashboard_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [*LUMOTREE, "bench", "dashboard", "--attempts", "16", "--repeats", "2", "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data == json.loads(out.read_text())
    assert data["attempts"] == 16 and data["backend"] == "sqlite" and data["under_1s"] is True
    assert 0 < data["sweep_page"]["median_server_s"] <= data["sweep_page"]["max_total_s"]
    bad = subprocess.run(
        [*LUMOTREE, "bench", "dashboard", "--attempts", "10"], capture_output=True, text=True
    )
    assert bad.returncode == 2
