"""Runs NvmlSource's MIG and per-process reads over the simulated library in a fresh process.

Reads {"gpm": bool, "reads": N, "pause": S, "align": bool, "since": T, "between": [argv],
"count": [pynvml function names]} as JSON on stdin. devices(), then `reads` rounds `pause`
seconds apart (the first just after a whole second when `align`). Each round: snapshot(d, 0)
of every GPU, mig_snapshot(d, m) of each of its MIG devices, process_utilization(d, since)
of every GPU, `since` being the previous round's last_seen (at first T, or 0). `between`
runs after the first round. Prints {"devices", "rounds": [{"snapshots", "migs",
"process_util"}], "looked_up", "logs", "calls"}: the records as JSON, every NVML C function
pynvml looked up, each log message NvmlSource wrote (level, text), and how often each
function of "count" was called.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from typing import Any

import pynvml

looked_up: list[str] = []
_lookup = pynvml._nvmlGetFunctionPointer


def _recording_lookup(name: str) -> Any:
    looked_up.append(name)
    return _lookup(name)


pynvml._nvmlGetFunctionPointer = _recording_lookup

from slurm_gpu.gpu.nvml import NvmlSource  # noqa: E402  (after the lookup is recorded)


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))


def _record(value: Any) -> Any:
    """A dataclass of the source as JSON-ready fields (named tuples as dicts)."""
    record = dataclasses.asdict(value)
    for name in ("gpm",):
        if name in record:
            gpm = getattr(value, name)
            record[name] = None if gpm is None else gpm._asdict()
    if "samples" in record:
        record["samples"] = [s._asdict() for s in value.samples]
    if "processes" in record and isinstance(value.processes, tuple) and value.processes:
        first = value.processes[0]
        if hasattr(first, "_asdict"):
            record["processes"] = [p._asdict() for p in value.processes]
    return record


def _counting(name: str, call: Any, calls: dict[str, int]) -> Any:
    """`call`, counting each use in calls[name] (NvmlSource looks pynvml's up each time)."""

    def counted(*args: Any) -> Any:
        calls[name] += 1
        return call(*args)

    return counted


def main() -> None:
    """Devices, then the rounds, then close (twice)."""
    ask = json.load(sys.stdin)
    calls = {name: 0 for name in ask.get("count", [])}
    for name in calls:
        setattr(pynvml, name, _counting(name, getattr(pynvml, name), calls))
    logs = _Logs()
    logging.getLogger("slurm_gpu").addHandler(logs)
    logging.getLogger("slurm_gpu").setLevel(logging.INFO)
    source = NvmlSource(gpm=ask.get("gpm", True))
    devices = source.devices()
    since = {d.uuid: float(ask.get("since", 0.0)) for d in devices}
    rounds = []
    for n in range(ask.get("reads", 2)):
        if n:
            time.sleep(ask.get("pause", 1.2))
        elif ask.get("align"):
            time.sleep(1.05 - time.time() % 1)
        snapshots = [_record(source.snapshot(d, 0.0)) for d in devices]
        migs = [_record(source.mig_snapshot(d, m)) for d in devices for m in d.mig_devices]
        util = []
        for d in devices:
            read = source.process_utilization(d, since[d.uuid])
            since[d.uuid] = read.last_seen
            util.append(_record(read))
        rounds.append({"snapshots": snapshots, "migs": migs, "process_util": util})
        if n == 0 and ask.get("between"):
            subprocess.run(ask["between"], check=True, capture_output=True)
    source.close()
    source.close()
    print(
        json.dumps(
            {
                "devices": [dataclasses.asdict(d) for d in devices],
                "rounds": rounds,
                "looked_up": sorted(set(looked_up)),
                "logs": logs.records,
                "calls": calls,
            }
        )
    )


if __name__ == "__main__":
    main()
