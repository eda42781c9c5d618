"""Alembic env: migrations run on the connection ``lumotree.db.migrate`` passes in ``config.attributes``."""

from __future__ import annotations

from alembic import context

from lumotree.db.models import Base

connection = context.config.attributes["connection"]
# render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds tables so later revisions work there.
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
