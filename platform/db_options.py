"""The ``--db`` option shared by every command that opens the sweep database (one definition)."""

from __future__ import annotations

from typing import Any

import typer


def db_option() -> Any:
    """``--db``: None means ``lumotree.db.engine.default_url()`` ($LUMOTREE_DB_URL or
    ./runs/lumotree.db), as ``Store(None)`` and ``normalize_url(None)`` resolve it: every command, the
    dashboard included, finds the same database."""
    return typer.Option(
        None, "--db", help="Database URL or SQLite path (default: $LUMOTREE_DB_URL or ./runs/lumotree.db)."
    )
