"""Alembic environment: run by `Store.upgrade()` / `slurm-gpu db upgrade`.

The Store passes an open connection in `config.attributes["connection"]`; with none, the
URL in the config's `sqlalchemy.url` is used (for `alembic revision --autogenerate` while
developing).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from slurm_gpu.store.schema import metadata

VERSION_TABLE = "slurm_gpu_alembic_version"


def _run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate through the Store's connection, or one opened from sqlalchemy.url."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported")
run_migrations_online()
