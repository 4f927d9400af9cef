"""`Store.reading()`, `Store.writing()` and `Store.control`: the public transaction API."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from slurm_gpu.errors import StoreError
from slurm_gpu.store import Store
from slurm_gpu.store.schema import gpu_inventory

ROW = {
    "node": "gpu1",
    "uuid": "GPU-1",
    "model": "A100",
    "minor": 0,
    "nvml_index": 0,
    "pci_bus_id": "0000:00:01.0",
    "memory_total_bytes": 2**30,
    "first_seen": 1.0,
    "last_seen": 2.0,
}


def stored_nodes(store: Store) -> list[str]:
    """The nodes of the inventory rows, read in a transaction of their own."""
    with store.reading("reading nodes") as conn:
        return [str(node) for node in conn.execute(sa.select(gpu_inventory.c.node)).scalars()]


def test_writing_commits_when_the_block_ends(store: Store) -> None:
    """A row written in a `writing()` block is there for the next reader."""
    with store.writing("adding a GPU") as conn:
        conn.execute(gpu_inventory.insert().values(**ROW))
    assert ["gpu1"] == stored_nodes(store)


def test_writing_rolls_back_when_the_block_raises(store: Store) -> None:
    """An exception in a `writing()` block leaves nothing of it in the store."""
    with pytest.raises(RuntimeError), store.writing("adding a GPU") as conn:
        conn.execute(gpu_inventory.insert().values(**ROW))
        raise RuntimeError("changed my mind")
    assert [] == stored_nodes(store)


def test_a_failing_statement_is_a_store_error_naming_the_operation(store: Store) -> None:
    """SQL that fails in `reading()` raises StoreError with the database and the operation."""
    with pytest.raises(StoreError) as caught, store.reading("reading a missing table") as conn:
        conn.execute(sa.text("SELECT * FROM no_such_table"))
    expected = f"store {store.where}: reading a missing table failed: "
    assert expected == str(caught.value)[: len(expected)]


def test_a_store_used_with_with_is_disposed_at_the_end(store_url: str) -> None:
    """`with Store(url) as store:` hands the store over and disposes its pool at the end."""
    with Store(store_url) as store:
        store.ping()
        pool = store.engine.pool
    assert pool is not store.engine.pool  # dispose() replaced the pool with a fresh one


def test_control_is_built_once_per_store(store: Store) -> None:
    """`store.control` is the same ControlStore every time, on the store's cluster."""
    first, second = store.control, store.control
    assert (True, "alpha") == (first is second, first.cluster)
