"""The AdminComment token, version 2 (issue #13): v1's fields plus the GPM figures.

What `sacct -o AdminComment` shows a user: a job on H100s carries its SM activity,
occupancy, tensor and DRAM means and its effective GPU-seconds; a job on A100s (no GPM)
carries none of them, never a 0; a v1 token written before still reads, and a reader
of v1 tokens (any version, key=value pairs) reads a v2 one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_gpu.models import JobGpuSummary
from slurm_gpu.slurm.admin_comment import (
    merge_token,
    parse_token,
    summary_token,
    token_version,
    write_job_summary,
)

T0 = 1_700_000_000.0
V1_FIELDS = (
    "gpus",
    "gpu_s",
    "util_avg",
    "util_max",
    "active_s",
    "mem_max_mib",
    "energy_j",
    "missing_s",
    "missing",
)
GPM_TOKEN_FIELDS = ("gpm_s", "sm_avg", "occ_avg", "tensor_avg", "dram_avg", "eff_gpu_s")


def gpu(
    uuid: str,
    hours: float = 1.0,
    sm: float | None = None,
    gpm_hours: float | None = None,
    tensor: float | None = None,
) -> JobGpuSummary:
    """Job 5's summary of one GPU at 90% utilization; sm None: a GPU without GPM."""
    seconds = 3600.0 * hours
    measured = sm is not None
    return JobGpuSummary(
        job_id=5, node="gpu2", gpu_uuid=uuid, gpu_model="NVIDIA H100", start=T0,
        end=T0 + seconds, gpu_seconds=seconds, util_mean_percent=90.0,
        util_max_percent=98.0, active_seconds=0.9 * seconds, mem_max_bytes=40 * 2**30,
        mem_gib_seconds=40 * seconds, energy_joules=300.0 * seconds, reading_count=60,
        missing_seconds=0.0,
        gpm_seconds=(3600.0 * (gpm_hours if gpm_hours is not None else hours)) if measured else 0.0,
        sm_active_mean_percent=sm,
        sm_occupancy_mean_percent=None if sm is None else sm / 2,
        tensor_active_mean_percent=tensor if measured else None,
        dram_bw_mean_percent=None if sm is None else 25.0,
    )  # fmt: skip


def old_reader(text: str) -> dict[str, str]:
    """The v1 parser as released (slurm-gpu before #13), verbatim."""
    match = re.compile(r"slurm-gpu:v\d+:[^\s]*").search(text)
    if match is None:
        return {}
    body = match.group(0).split(":", 2)[2]
    return dict(item.split("=", 1) for item in body.split(",") if "=" in item)


def test_v2_token_carries_the_gpm_figures_weighted_by_measured_seconds() -> None:
    """Two H100s: SM 30% for 1 h and 60% for 2 h -> sm_avg 50.0; eff = 0.3 h + 1.2 h."""
    token = summary_token([gpu("G0", 1.0, sm=30.0, tensor=60.0), gpu("G1", 2.0, sm=60.0)])
    assert token.startswith("slurm-gpu:v2:")
    fields = parse_token(token)
    assert {
        "gpm_s": "10800",
        "sm_avg": "50.0",
        "occ_avg": "25.0",
        "tensor_avg": "60.0",  # only G0 measured tensor: weighted over its seconds alone
        "dram_avg": "25.0",
        "eff_gpu_s": "5400",
    } == {name: fields[name] for name in GPM_TOKEN_FIELDS}
    assert 2 == token_version(token)
    # Every v1 field is there with its v1 meaning.
    assert ("2", "10800", "90.0", "98", "0", "0") == tuple(
        fields[n] for n in ("gpus", "gpu_s", "util_avg", "util_max", "missing_s", "missing")
    )


def test_job_without_gpm_leaves_the_gpm_fields_out() -> None:
    """A100s (no GPM): no sm_avg=0, no gpm_s=0, nothing; the v1 fields as before."""
    fields = parse_token(summary_token([gpu("A0"), gpu("A1")]))
    assert [] == [name for name in GPM_TOKEN_FIELDS if name in fields]
    assert set(V1_FIELDS) == set(fields)


def test_partly_measured_job_says_how_much_was_measured() -> None:
    """An H100 and an A100: the means are the H100's; gpm_s < gpu_s shows it is partial."""
    fields = parse_token(summary_token([gpu("H0", 1.0, sm=40.0, gpm_hours=0.5), gpu("A0", 1.0)]))
    assert ("7200", "1800", "40.0", "1440") == (
        fields["gpu_s"],
        fields["gpm_s"],
        fields["sm_avg"],
        fields["eff_gpu_s"],  # the H100's whole hour x 40% SM activity
    )
    assert "tensor_avg" not in fields


def test_v1_token_still_parses() -> None:
    """A token written by an older slurm-gpu reads with the same fields, version 1."""
    comment = "ticket 42 slurm-gpu:v1:gpus=2,gpu_s=180,util_avg=70.1,missing_s=0,missing=0"
    assert {
        "gpus": "2",
        "gpu_s": "180",
        "util_avg": "70.1",
        "missing_s": "0",
        "missing": "0",
    } == parse_token(comment)
    assert 1 == token_version(comment)
    assert None is token_version("ticket 42") and {} == parse_token("ticket 42")


def test_old_reader_reads_a_v2_token_and_newer_fields_are_ignorable() -> None:
    """The released v1 parser gets every v1 field of a v2 token, unchanged."""
    token = summary_token([gpu("G0", 1.0, sm=30.0, tensor=60.0)])
    old, new = old_reader(f"note {token}"), parse_token(f"note {token}")
    assert old == new
    assert {n: new[n] for n in V1_FIELDS} == {n: old[n] for n in V1_FIELDS}
    # A later version's field this version does not know is there to ignore, not an error.
    future = "slurm-gpu:v3:gpus=1,gpu_s=60,fp8_avg=12.5"
    assert (3, "60", "12.5") == (
        token_version(future),
        parse_token(future)["gpu_s"],
        parse_token(future)["fp8_avg"],
    )


def test_v2_round_trip_and_it_replaces_a_v1_token() -> None:
    """merge_token swaps an older job token for the v2 one and keeps the admins' text."""
    summaries = [gpu("G0", 1.0, sm=33.3, tensor=12.5)]
    token = summary_token(summaries)
    merged = merge_token("ticket 42 slurm-gpu:v1:gpus=1,gpu_s=60 checked", token)
    assert "ticket 42 checked " + token == merged
    assert parse_token(token) == parse_token(merged)
    assert token == summary_token(summaries)  # same summaries, same token


def test_write_job_summary_sends_the_v2_token_to_sacctmgr() -> None:
    """The AdminComment set through sacctmgr is the v2 token merged into what was there."""
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> str:
        calls.append(list(argv))
        return "ticket 7\n" if argv[0] == "sacct" else ""

    merged = write_job_summary(run, 5, [gpu("G0", 1.0, sm=30.0)])
    assert merged.startswith("ticket 7 slurm-gpu:v2:")
    assert f"AdminComment={merged}" == calls[-1][-1]
    assert "30.0" == parse_token(merged)["sm_avg"]


def test_a_suspended_jobs_token_says_how_long_its_gpus_were_suspended() -> None:
    """sacct's Suspended comes first on its line; the site's comment may hold `|`."""
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> str:
        calls.append(list(argv))
        return "00:02:00|ticket|7\n" if argv[0] == "sacct" else ""

    merged = write_job_summary(run, 5, [gpu("G0", 1.0), gpu("G1", 1.0)])
    assert "Suspended,AdminComment" in calls[0]
    assert merged.startswith("ticket|7 slurm-gpu:v2:")
    token = parse_token(merged)
    assert str(2 * 120) == token["susp_s"]
    assert "susp_s" not in parse_token(
        write_job_summary(lambda argv: "00:00:00|\n", 6, [gpu("G0", 1.0)])
    )
