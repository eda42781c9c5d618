"""Engines: a SQLite file by default (WAL, busy timeout, immediate write transactions), PostgreSQL by URL.

SQLite's deferred transactions fail at once with "database is locked" when two writers upgrade their read
locks at the same time (the busy timeout cannot help there), so write transactions start with
``BEGIN IMMEDIATE``: use ``write_engine(engine)`` for them. Readers stay deferred so the dashboard never
queues behind the orchestrator. Switching a fresh file to WAL has the same lock upgrade, so it is retried.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
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


def _enable_wal(cursor: Any, busy_ms: int) -> None:
    """``PRAGMA journal_mode=WAL``, retried for up to ``busy_ms``: processes opening a fresh file at once
    (orchestrator workers, the dashboard) each hold a read lock while converting it, and SQLite answers all
    but one "database is locked" at once, without waiting on the busy timeout, to avoid a deadlock."""
    deadline = time.monotonic() + busy_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))  # jitter: the racers must not retry in step


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
        _enable_wal(cursor, busy_ms)
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
