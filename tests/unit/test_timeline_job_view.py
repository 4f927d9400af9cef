"""`slurm-gpu job` with the timeline: from the store's intervals to the text and JSON.

A store holding one finished 10-minute job on two GPUs (an H100 that GPM measures and an
A100 it cannot), busy at 80 % for five minutes, then idle, with 30 s lost on the H100;
and a 3-hour job whose intervals were already folded into hourly rollups.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu.cli.main import cli
from slurm_gpu.models import GpuDevice, GpuInterval, JobGpuSummary
from slurm_gpu.store import Store

T0 = 1_800_000_000.0  # a multiple of 10 s and of an hour: the grid starts at the job
H100 = ("gpu2", "GPU-h100-aaaa-bbbb", "NVIDIA H100 80GB HBM3")
A100 = ("gpu1", "GPU-a100-cccc-dddd", "NVIDIA A100-SXM4-80GB")
T43 = T0 - 4 * 3600.0  # job 43, on the hour


def interval(gpu: tuple[str, str, str], job: int, t: float, util: float, length: float = 5.0,
             sm: float | None = None, t0: float = T0) -> GpuInterval:  # fmt: skip
    """One fully read interval of `gpu` from t0 + t."""
    return GpuInterval(
        node=gpu[0], gpu_uuid=gpu[1], period_start=t0 + t, period_end=t0 + t + length,
        job_id=job, util_mean_percent=util, util_max_percent=util, util_min_percent=util,
        util_sample_count=int(length), active_seconds=length if util >= 5 else 0.0,
        covered_seconds=length, mem_used_max_bytes=2**30, mem_total_bytes=80 * 2**30,
        power_mean_watts=100.0, energy_joules=100.0 * length, temperature_max_celsius=50.0,
        ecc_errors_total=0, gpm_seconds=length if sm is not None else 0.0,
        sm_active_mean_percent=sm,
    )  # fmt: skip


def summary(gpu: tuple[str, str, str], job: int, seconds: float, util: float,
            sm: float | None, t0: float = T0) -> JobGpuSummary:  # fmt: skip
    return JobGpuSummary(
        job_id=job, node=gpu[0], gpu_uuid=gpu[1], gpu_model=gpu[2], start=t0,
        end=t0 + seconds, gpu_seconds=seconds, util_mean_percent=util, util_max_percent=80.0,
        active_seconds=seconds / 2, mem_max_bytes=2**30, mem_gib_seconds=seconds,
        energy_joules=1000.0, reading_count=120, missing_seconds=0.0,
        gpm_seconds=seconds if sm is not None else 0.0, sm_active_mean_percent=sm,
    )  # fmt: skip


def job_row(job: int, seconds: float, nodes: str, gpus: int, t0: float = T0) -> dict[str, object]:
    return {"job_id": job, "user": "alice", "account": "physics", "partition": "gpu",
            "job_name": f"job{job}", "state": "COMPLETED", "submit_time": t0 - 60,
            "start_time": t0, "end_time": t0 + seconds, "nodes": nodes, "gpus": gpus}  # fmt: skip


@pytest.fixture
def store(store: Store) -> Store:
    """Job 42: 10 min on an H100 and an A100; job 43 before it: 3 h on an A100, rolled up."""
    store.upsert_jobs([job_row(42, 600, "gpu1,gpu2", 2), job_row(43, 10800, "gpu1", 1, T43)])
    store.add_intervals(
        [
            interval(A100, 43, t, 90.0 if t < 7200 else 0.0, 60.0, t0=T43)
            for t in range(0, 10800, 60)
        ]
    )
    assert (3, 180) == store.rollup_and_prune(older_than=T0)  # job 43's: now 3 hourly rows
    rows = []
    for t in range(0, 600, 5):
        busy = t < 300
        rows.append(interval(A100, 42, t, 80.0 if busy else 0.0))
        if not 400 <= t < 430:  # the H100's agent lost 30 s
            rows.append(interval(H100, 42, t, 80.0 if busy else 0.0, sm=30.0 if busy else 0.0))
    store.add_intervals(rows)
    store.add_summaries(
        [
            summary(A100, 42, 600, 40.0, None),
            summary(H100, 42, 600, 40.0, 15.0),
            summary(A100, 43, 10800, 60.0, None, t0=T43),
        ]
    )
    for (node, uuid, model), gpm in ((A100, False), (H100, True)):
        device = GpuDevice(uuid=uuid, name=model, minor=0, nvml_index=0,
                           pci_bus_id="0000:00:00.0", memory_total_bytes=80 * 2**30,
                           gpm_supported=gpm)  # fmt: skip
        store.upsert_inventory(node, [device], seen_at=T0)
    return store


def run(store: Store, tmp_path: Path, *args: str, charset: str = "utf-8") -> str:
    """`slurm-gpu ARGS` as root over the store, output in `charset`; its stdout."""
    config = tmp_path / "c.toml"
    config.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\n'
        "[reports]\nlive_sacct = false\n[access]\nslurm_roles = false\n"
    )
    done = CliRunner(charset=charset).invoke(cli, ["--config", str(config), *args])
    assert 0 == done.exit_code, done.output
    return done.output


def series_lines(text: str, label: str) -> list[str]:
    head = f"    {label:<4} |"
    return [line[len(head) : -1] for line in text.splitlines() if line.startswith(head)]


def test_job_view_draws_the_ten_minute_job_busy_then_idle(store: Store, tmp_path: Path) -> None:
    """Per GPU a util line (busy 5 min, idle 5 min); the H100's gap as '?'; its SM line."""
    text = run(store, tmp_path, "job", "42")
    a100, h100 = series_lines(text, "util")
    assert "▇" * 30 + "▁" * 30 == a100
    assert "▇" * 30 + "▁" * 10 + "???" + "▁" * 17 == h100
    assert ["▃" * 30 + "▁" * 10 + "???" + "▁" * 17] == series_lines(text, "SM")
    assert "SM activity not measured on gpu1/GPU-a100-ccc (no GPM on this model)." in text
    timeline = text[text.index("  Timeline ") : text.index("Notes:")]
    assert [] == [line for line in timeline.splitlines() if len(line) > 80]


def test_job_view_ascii_fallback(store: Store, tmp_path: Path) -> None:
    """--ascii, and an output that cannot carry Unicode: the same columns in ASCII."""
    for text in (
        run(store, tmp_path, "job", "42", "--ascii"),
        run(store, tmp_path, "job", "42", charset="ascii"),
    ):
        assert "*" * 30 + "_" * 30 == series_lines(text, "util")[0]
        assert text.isascii()


def test_job_json_carries_the_series_with_nulls_for_the_gap(store: Store, tmp_path: Path) -> None:
    """--json: per GPU 60 buckets of 10 s; the lost 30 s are null, the idle ones 0."""
    document = json.loads(run(store, tmp_path, "job", "42", "--json"))
    timeline = document["timeline"]
    by_gpu = {g["gpu_uuid"]: g for g in timeline["gpus"]}
    h100 = [b["util_mean_percent"] for b in by_gpu[H100[1]]["series"]]
    assert (10.0, 60) == (timeline["bucket_seconds"], len(h100))
    assert [80.0] * 30 + [0.0] * 10 + [None] * 3 + [0.0] * 17 == h100
    assert (False, None) == (
        by_gpu[A100[1]]["sm_measured"],
        by_gpu[A100[1]]["series"][0]["sm_active_mean_percent"],
    )


def test_rolled_up_job_is_drawn_from_its_hourly_rows(store: Store, tmp_path: Path) -> None:
    """A 3-hour job whose intervals became hourly rollups: 1 h columns, busy 2 h, idle 1."""
    text = run(store, tmp_path, "job", "43")
    assert ["██▁"] == series_lines(text, "util")  # 90 % is the top level
    assert "one column = 1 h" in text
    assert "SM activity not measured (no GPM on this model)." in text
