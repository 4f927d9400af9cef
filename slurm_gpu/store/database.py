"""`Database`: one SQLAlchemy engine, its transactions and its error messages.

The plumbing every part of the store shares: `Store` is a `Database` with the accounting
operations, and the modules beside it (`control`, `deliveries`, `ingest`, `queries`) run
their SQL through its `reading()` and `writing()`. It sits below them all, so none of
them imports `store.py` to be given one.

Every SQLAlchemy/DBAPI failure in a transaction becomes a StoreError that names the
database (`postgresql://127.0.0.1:5432/slurm_gpu`) and the operation, never the password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Self

import alembic.util
import sqlalchemy as sa

from slurm_gpu.errors import StoreError
from slurm_gpu.store.dialect import WRITE, binary_bulk_rows, sqlite_transactions
from slurm_gpu.store.urls import DEFAULT_DRIVERS, EXTRAS, describe_url


def short_error(exc: BaseException) -> str:
    """The first line of the driver's own message of `exc` (else of `exc`, or its type).

    DBAPIError's str() carries the SQL and (unless hidden) its parameters: the driver's
    message is what a reader needs.
    """
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Database:
    """One database behind one SQLAlchemy engine, and its transactions.

    Args:
        url: SQLAlchemy URL: `sqlite:///PATH`, `postgresql[+psycopg]://...`,
            `mysql|mariadb[+pymysql]://...`.
        cluster: cluster name written to `jobs`, `job_gpus`, `job_events` and
            `job_gpu_summaries` rows, and the one every job query is scoped to.
        echo: log every SQL statement.
        pool_size: the most connections the store opens at once (a server backend's pool
            holds exactly that many, none beyond; None: SQLAlchemy's default pool).
            SQLite keeps its own pool either way.

    Raises:
        StoreError: the URL is malformed, its backend unsupported or its driver missing.
    """

    def __init__(
        self, url: str, cluster: str = "", echo: bool = False, pool_size: int | None = None
    ) -> None:
        self.cluster = cluster
        try:
            parsed = sa.make_url(url)
        except (sa.exc.ArgumentError, ValueError) as exc:
            raise StoreError(f"invalid store URL: {short_error(exc)}") from None
        backend = parsed.get_backend_name()
        if backend not in ("sqlite", "postgresql", "mysql", "mariadb"):
            raise StoreError(f"unsupported store backend {backend!r} in {describe_url(parsed)}")
        if parsed.drivername in DEFAULT_DRIVERS:
            parsed = parsed.set(drivername=f"{backend}+{DEFAULT_DRIVERS[backend]}")
        self._secret = parsed.password if isinstance(parsed.password, str) else None
        self.where = describe_url(parsed)
        pool: dict[str, Any] = {}
        if pool_size is not None and backend != "sqlite":
            # Exactly pool_size: a caller past it waits for a free connection (pool_timeout).
            pool = {"pool_size": pool_size, "max_overflow": 0}
        try:
            self.engine = sa.create_engine(
                parsed,
                echo=echo,
                hide_parameters=True,
                pool_pre_ping=backend != "sqlite",
                **pool,
            )
        except ModuleNotFoundError as exc:
            hint = f" (pip install 'slurm-gpu[{EXTRAS[backend]}]')" if backend in EXTRAS else ""
            raise StoreError(f"no database driver for {self.where}: {exc}{hint}") from None
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot use {self.where}: {short_error(exc)}") from None
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            sqlite_transactions(self.engine)
        binary_bulk_rows(self.engine)

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (sa.exc.SQLAlchemyError, alembic.util.CommandError) as exc:
            message = short_error(exc)
            if self._secret:
                message = message.replace(self._secret, "***")
            raise StoreError(f"store {self.where}: {what} failed: {message}") from None

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[sa.Connection]:
        """One write transaction: committed when the block ends, rolled back on an error.

        SQLite begins it with BEGIN IMMEDIATE, so two writers queue instead of
        deadlocking on a lock upgrade.

        Args:
            what: the operation, for the error message ("adding 5 GPU intervals").

        Yields:
            The connection, inside its transaction.

        Raises:
            StoreError: any SQLAlchemy, DBAPI or Alembic failure in the block, naming the
                database and `what` (never the password).
        """
        with self._errors(what), self.engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[sa.Connection]:
        """One read transaction: every query in the block sees the same database state.

        Args:
            what: the operation, for the error message ("reading jobs").

        Yields:
            The connection, inside its transaction.

        Raises:
            StoreError: as for `writing`.
        """
        with self._errors(what), self.engine.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        """Close every pooled connection (the store stays usable: it reconnects on use)."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        """The store itself: `with Store(url) as store:` disposes it at the end."""
        return self

    def __exit__(self, *_exc: object) -> None:
        """Dispose of the pooled connections."""
        self.dispose()

    def ping(self) -> None:
        """Raise StoreError unless the database answers `SELECT 1`."""
        with self.reading("ping") as conn:
            conn.execute(sa.text("SELECT 1"))
