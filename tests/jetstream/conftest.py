"""Fixtures of the transport's tests: a real nats-server on loopback (natsd.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.durations import Duration
from slurm_gpu.store import Store
from tests.jetstream.natsd import NatsServer
from tests.jetstream.rig import CLUSTER, Running


@pytest.fixture
def natsd(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with JetStream and no authorization, stopped after the test."""
    server = NatsServer(tmp_path / "natsd")
    yield server
    server.stop()


@pytest.fixture
def settings(natsd: NatsServer) -> NatsSettings:
    return NatsSettings(url=natsd.url, commit_wait=Duration(10.0), ack_wait=Duration(2.0))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'store.db'}", cluster=CLUSTER)
    s.upgrade()
    yield s
    s.dispose()


@pytest.fixture
def worker(settings: NatsSettings, store: Store) -> Iterator[Running]:
    running = Running(settings, store)
    yield running
    running.stop()
