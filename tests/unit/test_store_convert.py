"""Pure pieces of the store: row conversions, the jobs-row merge, hourly merges."""

from __future__ import annotations

from slurm_gpu.models import GpuInterval, JobEvent, JobEventKind
from slurm_gpu.store import Store, convert, rollup
from slurm_gpu.store.urls import describe_url


def test_interval_row_round_trip_keeps_pids() -> None:
    """An interval converted to a row and back is equal, pids included."""
    interval = GpuInterval(
        "gpu1", "GPU-1", 1.5, 61.5, None, None, None, None, 0, 0.0, 60.0,
        None, None, None, None, None, None, (7, 8),
    )  # fmt: skip
    row = convert.interval_to_row(interval)
    assert row["unallocated_pids"] == "7,8"
    assert convert.row_to_interval(row) == interval


def test_merge_is_order_independent() -> None:
    """Started and ended events merged in either order give the same jobs row."""
    start = JobEvent("gpu1", 7, JobEventKind.STARTED, 100.0, user="bob", account="chem")
    end = JobEvent("gpu1", 7, JobEventKind.ENDED, 200.0, exit_code=2)
    a = convert.merge_job_event(convert.merge_job_event(None, start), end)
    b = convert.merge_job_event(convert.merge_job_event(None, end), start)
    assert a == b
    assert (a["state"], a["start_time"], a["end_time"], a["user"]) == (
        "FAILED",
        100.0,
        200.0,
        "bob",
    )


def test_merge_keeps_a_state_from_slurm() -> None:
    """A state set from Slurm (CANCELLED) is not replaced by the hooks' derived state."""
    end = JobEvent("gpu1", 7, JobEventKind.ENDED, 200.0, exit_code=0)
    assert convert.merge_job_event({"state": "CANCELLED"}, end)["state"] == "CANCELLED"


def test_hourly_merge_adds_sums_and_keeps_extremes() -> None:
    """Merging two hourly rows adds sums, keeps max/min, and treats None as unknown."""
    base = {name: 1.0 for name in (*rollup.SUMS, *rollup.MAXES, *rollup.MINS)}
    a = {**base, "energy_joules": None, "util_max_percent": 50.0, "util_min_percent": None}
    b = {**base, "energy_joules": 5.0, "util_max_percent": 70.0, "util_min_percent": 3.0}
    merged = rollup.merge(a, b)
    assert (merged["covered_seconds"], merged["energy_joules"]) == (2.0, 5.0)
    assert (merged["util_max_percent"], merged["util_min_percent"]) == (70.0, 3.0)


def test_describe_url_hides_user_and_password() -> None:
    """Error messages name backend, host, port and database, never the credentials."""
    store = Store("postgresql://alice:pw@db.example:5433/acct")
    assert describe_url(store.engine.url) == "postgresql://db.example:5433/acct"
    assert store.where == "postgresql://db.example:5433/acct"
