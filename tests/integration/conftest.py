"""Fixtures for tests that run against the real local test-bed cluster (marker `slurm`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.testbed import TestBed


@pytest.fixture(scope="session")
def testbed() -> TestBed:
    """The test-bed cluster, brought up once per session (or the one already up)."""
    return TestBed.up()


@pytest.fixture
def cancel_after(testbed: TestBed) -> Iterator[list[int]]:
    """Job ids appended here are cancelled when the test ends, whatever happened."""
    jobs: list[int] = []
    yield jobs
    if jobs:
        testbed.run("scancel", *map(str, jobs), check=False)
