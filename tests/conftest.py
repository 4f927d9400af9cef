"""Fixtures every test may use, and the `slurm` marker of tests/integration.

The test doubles themselves are public API in slurm_gpu.testing (FakeSlurmClient,
FakeRunner, FakeGpuSource, FixedClock); fixtures here only build what several test
files need (`munge`: this host's real munged, for tests marked `slurm`). A `store`
fixture is one per kind of database: a fresh SQLite store here, each real backend in
tests/store/conftest.py, the test bed's store in tests/integration/conftest.py (the
nearest conftest wins). A test file that needs data in it extends it under the same
name: `def store(store: Store) -> Store:` adds its rows. A report test's `store` that
takes `usage_source` too runs once per source of sums (tests/usage_sources.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu.munge import Libmunge, MungeError
from slurm_gpu.store import Store
from tests.usage_sources import SOURCES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/integration/ get the `slurm` marker automatically."""
    for item in items:
        if "/tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An empty SQLite store, schema at head, cluster "c"; disposed after the test."""
    fresh = Store(f"sqlite:///{tmp_path / 'store.db'}", cluster="c")
    fresh.upgrade()
    yield fresh
    fresh.dispose()


@pytest.fixture(params=SOURCES)
def usage_source(request: pytest.FixtureRequest) -> str:
    """Each source of a report's sums in turn: folded, raw, half (tests/usage_sources.py)."""
    return str(request.param)


@pytest.fixture
def munge() -> Libmunge:
    """libmunge on munged's default socket; a munged that does not answer fails the test.

    A test that takes it carries the `slurm` marker: munged on /run/munge is what the test
    bed brings up on this host (docker/slurm-cluster/lib.sh), as every Slurm node has it.
    """
    lib = Libmunge()
    try:
        lib.decode(lib.encode(b"probe"))
    except MungeError as exc:
        pytest.fail(
            f"munged is not answering ({exc}): this test needs MUNGE as every Slurm node has"
            " it; start munged (e.g. `runuser -u munge -- /usr/sbin/munged`) and run again"
        )
    return lib
