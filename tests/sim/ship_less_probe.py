"""Runs a NodeAgent over the simulated library, shipping each tick into a SQLite store.

Reads {"node_dir", "spool", "store", "ticks", "interval", "fault_at", "fault": [argv]} as
JSON on stdin. Ticks every `interval` seconds of real time (the simulated GPUs are driven
by it); before tick `fault_at` (1-based) runs `fault`. Prints, per tick, the activity rows
it queued and the slots its heartbeat named: {"ticks": [{"time", "activity", "slots"}]}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from slurm_gpu.gpu.nvml import NvmlSource
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.outbox import decode_heartbeat
from slurm_gpu.node.shipper import Shipper
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.gres import GresGpuFile
from slurm_gpu.store import Store


class DeviceStat:
    def __init__(self, rdev: int) -> None:
        self.st_rdev = rdev


def stat_by_minor(path: str) -> os.stat_result:
    """/dev/nvidiaN is character device 195:N (the simulated GPUs' minors)."""
    return DeviceStat(os.makedev(195, int(path.rsplit("nvidia", 1)[1])))  # type: ignore[return-value]


def main() -> None:
    ask = json.load(sys.stdin)
    source = NvmlSource(gpm=False)
    spool = Spool(Path(ask["spool"]))
    store = Store(ask["store"], cluster="c")
    gres = [GresGpuFile(i, f"/dev/nvidia{i}", "a100") for i in range(len(source.devices()))]
    interval = float(ask["interval"])
    agent = NodeAgent(
        "gpu1", Path(ask["node_dir"]), source, spool, gres, interval=interval, period=60,
        stat=stat_by_minor,
    )  # fmt: skip
    shipper = Shipper(spool, store, "gpu1")
    ticks = []
    for n in range(1, ask["ticks"] + 1):
        if n == ask.get("fault_at"):
            subprocess.run(ask["fault"], check=True, capture_output=True)
        result = agent.tick()
        pending = spool.pending(10**6)
        (beat,) = [decode_heartbeat(r.payload) for r in pending if r.kind == "heartbeat"]
        queued = [json.loads(r.payload) for r in pending if r.kind == "activity"]
        tick = {"time": result.time, "activity": result.activity, "slots": list(beat.slots)}
        ticks.append({**tick, "rows": queued})
        shipper.drain()
        time.sleep(max(0.0, result.time + interval - time.time()))
    source.close()
    store.dispose()
    print(json.dumps({"ticks": ticks}))


if __name__ == "__main__":
    main()
