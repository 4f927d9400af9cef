"""Fresh databases on the three real store backends: SQLite, PostgreSQL, MariaDB.

PostgreSQL and MariaDB come from the test bed (docker/slurm-cluster/local-cluster up) or
from $SLURM_GPU_TEST_PG_URL / $SLURM_GPU_TEST_MARIADB_URL. An unreachable server fails the
test with the URL to check: CI starts the servers, so a skip would hide a broken backend.
Their parameters carry the `db` marker, so `-m "not db"` runs the SQLite ones only and
needs no server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from slurm_gpu.store import Store

PG_URL = os.environ.get(
    "SLURM_GPU_TEST_PG_URL",
    "postgresql+psycopg://slurmgpu:slurmgpu-testbed@127.0.0.1:15432/slurm_gpu",
)
MARIADB_URL = os.environ.get(
    "SLURM_GPU_TEST_MARIADB_URL",
    "mysql+pymysql://slurmgpu:slurmgpu-testbed@127.0.0.1:13306/slurm_gpu",
)
# The server backends are marked `db`: they need PostgreSQL / MariaDB running.
BACKENDS = (
    "sqlite",
    pytest.param("postgresql", marks=pytest.mark.db),
    pytest.param("mariadb", marks=pytest.mark.db),
)


def _server_database(admin_url: str, env_var: str) -> Iterator[str]:
    """Create `slurm_gpu_test_<random>` on the server of admin_url, yield its URL, drop it."""
    url = sa.make_url(admin_url)
    name = f"slurm_gpu_test_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    shown = url.render_as_string(hide_password=True)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as exc:
        engine.dispose()
        pytest.fail(
            f"store test server unreachable at {shown} (set ${env_var}, or start it with "
            f"docker/slurm-cluster/local-cluster up): {str(exc.orig).splitlines()[0]}",
            pytrace=False,
        )
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        drop = f"DROP DATABASE IF EXISTS {name}"
        if url.get_backend_name() == "postgresql":
            drop += " WITH (FORCE)"  # PostgreSQL 13+: closes leftover connections
        with engine.connect() as conn:
            conn.exec_driver_sql(drop)
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    elif request.param == "postgresql":
        yield from _server_database(PG_URL, "SLURM_GPU_TEST_PG_URL")
    else:
        yield from _server_database(MARIADB_URL, "SLURM_GPU_TEST_MARIADB_URL")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A Store on a fresh database of each backend, schema at head, cluster "alpha"."""
    fresh = Store(store_url, cluster="alpha")
    fresh.upgrade()
    yield fresh
    fresh.dispose()
