"""Engines: a SQLite file by default (WAL, busy timeout, immediate write transactions), PostgreSQL by URL.

SQLite's deferred transactions fail at once with "database is locked" when two writers upgrade their read
locks at the same time (the busy timeout cannot help there), so write transactions start with
``BEGIN IMMEDIATE``: use ``write_engine(engine)`` for them. Readers stay deferred so the dashboard never
queues behind the orchestrator.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

ENV_URL = "LUMOTREE_DB_URL"
DEFAULT_FILE = "runs/lumotree.db"  # the sweep command's default too: the dashboard finds its results
BUSY_TIMEOUT_MS = 30_000


def default_url() -> str:
    """``$LUMOTREE_DB_URL`` or the SQLite file ``runs/lumotree.db`` under the current directory."""
    return os.environ.get(ENV_URL) or f"sqlite:///{Path(DEFAULT_FILE).resolve()}"


def normalize_url(url: str | None) -> str:
    """Accept plain paths and ``postgresql://`` URLs; PostgreSQL always goes through psycopg 3."""
    url = url or default_url()
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str | None = None, **kwargs: Any) -> Engine:
    """An engine for ``url`` (see ``normalize_url``); SQLite gets WAL, a busy timeout and foreign keys."""
    url = normalize_url(url)
    if not url.startswith("sqlite"):
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(url, **kwargs)
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("timeout", BUSY_TIMEOUT_MS / 1000)
    connect_args.setdefault("check_same_thread", False)
    busy_ms = int(connect_args["timeout"] * 1000)
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy own transaction boundaries (pysqlite's implicit BEGIN is deferred and ill-timed).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = "IMMEDIATE" if conn.get_execution_options().get("lumotree_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def write_engine(engine: Engine) -> Engine:
    """The same engine (same pool) whose transactions take SQLite's write lock up front; a no-op elsewhere."""
    return engine.execution_options(lumotree_write=True)
