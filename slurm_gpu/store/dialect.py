"""Per-dialect SQL and connection setup.

Native insert-or-ignore and upsert, an hour-floor expression, binary result rows on
psycopg for the reports' bulk reads, and SQLite's WAL and BEGIN IMMEDIATE.

SQLite and PostgreSQL: `INSERT ... ON CONFLICT DO NOTHING / DO UPDATE`.
MySQL/MariaDB: `INSERT IGNORE` (its affected-rows count excludes skipped duplicates, so the
count of new rows is exact; `ON DUPLICATE KEY UPDATE` would count a no-op duplicate as 1
under the FOUND_ROWS flag SQLAlchemy sets) and `ON DUPLICATE KEY UPDATE` for upserts.
Caveat of INSERT IGNORE: it also turns data errors (e.g. a too-long string) into warnings;
the models' types and the column lengths in schema.py keep that from happening.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert


def insert_ignore(dialect: str, table: sa.Table) -> Insert:
    """An INSERT that silently skips rows whose primary key is already stored."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    if dialect in ("mysql", "mariadb"):
        return mysql.insert(table).prefix_with("IGNORE")
    raise ValueError(f"unsupported database dialect {dialect!r}")


def upsert(
    dialect: str,
    table: sa.Table,
    update: Sequence[str],
    *,
    keep_min: Sequence[str] = (),
    keep_max: Sequence[str] = (),
) -> Insert:
    """An INSERT that, for a row whose primary key exists, updates that row instead.

    Args:
        dialect: the engine's dialect name.
        table: the table.
        update: columns set to the new row's value.
        keep_min: columns set to the smaller of stored and new (NULL-safe: new wins a NULL).
        keep_max: columns set to the larger of stored and new.
    """
    stmt: Any
    if dialect in ("postgresql", "sqlite"):
        stmt = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        new = stmt.excluded
    elif dialect in ("mysql", "mariadb"):
        stmt = mysql.insert(table)
        new = stmt.inserted
    else:
        raise ValueError(f"unsupported database dialect {dialect!r}")
    values: dict[str, Any] = {name: new[name] for name in update}
    for name in keep_min:
        old = table.c[name]
        values[name] = sa.case((sa.or_(old.is_(None), new[name] < old), new[name]), else_=old)
    for name in keep_max:
        old = table.c[name]
        values[name] = sa.case((sa.or_(old.is_(None), new[name] > old), new[name]), else_=old)
    if dialect in ("mysql", "mariadb"):
        result: Insert = stmt.on_duplicate_key_update(values)
        return result
    keys = [c.name for c in table.primary_key.columns]
    result = stmt.on_conflict_do_update(index_elements=keys, set_=values)
    return result


class hour_floor(sa.sql.functions.GenericFunction[float]):
    """`hour_floor(t)`: POSIX seconds `t` rounded down to the hour, as a float."""

    type = sa.Double()
    inherit_cache = True


@compiles(hour_floor)
def _hour_floor_default(element: hour_floor, compiler: SQLCompiler, **kw: Any) -> str:
    # Literal 3600 (not a bound parameter) so the same expression can appear in GROUP BY:
    # PostgreSQL treats two differently numbered parameters as different expressions.
    return f"(FLOOR(({compiler.process(element.clauses, **kw)}) / 3600.0) * 3600.0)"


@compiles(hour_floor, "sqlite")
def _hour_floor_sqlite(element: hour_floor, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite's math functions (floor) are optional at build time; CAST truncates toward
    # zero, which is floor for the positive times stored here.
    return f"(CAST(({compiler.process(element.clauses, **kw)}) / 3600.0 AS INTEGER) * 3600.0)"


# Execution option of a query whose many rows are read straight from the driver's cursor.
BULK_ROWS = "slurm_gpu_bulk_rows"


def binary_bulk_rows(engine: sa.Engine) -> None:
    """On psycopg, have queries with the `BULK_ROWS` execution option return binary rows.

    PostgreSQL then sends numbers as their bytes instead of as text for psycopg to parse
    (a month's report reads ~10^6 rows: ~0.3 s less). The same Python values either way:
    a float8 as text is the shortest string that reads back as the same double.
    https://www.psycopg.org/psycopg3/docs/api/cursors.html#psycopg.Cursor.format
    Such a query's transaction also runs with JIT compilation off (see below).
    """
    if engine.dialect.driver != "psycopg":
        return
    from psycopg import pq

    def binary(
        conn: sa.Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        if context is not None and context.execution_options.get(BULK_ROWS):
            cursor.format = pq.Format.BINARY
            if cursor.connection.info.server_version >= 110000:
                # A month's join is planned on a far smaller row estimate, so PostgreSQL
                # JIT-compiles it (~35 ms), which costs more than it saves (PostgreSQL 11+).
                cursor.connection.execute("SET LOCAL jit = off")

    sa.event.listen(engine, "before_cursor_execute", binary)


SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE = "slurm_gpu_write"
"""Execution option of a connection that will write: SQLite begins it with BEGIN IMMEDIATE."""


def sqlite_transactions(engine: sa.Engine) -> None:
    """Set up SQLite connections: WAL, a busy timeout, BEGIN IMMEDIATE for writes.

    A connection with the `WRITE` execution option begins with BEGIN IMMEDIATE, so two
    writers queue instead of deadlocking on a lock upgrade.
    """
    sa.event.listen(engine, "connect", _sqlite_connect)
    sa.event.listen(engine, "begin", _sqlite_begin)


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # WAL: readers never block the writer; busy_timeout: a second writer waits, not fails.
    # https://www.sqlite.org/wal.html  https://www.sqlite.org/pragma.html#pragma_busy_timeout
    # isolation_level None hands BEGIN to _sqlite_begin (SQLAlchemy's documented recipe).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _sqlite_begin(conn: sa.Connection) -> None:
    write = conn.get_execution_options().get(WRITE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
