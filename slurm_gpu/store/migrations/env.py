"""Alembic environment: run by `Store.upgrade()` / `slurm-gpu db upgrade`.

The Store passes an open connection in `config.attributes["connection"]`; with none, the
URL in the config's `sqlalchemy.url` is used (for `alembic revision --autogenerate` while
developing).

A revision that changes what the usage rollups hold says `REFOLDS = True` instead of
folding the stored rows itself: the fold is the code of the newest revision, which writes
every rollup column of that revision, and a revision's upgrade runs before the later
columns exist. So the rollups are rebuilt once, in the upgrade's transaction, after an
upgrade that ends at the head and passed such a revision. An upgrade that stops short of
the head leaves them to the one that reaches it.
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
        start = context.get_context().get_current_revision()
        context.run_migrations()
        if _refolds(start, context.get_context().get_current_revision()):
            from slurm_gpu.store import usage_rollup

            usage_rollup.rebuild(connection)
            usage_rollup.reset_extent(connection)


def _refolds(start: str | None, end: str | None) -> bool:
    """Whether the upgrade start -> end (the head) passed a revision that `REFOLDS`."""
    script = context.script
    if start is None or end is None or end == start or end != script.get_current_head():
        return False  # a new store has nothing to fold; a downgrade or a partial upgrade
    passed = script.iterate_revisions(end, start)
    return any(getattr(rev.module, "REFOLDS", False) for rev in passed)


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
