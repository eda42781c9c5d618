"""``lumotree bench dashboard``: server time of the sweep page for a large synthetic sweep."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import typer

from lumotree.platform.benches import emit


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("dashboard")
    def dashboard(
        attempts: int = typer.Option(
            10_000, "--attempts", help="Attempts in the synthetic sweep (4 arms x 2 each)."
        ),
        repeats: int = typer.Option(7, "--repeats", help="Timed page loads; the median is reported."),
        db: str = typer.Option(None, "--db", help="Database URL to fill instead of a temporary SQLite file."),
        as_json: bool = typer.Option(False, "--json", help="Print only the JSON result."),
        out: Path = typer.Option(None, "--out", help="Also write the JSON result to this file."),
    ) -> None:
        """Fill a database with a synthetic sweep of ATTEMPTS attempts and time the sweep page (server time:
        queries + rendering inside the app, from its Server-Timing header) and the JSON endpoints."""
        from fastapi.testclient import TestClient
        from rich.console import Console

        from lumotree.dashboards.app import create_app
        from lumotree.db.store import Store
        from lumotree.db.synthetic import DEFAULT_ARMS, SyntheticSweep, fill_synthetic_sweep

        console = Console(stderr=True, quiet=as_json)
        started = time.time()
        per_task = len(DEFAULT_ARMS) * 2
        if attempts < per_task or attempts % per_task:
            console.print(f"[red]--attempts must be a positive multiple of {per_task}[/]")
            raise typer.Exit(2)
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(db or f"sqlite:///{Path(tmp) / 'bench.db'}")
            t0 = time.perf_counter()
            spec = SyntheticSweep(
                name="bench", tasks=attempts // per_task, attempts=2, requests_per_attempt=0
            )
            sweep = fill_synthetic_sweep(store, spec)
            fill_s = time.perf_counter() - t0
            console.print(f"filled {attempts:,} attempts in {fill_s:.1f} s")
            client = TestClient(create_app(store=store))
            paths = {"sweep_page": f"/sweeps/{sweep}", "sweep_json": f"/api/sweeps/{sweep}"}
            paths["matrix_json"] = f"/api/sweeps/{sweep}/matrix"
            result: dict[str, object] = {
                "attempts": attempts,
                "arms": len(DEFAULT_ARMS),
                "fill_seconds": fill_s,
            }
            result["backend"] = store.engine.dialect.name
            for name, path in paths.items():
                assert client.get(path).status_code == 200  # warm-up: template compile, caches
                server, total, size = [], [], 0
                for _ in range(repeats):
                    t = time.perf_counter()
                    response = client.get(path)
                    total.append(time.perf_counter() - t)
                    assert response.status_code == 200, response.text[:200]
                    size = len(response.content)
                    timing = response.headers.get("server-timing", "")
                    if timing:
                        server.append(float(timing.split("dur=")[1]) / 1000)
                result[name] = {
                    "median_server_s": statistics.median(server) if server else None,
                    "median_total_s": statistics.median(total),
                    "max_total_s": max(total),
                    "bytes": size,
                    "repeats": repeats,
                }
                console.print(f"{name}: median {statistics.median(total) * 1000:.0f} ms ({size:,} bytes)")
            store.close()
        page = result["sweep_page"]
        assert isinstance(page, dict)
        result["under_1s"] = page["median_server_s"] < 1.0
        emit(result, "cpu", started, out)
