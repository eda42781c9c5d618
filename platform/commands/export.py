"""``lumotree export``: a sweep's traces, events, predictions or summary tables as files."""

from __future__ import annotations

from pathlib import Path

import typer

from lumotree.platform.db_options import db_option


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        sweep: int = typer.Option(
            ..., "--sweep", help="Sweep id (see the dashboard or the sweep's summary)."
        ),
        fmt: list[str] = typer.Option(
            ..., "--format", help="traj | jsonl | preds | csv | parquet (repeat the option for several)."
        ),
        out: Path = typer.Option(..., "--out", help="Output folder (created if missing)."),
        db: str | None = db_option(),
    ) -> None:
        """Export a sweep: mini-swe-agent .traj.json per attempt (traj), the append-only agent event log
        (jsonl), SWE-bench predictions per arm and attempt (preds), or summary tables (csv, parquet)."""
        from rich.console import Console

        from lumotree.dashboards.export import FORMATS
        from lumotree.dashboards.export import export as run_export
        from lumotree.db.store import Store

        console = Console(stderr=True)
        bad = [f for f in fmt if f not in FORMATS]
        if bad:
            console.print(f"[red]unknown format {', '.join(bad)}[/]; choose from {', '.join(FORMATS)}")
            raise typer.Exit(2)
        store = Store(db)
        try:
            with store.session() as s:
                for f in fmt:
                    try:
                        paths = run_export(s, sweep, f, out)
                    except (KeyError, RuntimeError) as exc:
                        console.print(f"[red]{exc.args[0]}[/]")
                        raise typer.Exit(1) from exc
                    console.print(f"{f}: {len(paths)} file(s) under {out}")
        finally:
            store.close()
