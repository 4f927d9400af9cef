"""The node agent's word on GPUs it cannot read, and on gaps in its readings (#11 items 5, 8).

- A GPU that stops answering NVML is queued as lost in the node's inventory row (once,
  when the set changes), and cleared when it answers again; the shipper records it in
  the store, where the controller's hot_node policy reads it.
- A gap in a GPU's readings restarts `GpuActivity.measured_since`, so the controller
  never counts the time nobody measured as idle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu.models import LostGpu
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.outbox import decode_activity, decode_inventory
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store
from tests.unit.test_node_agent import DEVICES, Rig, make_agent, run_until, start_job

T0 = 1_800_000_000.0


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_agent(tmp_path)


def inventory_rows(agent: NodeAgent) -> list[str]:
    return [p for _, k, _, p in agent.spool.pending(10**6) if k == "inventory"]


def lost_in_outbox(agent: NodeAgent) -> list[LostGpu] | None:
    (payload,) = inventory_rows(agent)  # one row per node, replaced
    return decode_inventory(payload)[2]


def test_first_tick_reports_that_no_gpu_is_lost(rig: Rig) -> None:
    """The first tick states the lost set (empty), clearing what a previous run reported."""
    agent, *_ = rig
    agent.tick()
    assert [] == lost_in_outbox(agent)


def test_a_gpu_that_stops_answering_is_reported_lost_then_cleared(rig: Rig) -> None:
    """GPU "A" lost at T0+20: the row names it with NVML's error; back at T0+50: cleared."""
    agent, clock, gpus, _ = rig
    agent.tick()
    agent.spool.delete([r.id for r in agent.spool.pending(10**6)])  # shipped
    run_until(agent, clock, T0 + 10)
    assert [] == inventory_rows(agent)  # nothing changed: nothing queued
    gpus.lost.add("A")
    run_until(agent, clock, T0 + 40)
    assert [LostGpu("A", 1, T0 + 20, "GPU is lost")] == lost_in_outbox(agent)
    gpus.lost.clear()
    run_until(agent, clock, T0 + 50)
    assert [] == lost_in_outbox(agent)


def test_a_gres_gpu_nvml_never_showed_is_lost_by_its_minor(tmp_path: Path) -> None:
    """gres.conf lists minors 0 and 1, NVML shows only minor 0: minor 1 is reported lost."""
    agent, *_ = make_agent(tmp_path, [DEVICES[1]])
    agent.tick()
    (lost,) = lost_in_outbox(agent) or []
    assert ("", 1) == (lost.uuid, lost.minor)
    assert "gres.conf GPU 1 (/dev/nvidia1) is not among NVML's GPUs" == lost.reason


def test_the_shipper_records_lost_gpus_in_the_store(rig: Rig, store: Store) -> None:
    """Shipped, the inventory carries the lost flag; once the GPU answers, it is cleared."""
    agent, clock, gpus, _ = rig
    gpus.lost.add("A")
    agent.tick()
    shipper = Shipper(Spool(agent.spool.path), store, "gpu1")
    shipper.drain()
    assert [("A", T0, "GPU is lost"), ("B", None, None)] == [
        (e.device.uuid, e.lost_since, e.lost_reason) for e in store.inventory()
    ]
    gpus.lost.clear()
    run_until(agent, clock, T0 + 10)
    shipper.drain()
    assert [None, None] == [e.lost_since for e in store.inventory()]


def test_measured_since_is_where_unbroken_readings_began(rig: Rig) -> None:
    """Read from T0-10 on; GPU 0 (uuid B) lost T0+40..T0+60: readings count from T0+60."""
    agent, clock, gpus, node_dir = rig
    start_job(node_dir, 4, [0], T0 - 5)
    agent.tick()
    run_until(agent, clock, T0 + 30)
    assert T0 - 10 == measured_since(agent)
    gpus.lost.add("B")
    run_until(agent, clock, T0 + 60)
    gpus.lost.clear()
    run_until(agent, clock, T0 + 70)
    assert T0 + 60 == measured_since(agent)


def test_a_restart_after_a_long_stop_restarts_the_count(rig: Rig, tmp_path: Path) -> None:
    """The agent down for 2 min (more than missing_after_intervals): the count restarts."""
    agent, clock, _, node_dir = rig
    start_job(node_dir, 4, [0], T0 - 5)
    run_until(agent, clock, T0 + 30)
    clock.now = T0 + 150
    again, *_ = make_agent(tmp_path, clock=clock)
    again.tick()
    assert T0 + 140 == measured_since(again)


def measured_since(agent: NodeAgent) -> float | None:
    (payload,) = [p for _, k, _, p in agent.spool.pending(10**6) if k == "activity"]
    assert "measured_since" in json.loads(payload)
    return decode_activity(payload).measured_since
