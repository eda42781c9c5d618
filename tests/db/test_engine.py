"""Engine settings: SQLite in WAL with a busy timeout and foreign keys; URLs normalized to psycopg 3."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from lumotree.db.engine import BUSY_TIMEOUT_MS, default_url, make_engine, normalize_url, write_engine


def test_sqlite_pragmas_and_immediate_writes(tmp_path: Path) -> None:
    engine = make_engine(str(tmp_path / "sub" / "x.db"))  # a plain path works; parent folders are created
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == BUSY_TIMEOUT_MS
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        # A write transaction holds the write lock from BEGIN: a second writer cannot start one meanwhile.
        other = make_engine(str(tmp_path / "sub" / "x.db"), connect_args={"timeout": 0.1})
        with write_engine(engine).begin() as conn:
            conn.execute(text("SELECT 1"))
            try:
                with write_engine(other).begin() as conn2:
                    conn2.execute(text("SELECT 1"))
                locked = False
            except Exception as exc:  # sqlite3.OperationalError wrapped by SQLAlchemy
                locked = "locked" in str(exc)
            # Readers are not blocked by the writer (WAL).
            with other.connect() as reader:
                assert reader.execute(text("SELECT 1")).scalar() == 1
        other.dispose()
        assert locked
    finally:
        engine.dispose()


def test_url_normalization(monkeypatch) -> None:
    assert normalize_url("postgresql://u:p@h:5432/d") == "postgresql+psycopg://u:p@h:5432/d"
    assert normalize_url("postgres://u@h/d") == "postgresql+psycopg://u@h/d"
    assert normalize_url("sqlite:///a.db") == "sqlite:///a.db"
    monkeypatch.setenv("LUMOTREE_DB_URL", "postgresql://x@y/z")
    assert default_url() == "postgresql://x@y/z"
    assert normalize_url(None) == "postgresql+psycopg://x@y/z"
    monkeypatch.delenv("LUMOTREE_DB_URL")
    assert default_url().startswith("sqlite:///") and default_url().endswith("lumotree.db")
