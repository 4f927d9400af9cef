"""The job timeline (reports/timeline.py): resampling the intervals and drawing them.

What a user reads in an 80-column terminal or a plain-text mail: busy columns where the
job was busy, idle ones where it idled, `?` (never the 0 % block) where nothing was read,
and no SM line on a GPU that GPM does not measure.
"""

from __future__ import annotations

import datetime as dt

from slurm_gpu.reports.timeline import (
    BLOCKS,
    Segment,
    as_json,
    bucket_seconds,
    build,
    encodes,
    render,
    resample,
)

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a multiple of 10 s (and of 1 min)
UTC = dt.UTC
H100 = ("gpu2", "GPU-h100-aaaa-bbbb")
A100 = ("gpu1", "GPU-a100-cccc-dddd")


def seg(t: float, util: float | None, sm: float | None = None, length: float = 5.0) -> Segment:
    """One agent interval of `length` s from T0 + t, fully covered."""
    return Segment(
        start=T0 + t,
        end=T0 + t + length,
        util_mean_percent=util,
        util_seconds=length if util is not None else 0.0,
        sm_active_mean_percent=sm,
        gpm_seconds=length if sm is not None else 0.0,
    )


def ten_minute_job(sm: bool = True) -> list[Segment]:
    """600 s of 5 s intervals: 300 s at 80 % (SM 30 %), then 300 s idle."""
    return [
        seg(t, 80.0 if t < 300 else 0.0, (30.0 if t < 300 else 0.0) if sm else None)
        for t in range(0, 600, 5)
    ]


def bars(lines: list[str], label: str) -> list[str]:
    """The characters between the bars of each `label` series line."""
    head = f"    {label:<4} |"
    return [line[len(head) : -1] for line in lines if line.startswith(head)]


def test_ten_minute_job_reads_busy_then_idle_in_80_columns() -> None:
    """600 s busy-then-idle: 60 columns of 10 s, the first 30 busy, the last 30 idle."""
    timeline = build({H100: ten_minute_job()}, start=T0, end=T0 + 600)
    lines = render(timeline, tz=UTC)
    assert [] == [line for line in lines if len(line) > 80]
    (util,) = bars(lines, "util")
    assert "▇" * 30 + "▁" * 30 == util  # 80 % is the 7th of 8 levels; 0 % the 1st
    (sm,) = bars(lines, "SM")
    assert "▃" * 30 + "▁" * 30 == sm  # 30 % SM activity
    assert "  Timeline 2027-01-15T08:00:00 to 2027-01-15T08:10:00, one column = 10 s" == lines[0]


def test_axis_labels_the_start_middle_and_end_under_the_columns() -> None:
    """The start under the first column, the end under the last, the middle between."""
    lines = render(build({H100: ten_minute_job()}, start=T0, end=T0 + 600), tz=UTC)
    util_line = next(line for line in lines if "util |" in line)
    axis = lines[lines.index(util_line) + 2]  # after the SM line
    assert (util_line.index("|"), util_line.rindex("|") + 1) == (
        axis.index("08:00:00"),
        axis.index("08:10:00") + len("08:10:00"),
    )
    assert "08:05:00" in axis


def test_a_gap_is_a_question_mark_never_the_zero_block() -> None:
    """30 s without readings in the idle half: 3 columns of '?', not '▁'; JSON null."""
    segments = [s for s in ten_minute_job() if not T0 + 400 <= s.start < T0 + 430]
    timeline = build({H100: segments}, start=T0, end=T0 + 600)
    (util,) = bars(render(timeline, tz=UTC), "util")
    assert "▇" * 30 + "▁" * 10 + "???" + "▁" * 17 == util
    series = as_json(timeline)["gpus"][0]["series"]  # type: ignore[index]
    assert [None, None, None] == [b["util_mean_percent"] for b in series[40:43]]
    assert [None, None, None] == [b["sm_active_mean_percent"] for b in series[40:43]]
    assert 0.0 == series[43]["util_mean_percent"]  # idle, measured: a number, 0


def test_gpu_without_gpm_has_no_sm_line_and_one_note() -> None:
    """Two A100s: two util lines, no SM line, "SM activity not measured" once."""
    other = ("gpu1", "GPU-a100-eeee-ffff")
    job = ten_minute_job(sm=False)
    timeline = build(
        {A100: job, other: job},
        start=T0,
        end=T0 + 600,
        gpm_supported={A100[1]: False, other[1]: False},
    )
    text = "\n".join(render(timeline, tz=UTC))
    assert (2, 0, 1) == (
        len(bars(text.splitlines(), "util")),
        len(bars(text.splitlines(), "SM")),
        text.count("SM activity not measured"),
    )
    assert "SM activity not measured (no GPM on this model)." in text


def test_mixed_job_names_the_gpu_without_sm_line() -> None:
    """An H100 with GPM and an A100 without: one SM line (the H100's), the A100 named."""
    timeline = build(
        {H100: ten_minute_job(), A100: ten_minute_job(sm=False)},
        start=T0,
        end=T0 + 600,
        models={H100: "NVIDIA H100 80GB HBM3", A100: "NVIDIA A100-SXM4-80GB"},
        gpm_supported={A100[1]: False, H100[1]: True},
    )
    lines = render(timeline, tz=UTC)
    names = [line.strip() for line in lines if line.startswith("  gpu")]
    assert [
        "gpu1 GPU-a100-cccc-dddd NVIDIA A100-SXM4-80GB",
        "gpu2 GPU-h100-aaaa-bbbb NVIDIA H100 80GB HBM3",
    ] == names
    assert 1 == len(bars(lines, "SM"))
    assert lines.index(next(x for x in lines if "SM   |" in x)) > lines.index(
        next(x for x in lines if "gpu2 GPU-h100" in x)
    )  # the SM line is the H100's
    assert "  SM activity not measured on gpu1/GPU-a100-ccc (no GPM on this model)." in lines
    assert [False, True] == [g["sm_measured"] for g in as_json(timeline)["gpus"]]  # type: ignore[index]


def test_bucket_mean_is_time_weighted() -> None:
    """A 10 s bucket: 5 s at 80 % and 5 s at 0 % make 40 %; a 5 s interval half in: half."""
    (bucket,) = resample([seg(0, 80.0), seg(5, 0.0)], T0, 10.0, 1)
    assert (40.0, 10.0) == (bucket.util_mean_percent, bucket.covered_seconds)
    first, second = resample([seg(5, 80.0, length=10.0)], T0, 10.0, 2)
    assert (80.0, 5.0, 80.0, 5.0) == (
        first.util_mean_percent,
        first.covered_seconds,
        second.util_mean_percent,
        second.covered_seconds,
    )


def test_bucket_mean_weights_by_the_seconds_read() -> None:
    """An interval read 1 s of 5 at 100 % next to one read 5 s at 0 %: 100/6 %, not 50 %."""
    partly = Segment(T0, T0 + 5, 100.0, 1.0, None, 0.0)
    (bucket,) = resample([partly, seg(5, 0.0)], T0, 10.0, 1)
    assert 100.0 / 6.0 == bucket.util_mean_percent


def test_long_job_resampled_to_fit_with_bucket_length_in_the_header() -> None:
    """3 days of 1 min intervals: 2 h columns (36), the axis dated, every line in 80."""
    segments = [seg(t, 90.0 if t < 86400 else 10.0, length=60.0) for t in range(0, 259200, 60)]
    timeline = build({A100: segments}, start=T0, end=T0 + 259200)
    assert timeline is not None
    lines = render(timeline, tz=UTC)
    (util,) = bars(lines, "util")
    assert (7200.0, "█" * 12 + "▁" * 24) == (timeline.bucket_seconds, util)
    assert lines[0].endswith("one column = 2 h")
    assert [] == [line for line in lines if len(line) > 80]
    assert "01-15 08:00" in lines[-3]  # the axis names the day when the job spans days


def test_bucket_never_shorter_than_the_intervals() -> None:
    """A 2-minute job of 1 min intervals: 1 min columns, not 2 s ones repeating each value.

    Nice lengths up to a week a column; past that, whole days.
    """
    assert 60.0 == bucket_seconds(120.0, native=60.0)
    assert 2.0 == bucket_seconds(120.0, native=1.0)
    assert 7 * 86400.0 == bucket_seconds(150 * 86400.0, native=60.0)  # a week a column
    assert 16 * 86400.0 == bucket_seconds(1000 * 86400.0, native=60.0)  # past: whole days


def test_ascii_fallback_draws_the_same_levels_in_ascii() -> None:
    """--ascii: `*` for 80 %, `_` for 0 %, `?` for a gap; nothing outside ASCII."""
    segments = [s for s in ten_minute_job() if not T0 + 400 <= s.start < T0 + 430]
    lines = render(build({H100: segments}, start=T0, end=T0 + 600), ascii_only=True, tz=UTC)
    (util,) = bars(lines, "util")
    assert "*" * 30 + "_" * 10 + "???" + "_" * 17 == util
    assert all(line.isascii() for line in lines)


def test_encodings_that_carry_the_blocks() -> None:
    """UTF-8 carries the blocks; ASCII, Latin-1 and an unknown encoding do not."""
    assert (True, False, False, False, False) == (
        encodes("utf-8"),
        encodes("ascii"),
        encodes("latin-1"),
        encodes("no-such-codec"),
        encodes(None),
    )
    assert 8 == len(BLOCKS)


def test_running_job_ends_at_its_newest_interval() -> None:
    """No end yet: the timeline stops at the newest shipped interval, not in gaps."""
    timeline = build({H100: ten_minute_job()[:60]}, start=T0, end=None)
    (util,) = bars(render(timeline, tz=UTC), "util")
    assert "▇" * 60 == util  # 300 s in 5 s columns


def test_gpu_with_no_readings_is_a_line_of_gaps() -> None:
    """A GPU the job held that sent nothing: all '?', next to one that did."""
    timeline = build({H100: ten_minute_job(), A100: []}, start=T0, end=T0 + 600)
    util = bars(render(timeline, tz=UTC), "util")
    assert "?" * 60 == util[0]  # gpu1 sorts first


def test_no_readings_at_all_is_one_line() -> None:
    """Nothing stored for any GPU: one sentence, no wall of '?'."""
    lines = render(build({H100: [], A100: []}, start=T0, end=T0 + 600), tz=UTC)
    assert ["  Timeline: no interval readings stored for this job (unknown, not idle)"] == lines


def test_json_series_carries_every_bucket_of_every_gpu() -> None:
    """The JSON: grid start, end and bucket length; per GPU its 60 buckets with means."""
    document = as_json(build({H100: ten_minute_job()}, start=T0, end=T0 + 600))
    assert document is not None
    (gpu,) = document["gpus"]
    first = gpu["series"][0]
    assert (T0, T0 + 600, 10.0, 60) == (
        document["start"],
        document["end"],
        document["bucket_seconds"],
        len(gpu["series"]),
    )
    assert (T0, T0 + 10, 80.0, 30.0, 10.0, 10.0) == (
        first["start"],
        first["end"],
        first["util_mean_percent"],
        first["sm_active_mean_percent"],
        first["covered_seconds"],
        first["gpm_seconds"],
    )
