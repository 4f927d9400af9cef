"""Runs slurm-gpu's NvmlSource over the simulated library in a fresh process.

Reads {"gpm": bool, "reads": N, "pause": S, "fault_after_devices": [argv...]} as JSON on
stdin; prints {"devices": [...], "snapshots": [[...] per read], "looked_up": [...]}: the
GpuDevice and GpuSnapshot fields as JSON, and every NVML C function pynvml looked up
(pynvml resolves each once, through _nvmlGetFunctionPointer), so a test can tell which
calls NvmlSource made at all.
"""

from __future__ import annotations

import dataclasses
import json
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

from slurm_gpu.gpu import GpuSnapshot  # noqa: E402
from slurm_gpu.gpu.nvml import NvmlSource  # noqa: E402  (after the lookup is recorded)


def snapshot_record(snap: GpuSnapshot) -> dict[str, Any]:
    """A snapshot as JSON-ready fields (its samples and GPM metrics are named tuples)."""
    record = dataclasses.asdict(snap)
    record["samples"] = [s._asdict() for s in snap.samples]
    record["gpm"] = None if snap.gpm is None else snap.gpm._asdict()
    return record


def main() -> None:
    """Devices, then `reads` snapshots of each `pause` seconds apart, then close."""
    ask = json.load(sys.stdin)
    source = NvmlSource(gpm=ask["gpm"])
    devices = source.devices()
    if ask.get("fault_after_devices"):
        subprocess.run(ask["fault_after_devices"], check=True, capture_output=True)
    reads = []
    for n in range(ask["reads"]):
        if n:
            time.sleep(ask["pause"])
        reads.append([snapshot_record(source.snapshot(d, 0.0)) for d in devices])
    source.close()
    source.close()  # twice: the samples are freed once
    print(
        json.dumps(
            {
                "devices": [dataclasses.asdict(d) for d in devices],
                "snapshots": reads,
                "looked_up": sorted(set(looked_up)),
            }
        )
    )


if __name__ == "__main__":
    main()
