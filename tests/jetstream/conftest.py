"""Fixtures of the transport's tests: a real nats-server on loopback (natsd.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jetstream.natsd import NatsServer


@pytest.fixture
def natsd(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with JetStream and no authorization, stopped after the test."""
    server = NatsServer(tmp_path / "natsd")
    yield server
    server.stop()
