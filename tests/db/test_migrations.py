"""Packaged Alembic migrations build exactly the models' schema, downgrade cleanly, re-run harmlessly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from lumotree.db import migrate
from lumotree.db.engine import make_engine
from lumotree.db.models import Base

TABLES = {"sweeps", "arms", "tasks", "attempts", "requests", "agent_events", "replay_runs", "replay_results"}


def test_upgrade_matches_models_and_downgrades(db_url: str) -> None:
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    migrate.upgrade(db_url)
    migrate.upgrade(db_url)  # already at head: no-op
    assert migrate.current(db_url) == head
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert TABLES <= set(inspect(conn).get_table_names())
            # No difference between the migrated schema and the models (types, columns, indexes, constraints).
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
            assert diff == [], diff
        migrate.downgrade(db_url, "base")
        with engine.connect() as conn:
            assert not TABLES & set(inspect(conn).get_table_names())
        assert migrate.current(db_url) is None
    finally:
        engine.dispose()


def test_migrations_ship_inside_the_package() -> None:
    assert (migrate.MIGRATIONS / "env.py").is_file()
    assert list((migrate.MIGRATIONS / "versions").glob("0001_*.py"))


def test_concurrent_first_starts_all_succeed(db_url: str, tmp_path: Path) -> None:
    # Several processes opening a fresh database at once (orchestrator workers + dashboard) must not race
    # on creating the schema.
    code = "import sys; from lumotree.db.store import Store; Store(sys.argv[1]).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert migrate.current(db_url) == ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
