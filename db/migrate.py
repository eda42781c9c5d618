"""Schema migrations without an alembic.ini: the script location is this package, so they run when installed.

lumotree.db.migrate.upgrade(url)            # to head
lumotree.db.migrate.revision("message")     # autogenerate a new revision (development)
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from lumotree.db.engine import make_engine
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    config = alembic_config()
    # A write transaction so concurrent first starts (orchestrator + dashboard) serialize on SQLite.
    with engine.connect() as connection:
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
