"""Alembic environment of the lumotree schema (run programmatically by ``lumotree.db.migrate``)."""
