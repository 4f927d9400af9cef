"""Nodes asked to ship now, over a real nats-server (issue 26 item 3, jetstream/flush.py).

An agent with a long [node] ship_interval holds its rows; the controller's request makes
its shipper ship them at once and answer once the store has them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import Bus, flush_subject
from slurm_gpu.jetstream.flush import ask_to_flush, serve_flush_requests
from slurm_gpu.node.nats_sink import NatsSink
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.store import Store
from tests.integration.testbed import wait_for
from tests.jetstream.rig import CLUSTER, Running, spool_with, stored_intervals


def test_a_node_asked_to_flush_ships_what_it_holds_and_answers_after_the_commit(
    tmp_path: Path, settings: NatsSettings, store: Store, worker: Running
) -> None:
    spool_with(tmp_path / "gpu1.spool", "gpu1", 5).close()
    sink = NatsSink(settings, CLUSTER, "gpu1")
    stop = threading.Event()

    def agent_shipper() -> None:  # its spool opened in its own thread, as the agent's
        spool = Spool(tmp_path / "gpu1.spool")
        shipper = Shipper(spool, sink, "gpu1", ship_interval=600.0)  # alone: every 10 min
        serve_flush_requests(shipper, sink.bus, flush_subject(settings, CLUSTER, "gpu1"))
        try:
            shipper.run(stop)
        finally:
            spool.close()

    thread = threading.Thread(target=agent_shipper, daemon=True)
    thread.start()
    controller = Bus(settings, "controller")
    try:
        wait_for(lambda: len(stored_intervals(store)) == 5, 20, "the first pass")
        later = spool_with(tmp_path / "gpu1.spool", "gpu1", 3, first=2_000_000_000.0)
        later.close()
        answers = ask_to_flush(controller, settings, CLUSTER, ["gpu1", "gpu9"], timeout=5.0)
        stored = len(stored_intervals(store))  # right after the answer, not 10 minutes on
    finally:
        stop.set()
        thread.join(timeout=10)
        controller.close()
        sink.close()
    assert (8, None) == (stored, answers["gpu9"])  # gpu9 runs no agent: judged without it
    assert answers["gpu1"] is not None
