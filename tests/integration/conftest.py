"""Fixtures for tests that run against the real local test-bed cluster (marker `slurm`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu.config import load_config
from slurm_gpu.store import Store
from tests.integration.testbed import TestBed


@pytest.fixture(scope="session")
def testbed() -> TestBed:
    """The test-bed cluster, brought up once per session (or the one already up)."""
    return TestBed.up()


@pytest.fixture(scope="module")
def store(testbed: TestBed) -> Iterator[Store]:
    """The test bed's accounting store, as its slurm-gpu.toml names it."""
    config = load_config(Path(testbed.env["SLURM_GPU_CONFIG"]))
    testbed_store = Store(config.store.url, cluster=config.cluster.name)
    yield testbed_store
    testbed_store.dispose()


@pytest.fixture
def cancel_after(testbed: TestBed) -> Iterator[list[int]]:
    """Job ids appended here are cancelled when the test ends, whatever happened."""
    jobs: list[int] = []
    yield jobs
    if jobs:
        testbed.run("scancel", *map(str, jobs), check=False)
