"""sacct-compatible output (reports/render.py): -P, -p, table widths, --json, --csv.

Rendered from the captured sacct rows, so the common fields must come out exactly as
sacct printed them.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from pathlib import Path

import pytest

from slurm_gpu.access import Caller, Scope
from slurm_gpu.reports.fields import job_fields
from slurm_gpu.reports.records import job_records
from slurm_gpu.reports.render import help_format, parse_format, render
from slurm_gpu.reports.usage import JobFilter, load_usage
from slurm_gpu.slurm.sacct import parse_sacct
from slurm_gpu.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
UTC = dt.UTC
COMMON = "JobID,JobName,User,Account,Partition,State,Elapsed"
ROOT = Scope(Caller(0, "root"), True, reason="root")


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The captures were taken in UTC; sacct prints local time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def records(store: Store, ids: tuple[str, ...]) -> list[dict[str, object]]:
    jobs = parse_sacct((DATA / "sacct-22.05-x1f.txt").read_text(encoding="utf-8"), tz=UTC)
    usage = load_usage(
        store,
        since=None,
        until=None,
        now=2e9,
        sacct_jobs=jobs,
        scope=ROOT,
        filters=JobFilter(job_ids=ids),
    )
    return job_records(usage)


def test_parsable2_is_sacct_P(store: Store) -> None:
    """-P: sacct's header names, '|' between fields, none after the last."""
    columns = parse_format(COMMON, job_fields())
    out = render(columns, records(store, ("270", "271", "281", "282")), "parsable2")
    assert (DATA / "sacct-22.05-P.txt").read_text(encoding="utf-8") == out


def test_parsable_is_sacct_p(store: Store) -> None:
    """-p: a '|' after every field, the header too."""
    columns = parse_format(COMMON, job_fields())
    out = render(columns, records(store, ("270", "271", "281", "282")), "parsable")
    assert (DATA / "sacct-22.05-p.txt").read_text(encoding="utf-8") == out


def test_table_is_sacct_table(store: Store) -> None:
    """Default widths, User%12, '+' on cut values, JobID left-justified: as sacct."""
    columns = parse_format("JobID,JobName,User%12,Account,Partition,State,Elapsed", job_fields())
    out = render(columns, records(store, ("270", "271", "281")), "table")
    assert (DATA / "sacct-22.05-table.txt").read_text(encoding="utf-8") == out


def test_noheader(store: Store) -> None:
    """-n drops the header (and the dashes)."""
    columns = parse_format("JobID,User", job_fields())
    assert "270|alice\n" == render(columns, records(store, ("270",)), "parsable2", header=False)


def test_field_widths_and_case() -> None:
    """Names are case-insensitive; %N sets the width, negative left-justifies."""
    columns = parse_format("jobid,user%-12,gpuutilavg%5", job_fields())
    assert [("JobID", -12), ("User", -12), ("GPUUtilAvg", 5)] == [
        (c.field.name, c.width) for c in columns
    ]
    out = render(columns, [{"job_id_text": "1", "user": "al", "util_mean_percent": 12.34}], "table")
    expected = "1".ljust(12) + " " + "al".ljust(12) + " " + "12.3".rjust(5) + " \n"
    assert expected == out.splitlines(keepends=True)[2]


def test_unknown_field_lists_the_valid_ones() -> None:
    """A typo is an error that names the field and the choices."""
    with pytest.raises(ValueError, match=r"unknown field 'GPUUtl'.*GPUUtilAvg"):
        parse_format("JobID,GPUUtl", job_fields())


def test_json_is_valid_with_numbers(store: Store) -> None:
    """--json: a list of objects with numbers as numbers, text as text."""
    columns = parse_format("JobID,JobName,AllocGPUs,GPUHours,Submit", job_fields())
    data = json.loads(render(columns, records(store, ("281",)), "json"))
    assert [
        {
            "JobID": "281",
            "JobName": "<script>alert(1)</script> ü|x",
            "AllocGPUs": 1,
            "GPUHours": 0.0,
            "Submit": 1795981151.0,
        }
    ] == data


def test_csv_round_trips(store: Store) -> None:
    """--csv quotes names with commas, quotes and newlines."""
    columns = parse_format("JobID,JobName", job_fields())
    out = render(columns, records(store, ("281", "282")), "csv")
    assert [
        ["JobID", "JobName"],
        ["281", "<script>alert(1)</script> ü|x"],
        ["282", "two\nlines"],
    ] == list(csv.reader(io.StringIO(out)))


def test_helpformat_names_units() -> None:
    """--helpformat lists every field; GPU memory-hours are GiB-hours."""
    text = help_format(job_fields())
    for name in ("JobID", "GPUHours", "GPUUtilAvg", "IdleGPUHours", "GPUMemHours", "Cost"):
        assert name in text
    assert "GiB-hours" in text
