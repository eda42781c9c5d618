"""Deployment: compose.yaml validates with docker-compose; the offline-built platform image serves the UI."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from lumotree.db.store import Store
from lumotree.db.synthetic import SyntheticSweep, fill_synthetic_sweep

REPO = Path(__file__).resolve().parents[2]
SERVICES = {"postgres", "ray-head", "ray-worker", "orchestrator", "dashboard"}


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose binary absent (apt-get install docker-compose)",
)
def test_compose_config_validates() -> None:
    compose = ["docker-compose", "-f", str(REPO / "compose.yaml")]
    check = subprocess.run([*compose, "config", "-q"], capture_output=True, text=True, cwd=REPO)
    assert check.returncode == 0, check.stderr
    services = subprocess.run([*compose, "config", "--services"], capture_output=True, text=True, cwd=REPO)
    assert set(services.stdout.split()) == SERVICES
    full = subprocess.run(
        [*compose, "config"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "LUMOTREE_IMAGE": "lumotree/platform:test",
            "POSTGRES_PASSWORD": "s3cret",
        },
    ).stdout
    # Configured by environment: the image and the database credentials flow into every platform service.
    assert full.count("image: lumotree/platform:test") == 4
    assert "LUMOTREE_DB_URL: postgresql://lumotree:s3cret@postgres:5432/lumotree" in full
    assert "driver: nvidia" in full and "capabilities:\n            - gpu" in full


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.docker
@pytest.mark.slow
def test_offline_platform_image_serves_the_dashboard(tmp_path: Path) -> None:
    from lumotree.platform.platform_image import PlatformImageSpec, build_platform_image
    from lumotree.tasks.rootfs import docker_client

    tag = build_platform_image(PlatformImageSpec(target="dashboard"), log=None)
    store = Store(f"sqlite:///{tmp_path / 'sweeps.db'}")
    sweep = fill_synthetic_sweep(
        store, SyntheticSweep(name="in-docker", tasks=2, attempts=1, requests_per_attempt=1)
    )
    store.close()
    port = _free_port()
    client = docker_client()
    container = client.containers.run(
        tag,
        ["lumotree", "dashboard", "--host", "0.0.0.0", "--port", "8765", "--db", "sqlite:////data/sweeps.db"],
        detach=True,
        ports={"8765/tcp": ("127.0.0.1", port)},
        volumes={str(tmp_path): {"bind": "/data", "mode": "rw"}},
        labels={"lumotree.kind": "test"},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            container.reload()
            assert container.status == "running", container.logs().decode()[-2000:]
            assert time.monotonic() < deadline, container.logs().decode()[-2000:]
            time.sleep(0.5)
        sweeps = httpx.get(base + "/api/sweeps").json()["sweeps"]
        assert [(s["id"], s["name"]) for s in sweeps] == [(sweep, "in-docker")]
        page = httpx.get(f"{base}/sweeps/{sweep}")
        assert page.status_code == 200 and "plotly.min.js" in page.text
        assert httpx.get(base + "/static/plotly.min.js").status_code == 200
    finally:
        container.remove(force=True)
