"""Revision 0005 on every backend: lost GPUs in the inventory, activity's measured_since."""

from __future__ import annotations

from slurm_gpu.models import GpuActivity, GpuDevice, LostGpu
from slurm_gpu.store import Store

T0 = 1_717_200_000.0

A = GpuDevice("GPU-a", "NVIDIA A100", 0, 0, "00000000:07:00.0", 85_899_345_920)
B = GpuDevice("GPU-b", "NVIDIA A100", 1, 1, "00000000:0F:00.0", None)


def lost(store: Store) -> list[tuple[str, str, float | None, str | None]]:
    return [(e.node, e.device.uuid, e.lost_since, e.lost_reason) for e in store.inventory()]


def test_lost_gpus_are_set_and_replaced_per_node(store: Store) -> None:
    """A report replaces the node's lost set: by UUID, or by minor when the UUID is unknown."""
    store.upsert_inventory("gpu1", [A, B], T0)
    store.upsert_inventory("gpu2", [A], T0)
    store.set_lost_gpus("gpu1", [LostGpu("GPU-b", 1, T0 + 5, "GPU is lost")])
    store.set_lost_gpus("gpu2", [LostGpu("", 0, T0 + 6, "not among NVML's GPUs")])
    assert [
        ("gpu1", "GPU-a", None, None),
        ("gpu1", "GPU-b", T0 + 5, "GPU is lost"),
        ("gpu2", "GPU-a", T0 + 6, "not among NVML's GPUs"),
    ] == lost(store)
    store.set_lost_gpus("gpu1", [])
    assert [None, None, T0 + 6] == [since for _, _, since, _ in lost(store)]


def test_inventory_upserts_keep_the_lost_flag(store: Store) -> None:
    """The agent's startup inventory (no word on lost GPUs) leaves the flag as it is."""
    store.upsert_inventory("gpu1", [A], T0)
    store.set_lost_gpus("gpu1", [LostGpu("GPU-a", 0, T0 + 5, "GPU is lost")])
    store.upsert_inventory("gpu1", [A], T0 + 10)
    assert [("gpu1", "GPU-a", T0 + 5, "GPU is lost")] == lost(store)


def test_activity_keeps_measured_since(store: Store) -> None:
    """measured_since round-trips and is replaced by the newest row (None for old agents)."""
    row = GpuActivity(7, "gpu1", "GPU-a", 0, T0, T0 + 60, None, 0.0, 0, 0, T0 + 30)
    store.add_activity([row])
    assert [row] == store.activity([7])
    newer = GpuActivity(7, "gpu1", "GPU-a", 0, T0, T0 + 70, None, 0.0, 0, 0)
    store.add_activity([newer])
    assert [None] == [a.measured_since for a in store.activity([7])]
