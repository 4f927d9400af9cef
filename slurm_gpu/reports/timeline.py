"""A job's life per GPU: its intervals resampled into time buckets, drawn as text.

`slurm-gpu job` shows, per GPU, a line of utilization (and one of SM activity where NVML
GPM measured it) over the job's time: one character per bucket, the bucket's
time-weighted mean as one of eight levels. It has to read in an 80-column terminal and
in a plain-text mail (issue #15), so it is pure text: Unicode blocks (▁▂▃▄▅▆▇█) where the
output can carry them, an ASCII ramp (_.-:=+*#) otherwise.

Unknown is never 0 (docs/architecture.md, "Missing data is never idle"): a bucket with
no reading is `?` in the text and null in the JSON; 0 % is the lowest block, which a gap
never is. A GPU without GPM has no SM line, and the timeline says so once.

The series come from the store's intervals (`Store.intervals(job_id=...)`) and, for the
part of an old job already folded into hourly rollups, from those (`Store.hourly`): an
hourly row is one segment from its first period's start to its last period's end.
"""

from __future__ import annotations

import datetime as dt
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.models import GpuInterval
from slurm_gpu.slurm.timespec import format_sacct_time
from slurm_gpu.store.rollup import GpuHourly
from slurm_gpu.units import is_known

WIDTH = 80  # the terminal and the mail the timeline must fit
COLUMNS = 64  # at most this many buckets: "    util |" + 64 + "|" fits in 80
LABEL = "    {:<4} "  # before a series' line: 10 characters
BLOCKS = "▁▂▃▄▅▆▇█"
ASCII_LEVELS = "_.-:=+*#"
GAP = "?"  # a bucket with no reading: unknown, never drawn as 0
# Bucket lengths a reader can count in: the smallest that fits the job in COLUMNS
# (and is no shorter than the job's intervals) is used. Past the last, whole days.
NICE_SECONDS = (
    *(1, 2, 5, 10, 15, 20, 30),
    *(60 * m for m in (1, 2, 5, 10, 15, 20, 30)),
    *(3600 * h for h in (1, 2, 3, 4, 6, 12)),
    *(86400 * d for d in (1, 2, 7)),
)


@dataclass(frozen=True)
class Segment:
    """A stretch of one GPU's record: one interval, or one hourly rollup row.

    Attributes:
        start: first second (epoch).
        end: end (epoch), after `start`.
        util_mean_percent: mean utilization over `util_seconds` (None: no reading).
        util_seconds: the seconds that mean is over (the covered seconds with a
            utilization reading).
        sm_active_mean_percent: GPM SM activity over `gpm_seconds` (None: not measured).
        gpm_seconds: the seconds GPM measured.
        mem_used_max_bytes: the most memory used (None: unknown).
    """

    start: float
    end: float
    util_mean_percent: float | None
    util_seconds: float
    sm_active_mean_percent: float | None
    gpm_seconds: float
    mem_used_max_bytes: int | None = None


def from_interval(row: GpuInterval) -> Segment:
    """One stored interval as a segment (its util over its covered seconds)."""
    util = row.util_mean_percent if is_known(row.util_mean_percent) else None
    sm = row.sm_active_mean_percent if is_known(row.sm_active_mean_percent) else None
    return Segment(
        start=row.period_start,
        end=row.period_end,
        util_mean_percent=util,
        util_seconds=row.covered_seconds if util is not None else 0.0,
        sm_active_mean_percent=sm,
        gpm_seconds=row.gpm_seconds if sm is not None else 0.0,
        mem_used_max_bytes=row.mem_used_max_bytes,
    )


def from_hourly(row: GpuHourly) -> Segment:
    """One hourly rollup row as a segment over [first period start, last period end)."""
    sm = row.sm_active_mean_percent
    return Segment(
        start=row.first_period_start,
        end=row.last_period_end,
        util_mean_percent=row.util_mean_percent,
        util_seconds=row.util_covered_seconds,
        sm_active_mean_percent=sm,
        gpm_seconds=row.sm_active_gpm_seconds if sm is not None else 0.0,
        mem_used_max_bytes=row.mem_used_max_bytes,
    )


@dataclass(frozen=True)
class Bucket:
    """One column of the timeline: the time-weighted means over [start, end).

    `covered_seconds` and `gpm_seconds` are the seconds of reading in the bucket (a
    segment counts for the share of it inside the bucket); a mean is None when they are 0.
    """

    start: float
    end: float
    util_mean_percent: float | None
    sm_active_mean_percent: float | None
    covered_seconds: float
    gpm_seconds: float
    mem_used_max_bytes: int | None


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's buckets; `gpm_supported` from the agent's inventory (None: unknown)."""

    node: str
    gpu_uuid: str
    gpu_model: str
    gpm_supported: bool | None
    buckets: tuple[Bucket, ...]

    @property
    def sm_measured(self) -> bool:
        """Whether any bucket has an SM activity (else: no SM line, never 0 %)."""
        return any(b.sm_active_mean_percent is not None for b in self.buckets)


@dataclass(frozen=True)
class Timeline:
    """Every GPU of a job over the same buckets: [start, end) in `bucket_seconds` steps."""

    start: float
    end: float
    bucket_seconds: float
    gpus: tuple[GpuSeries, ...]


def bucket_seconds(span: float, native: float = 0.0, columns: int = COLUMNS) -> float:
    """The smallest nice bucket length not under `native` that fits `span` in `columns`.

    The grid starts at a multiple of the bucket length (so the agent's periods, which
    start on multiples of theirs, fall into whole buckets): one bucket more is allowed
    for that, within `columns`.
    """
    need = max(span / max(columns - 1, 1), native, 1.0)
    for length in NICE_SECONDS:
        if length >= need:
            return float(length)
    return float(math.ceil(need / 86400.0) * 86400)


def resample(
    segments: Iterable[Segment], start: float, length: float, count: int
) -> tuple[Bucket, ...]:
    """The segments as `count` buckets of `length` seconds from `start`.

    A segment counts in each bucket for the share of its time inside it (time-weighted):
    a 5 s interval at 80 % half inside a 10 s bucket whose other half is idle makes 40 %.
    A bucket that no reading reaches is None (unknown), not 0.
    """
    util_sum = [0.0] * count
    util_w = [0.0] * count
    sm_sum = [0.0] * count
    sm_w = [0.0] * count
    mem: list[int | None] = [None] * count
    for seg in segments:
        span = seg.end - seg.start
        if span <= 0:
            continue
        first = max(int((seg.start - start) // length), 0)
        last = min(math.ceil((seg.end - start) / length), count)
        for k in range(first, last):
            lo, hi = start + k * length, start + (k + 1) * length
            share = (min(seg.end, hi) - max(seg.start, lo)) / span
            if share <= 0:
                continue
            if seg.util_mean_percent is not None and seg.util_seconds > 0:
                util_w[k] += seg.util_seconds * share
                util_sum[k] += seg.util_mean_percent * seg.util_seconds * share
            if seg.sm_active_mean_percent is not None and seg.gpm_seconds > 0:
                sm_w[k] += seg.gpm_seconds * share
                sm_sum[k] += seg.sm_active_mean_percent * seg.gpm_seconds * share
            if seg.mem_used_max_bytes is not None:
                mem[k] = max(mem[k] or 0, seg.mem_used_max_bytes)
    return tuple(
        Bucket(
            start=start + k * length,
            end=start + (k + 1) * length,
            util_mean_percent=util_sum[k] / util_w[k] if util_w[k] > 0 else None,
            sm_active_mean_percent=sm_sum[k] / sm_w[k] if sm_w[k] > 0 else None,
            covered_seconds=util_w[k],
            gpm_seconds=sm_w[k],
            mem_used_max_bytes=mem[k],
        )
        for k in range(count)
    )


def build(
    segments: Mapping[tuple[str, str], Sequence[Segment]],
    *,
    start: float | None,
    end: float | None,
    models: Mapping[tuple[str, str], str] | None = None,
    gpm_supported: Mapping[str, bool | None] | None = None,
    columns: int = COLUMNS,
) -> Timeline | None:
    """Every GPU's segments on one grid from `start` to `end` (None: the data's own).

    Args:
        segments: per (node, gpu_uuid), its segments; a GPU with none is a line of gaps.
        start: the job's start (the timeline reaches back to the first segment if earlier).
        end: the job's end, or None for a running job (its newest segment's end).
        models: per (node, gpu_uuid), the GPU model to name.
        gpm_supported: per GPU UUID, whether it has GPM (the agent's inventory).
        columns: at most this many buckets.

    Returns:
        None when there is neither a span nor any segment to draw.
    """
    every = [s for part in segments.values() for s in part if s.end > s.start]
    starts = [s.start for s in every] + ([start] if is_known(start) and start > 0 else [])
    ends = [s.end for s in every] + ([end] if is_known(end) and end > 0 else [])
    if not segments or not starts or not ends:
        return None
    first, last = min(starts), max(ends)
    if last <= first:
        return None
    lengths = sorted(s.end - s.start for s in every)
    native = lengths[len(lengths) // 2] if lengths else 0.0
    length = bucket_seconds(last - first, native, columns)
    grid = math.floor(first / length) * length
    count = max(math.ceil((last - grid) / length), 1)
    models = models or {}
    gpm_supported = gpm_supported or {}
    gpus = tuple(
        GpuSeries(
            node=node,
            gpu_uuid=uuid,
            gpu_model=models.get((node, uuid), ""),
            gpm_supported=gpm_supported.get(uuid),
            buckets=resample(segments[node, uuid], grid, length, count),
        )
        for node, uuid in sorted(segments)
    )
    return Timeline(start=grid, end=grid + count * length, bucket_seconds=length, gpus=gpus)


def level(percent: float | None, ascii_only: bool = False) -> str:
    """One bucket's character: eight levels of 12.5 %, or GAP when unknown."""
    if percent is None or not is_known(percent):
        return GAP
    ramp = ASCII_LEVELS if ascii_only else BLOCKS
    return ramp[min(max(int(percent * len(ramp) / 100.0), 0), len(ramp) - 1)]


def line(values: Sequence[float | None], ascii_only: bool = False) -> str:
    """The characters of one series, between bars: `|▇▇▇▁▁?|`."""
    return "|" + "".join(level(v, ascii_only) for v in values) + "|"


def duration_text(seconds: float) -> str:
    """A bucket length in words: 10 s, 5 min, 2 h, 1 d."""
    for unit, name in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= unit and seconds % unit == 0:
            return f"{int(seconds // unit)} {name}"
    return f"{seconds:g} s"


def _clock(seconds: float, span: float, tz: dt.tzinfo | None) -> str:
    """An axis label: the time of day, with the date when the job spans days."""
    full = format_sacct_time(seconds, tz)
    return full[5:16].replace("T", " ") if span >= 86400 else full[11:19]


def axis(timeline: Timeline, tz: dt.tzinfo | None = None) -> str:
    """The labels under the buckets: start at the left edge, end at the right one."""
    count = len(timeline.gpus[0].buckets) if timeline.gpus else 0
    span = timeline.end - timeline.start
    left, right = _clock(timeline.start, span, tz), _clock(timeline.end, span, tz)
    pad = " " * len(LABEL.format(""))
    inner = count + 2  # the buckets and the two bars
    if inner < len(left) + len(right) + 1:
        return f"{pad}{left} .. {right}"
    middle = ""
    if inner >= 2 * (len(left) + len(right)) + 4:
        mid = _clock(timeline.start + span / 2, span, tz)
        at = inner // 2 - len(mid) // 2
        middle = " " * (at - len(left)) + mid
    text = left + middle
    return pad + text + " " * (inner - len(text) - len(right)) + right


def render(
    timeline: Timeline | None, *, ascii_only: bool = False, tz: dt.tzinfo | None = None
) -> list[str]:
    """The timeline's lines, none over WIDTH characters ([] when there is none)."""
    if timeline is None or not timeline.gpus:
        return []
    if not any(
        b.util_mean_percent is not None or b.sm_active_mean_percent is not None
        for g in timeline.gpus
        for b in g.buckets
    ):  # one line, not a wall of gaps
        return ["  Timeline: no interval readings stored for this job (unknown, not idle)"]
    out = [
        f"  Timeline {format_sacct_time(timeline.start, tz)} to "
        f"{format_sacct_time(timeline.end, tz)}, one column = "
        f"{duration_text(timeline.bucket_seconds)}",
    ]
    for gpu in timeline.gpus:
        out.append(f"  {gpu.node} {gpu.gpu_uuid} {gpu.gpu_model}".rstrip()[:WIDTH])
        out.append(
            LABEL.format("util") + line([b.util_mean_percent for b in gpu.buckets], ascii_only)
        )
        if gpu.sm_measured:
            sm = [b.sm_active_mean_percent for b in gpu.buckets]
            out.append(LABEL.format("SM") + line(sm, ascii_only))
    out.append(axis(timeline, tz))
    ramp = ASCII_LEVELS if ascii_only else BLOCKS
    out.append(
        f"  Scale {ramp[0]} 0-12% {' '.join(ramp[1:-1])} {ramp[-1]} 88-100% (12.5% steps); "
        f"{GAP} no reading, not 0%"
    )
    unmeasured = [g for g in timeline.gpus if not g.sm_measured]
    if unmeasured:
        names = ", ".join(f"{g.node}/{g.gpu_uuid[:12]}" for g in unmeasured)
        why = (
            "no GPM on this model"
            if all(g.gpm_supported is False for g in unmeasured)
            else "no GPM readings"
        )
        where = "" if len(unmeasured) == len(timeline.gpus) else f" on {names}"
        out += textwrap.wrap(
            f"SM activity not measured{where} ({why}).",
            WIDTH,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    return out


def as_json(timeline: Timeline | None) -> dict[str, Any] | None:
    """The series for `--json`: per GPU its buckets; an unknown mean is null, never 0."""
    if timeline is None:
        return None
    return {
        "start": timeline.start,
        "end": timeline.end,
        "bucket_seconds": timeline.bucket_seconds,
        "gpus": [
            {
                "node": g.node,
                "gpu_uuid": g.gpu_uuid,
                "gpu_model": g.gpu_model,
                "sm_measured": g.sm_measured,
                "series": [
                    {
                        "start": b.start,
                        "end": b.end,
                        "util_mean_percent": b.util_mean_percent,
                        "sm_active_mean_percent": b.sm_active_mean_percent,
                        "covered_seconds": b.covered_seconds,
                        "gpm_seconds": b.gpm_seconds,
                        "mem_used_max_bytes": b.mem_used_max_bytes,
                    }
                    for b in g.buckets
                ],
            }
            for g in timeline.gpus
        ],
    }


def encodes(encoding: str | None) -> bool:
    """Whether text in `encoding` can carry the Unicode blocks (else: the ASCII ramp)."""
    if not encoding:
        return False
    try:
        BLOCKS.encode(encoding)
    except (LookupError, UnicodeEncodeError):
        return False
    return True
