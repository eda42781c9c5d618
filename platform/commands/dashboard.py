"""``lumotree dashboard``: serve the web dashboard over a sweep database."""

from __future__ import annotations

import typer

from lumotree.platform.db_options import db_option


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        db: str | None = db_option(),
        host: str = typer.Option(
            "127.0.0.1", "--host", help="Interface to bind (0.0.0.0 to serve the network)."
        ),
        port: int = typer.Option(8765, "--port", help="Port to listen on."),
        poll: float = typer.Option(
            5.0, "--poll", help="Seconds between live-progress polls on a running sweep."
        ),
    ) -> None:
        """Serve the dashboard: sweeps, solve rate vs tok/s, task matrices, attempt traces, replays."""
        from rich.console import Console

        from lumotree.dashboards.app import DashboardConfig, serve
        from lumotree.db.engine import normalize_url

        url = normalize_url(db)
        Console(stderr=True).print(
            f"[bold]LumoTree dashboard[/] on http://{host}:{port}  (database {_redact(url)})"
        )
        serve(DashboardConfig(db=url, host=host, port=port, poll_seconds=poll))


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
