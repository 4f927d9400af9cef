"""Marks every test under tests/integration as needing the Slurm test bed."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/integration/ get the `slurm` marker automatically."""
    for item in items:
        if "/tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.slurm)
