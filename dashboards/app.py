"""The dashboard: FastAPI + Jinja2 pages, each backed by a JSON endpoint under ``/api``.

plotly.js is served from the installed ``plotly`` package (``/static/plotly.min.js``): the pages work offline
and never reach a CDN.
"""

from __future__ import annotations

import html
import importlib.resources
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from lumotree.dashboards import views
from lumotree.db.store import Store

HERE = Path(__file__).resolve().parent


@dataclass
class DashboardConfig:
    """Settings of one dashboard server."""

    # Database URL (SQLite file path or URL, PostgreSQL URL); None = lumotree.db.engine.default_url().
    db: str | None = None
    # Interface and port uvicorn binds.
    host: str = "127.0.0.1"
    port: int = 8765
    # Seconds between the sweep page's progress polls while a sweep runs.
    poll_seconds: float = 5.0


def plotly_js_path() -> Path:
    """plotly.min.js inside the installed plotly package."""
    path = Path(str(importlib.resources.files("plotly") / "package_data" / "plotly.min.js"))
    assert path.is_file(), f"plotly.min.js not found in the plotly package ({path})"
    return path


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def create_app(config: DashboardConfig | None = None, store: Store | None = None) -> FastAPI:
    """The dashboard app over ``store`` (or a Store opened on ``config.db``, migrated to head)."""
    config = config or DashboardConfig()
    store = store or Store(config.db)
    app = FastAPI(title="LumoTree dashboard", docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.store = store
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["fmt"] = _fmt
    templates.env.filters["pct"] = _pct
    templates.env.globals["poll_ms"] = int(config.poll_seconds * 1000)
    templates.env.globals["matrix_cells"] = views.matrix_cells_html
    app.mount("/static/app", StaticFiles(directory=str(HERE / "static")), name="static")
    plotly_js = plotly_js_path()

    def found(value: dict[str, Any] | None, what: str) -> dict[str, Any]:
        if value is None:
            raise HTTPException(status_code=404, detail=f"{what} not found")
        return value

    def page(request: Request, name: str, data: dict[str, Any], started: float) -> HTMLResponse:
        response = templates.TemplateResponse(request, name, {"data": data})
        # Server time of the page (queries + rendering), for the benchmark and for curious users.
        response.headers["Server-Timing"] = f"app;dur={1000 * (time.perf_counter() - started):.1f}"
        return response

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly() -> FileResponse:
        return FileResponse(
            plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
        )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        with store.session() as s:
            views.sweeps_view(s)
        return {"status": "ok"}

    # ---- JSON ----------------------------------------------------------------------------------------------
    @app.get("/api/sweeps")
    def api_sweeps() -> dict[str, Any]:
        with store.session() as s:
            return views.sweeps_view(s)

    @app.get("/api/sweeps/{sweep_id}")
    def api_sweep(sweep_id: int) -> dict[str, Any]:
        with store.session() as s:
            return found(views.sweep_view(s, sweep_id), "sweep")

    @app.get("/api/sweeps/{sweep_id}/matrix")
    def api_matrix(sweep_id: int) -> dict[str, Any]:
        with store.session() as s:
            found(views.sweep_view(s, sweep_id), "sweep")
            return views.matrix_view(s, sweep_id)

    @app.get("/api/sweeps/{sweep_id}/tasks/{task_id}")
    def api_task(sweep_id: int, task_id: int) -> dict[str, Any]:
        with store.session() as s:
            return found(views.task_view(s, sweep_id, task_id), "task")

    @app.get("/api/attempts/{attempt_id}")
    def api_attempt(attempt_id: int) -> dict[str, Any]:
        with store.session() as s:
            return found(views.attempt_view(s, attempt_id), "attempt")

    @app.get("/api/replays")
    def api_replays() -> dict[str, Any]:
        with store.session() as s:
            return views.replays_view(s)

    @app.get("/api/replays/{replay_id}")
    def api_replay(replay_id: int) -> dict[str, Any]:
        with store.session() as s:
            return found(views.replay_view(s, replay_id), "replay")

    # ---- pages ---------------------------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    def sweeps_page(request: Request) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            return page(request, "sweeps.html", views.sweeps_view(s), t)

    @app.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
    def sweep_page(request: Request, sweep_id: int) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            data = found(views.sweep_view(s, sweep_id), "sweep")
            data["matrix"] = views.matrix_view(s, sweep_id)
            data["arm_names"] = {a["id"]: a["name"] for a in data["arms"]}
            return page(request, "sweep.html", data, t)

    @app.get("/sweeps/{sweep_id}/tasks/{task_id}", response_class=HTMLResponse)
    def task_page(request: Request, sweep_id: int, task_id: int) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            return page(request, "task.html", found(views.task_view(s, sweep_id, task_id), "task"), t)

    @app.get("/attempts/{attempt_id}", response_class=HTMLResponse)
    def attempt_page(request: Request, attempt_id: int) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            return page(request, "attempt.html", found(views.attempt_view(s, attempt_id), "attempt"), t)

    @app.get("/replays", response_class=HTMLResponse)
    def replays_page(request: Request) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            return page(request, "replays.html", views.replays_view(s), t)

    @app.get("/replays/{replay_id}", response_class=HTMLResponse)
    def replay_page(request: Request, replay_id: int) -> HTMLResponse:
        t = time.perf_counter()
        with store.session() as s:
            return page(request, "replay.html", found(views.replay_view(s, replay_id), "replay"), t)

    @app.exception_handler(HTTPException)
    def http_error(request: Request, exc: HTTPException) -> Any:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        body = f"<h1>{exc.status_code}</h1><p>{html.escape(str(exc.detail))}</p>"
        return HTMLResponse(body, status_code=exc.status_code)

    return app


def serve(config: DashboardConfig) -> None:
    """Run the dashboard with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="info")
