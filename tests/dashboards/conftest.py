"""Database fixtures: each test runs on SQLite and, with LUMOTREE_TEST_PG_URL set, on PostgreSQL."""

from lumotree.db.testing import db_url, store  # noqa: F401
