"""Runs `slurm-gpu ARGS...` under cProfile in every thread; writes PROF and PROF.txt.

Usage: profiled.py PROF ARGS...   (bench/scale/scale.py --profile runs the collector so)

cProfile profiles only the thread that enables it, and the collector's work is in its
request and writer threads: each thread enables a profiler of its own on its first call
(threading.setprofile), and the stats of all of them are summed at exit. PROF.txt lists
the top functions by own time and by cumulative time, in CPU seconds of their thread
(time.thread_time: a wait for the interpreter lock, munged or the store counts nothing).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time
from typing import Any

from slurm_gpu.cli.main import cli

_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _start(*_: Any) -> None:
    profile = cProfile.Profile(time.thread_time)  # CPU time: not the waits for the lock
    with _lock:
        _profiles.append(profile)
    profile.enable()  # replaces this hook in this thread


def _write(path: str) -> None:
    for profile in _profiles:
        profile.disable()
    stats = pstats.Stats(*_profiles)
    stats.dump_stats(path)
    text = io.StringIO()
    summary = pstats.Stats(path, stream=text)
    summary.sort_stats("tottime").print_stats(40)
    summary.sort_stats("cumulative").print_stats(60)
    with open(path + ".txt", "w") as out:
        out.write(text.getvalue())


if __name__ == "__main__":
    out = sys.argv[1]
    threading.setprofile(_start)
    _start()
    try:
        cli.main(args=sys.argv[2:], prog_name="slurm-gpu", standalone_mode=False)
    finally:
        _write(out)
