"""Test support (imports pytest; never import it from product code): scratch databases and fixtures.

A scratch database is a SQLite file, or a private schema inside a given PostgreSQL database: a schema per test
(``search_path`` set through libpq's ``options``) lets several test sessions share one server and one database
without seeing each other's tables; it is dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from lumotree.db.engine import make_engine, normalize_url
from lumotree.db.store import Store

PG_ENV = "LUMOTREE_TEST_PG_URL"


@contextmanager
def scratch_url(pg_url: str | None, tmp_dir: Path) -> Iterator[str]:
    """Yield the URL of an empty database: SQLite in ``tmp_dir`` if ``pg_url`` is None, else a new schema."""
    if pg_url is None:
        yield f"sqlite:///{Path(tmp_dir) / 'lumotree-test.db'}"
        return
    schema = f"lt_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(pg_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = make_url(normalize_url(pg_url)).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


# Pytest fixtures (import them into a conftest.py): ``db_url`` runs each test on SQLite and, when
# $LUMOTREE_TEST_PG_URL is set, on PostgreSQL; ``store`` is a migrated Store on it.
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    pg = os.environ.get(PG_ENV)
    if request.param == "postgres" and not pg:
        pytest.skip(f"{PG_ENV} is not set (scripts/start-postgres.sh prints one)")
    with scratch_url(pg if request.param == "postgres" else None, tmp_path) as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()
