"""Schema migrations without an alembic.ini: the script location is this package, so they run when installed.

lumotree.db.migrate.upgrade(url)            # to head
lumotree.db.migrate.revision("message")     # autogenerate a new revision (development)
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

from lumotree.db.engine import make_engine, write_engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


# Key of the PostgreSQL advisory lock that serializes concurrent migrations ("lumotree" in ASCII).
PG_LOCK_KEY = 0x6C756D6F74726565


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Migrate on ``engine``. Processes that start together (orchestrator workers, the dashboard) serialize:
    SQLite through an immediate (write-locked) transaction, PostgreSQL through a transaction-scoped advisory
    lock; the later ones then find the schema at head and do nothing."""
    config = alembic_config()
    with write_engine(engine).connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
        else:
            connection.execute(text("SELECT 1"))  # opens the BEGIN IMMEDIATE transaction before alembic reads
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.commit()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Migrate the database at ``url`` (default: see ``lumotree.db.engine.default_url``) to ``revision``."""
    engine = make_engine(url)
    try:
        upgrade_engine(engine, revision)
    finally:
        engine.dispose()


def downgrade(url: str | None, revision: str) -> None:
    engine = make_engine(url)
    try:
        config = alembic_config()
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
            connection.commit()
    finally:
        engine.dispose()


def current(url: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def revision(message: str, url: str | None = None) -> None:
    """Autogenerate a revision against a database at head (development only)."""
    engine = make_engine(url)
    try:
        upgrade_engine(engine)
        config = alembic_config()
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.revision(config, message=message, autogenerate=True)
    finally:
        engine.dispose()
