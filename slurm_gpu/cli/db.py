"""`slurm-gpu db ...`: create, migrate, inspect and check the accounting store."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.errors import ConfigError, SlurmError
from slurm_gpu.slurm.sacct import SacctJob, run_sacct
from slurm_gpu.slurm.squeue import ACTIVE_STATES
from slurm_gpu.slurm.timespec import format_sacct_time, now_local, parse_time
from slurm_gpu.store import Store, checks

url_option = click.option(
    "--url",
    default=None,
    metavar="URL",
    help="Store URL (default: [store] url of the config file).",
)


def _open(app: App, url: str | None) -> Store:
    """The store of --url (the config is not read), else the App's store of [store] url.

    Either is closed when the command ends.
    """
    if url is not None:
        return click.get_current_context().with_resource(Store(url))
    return app.store


@click.group("db")
def db() -> None:
    """Create, migrate, inspect and check the accounting store."""


@db.command("upgrade")
@url_option
@click.option("--revision", default="head", show_default=True, help="Target schema revision.")
@pass_app
def upgrade(app: App, url: str | None, revision: str) -> None:
    """Create the schema, or migrate it to REVISION (safe to run again: a no-op at head)."""
    store = _open(app, url)
    before = store.current_revision()
    store.upgrade(revision)
    after = store.current_revision()
    if before == after:
        click.echo(f"{store.where}: schema already at {after}")
    else:
        click.echo(f"{store.where}: schema upgraded {before or '(empty)'} -> {after}")


@db.command("current")
@url_option
@pass_app
def current(app: App, url: str | None) -> None:
    """Print the schema revision of the store and the newest this slurm-gpu knows."""
    store = _open(app, url)
    revision = store.current_revision()
    head = Store.head_revision()
    state = "up to date" if revision == head else "needs `slurm-gpu db upgrade`"
    click.echo(f"{store.where}: {revision or '(empty)'} (head {head}, {state})")


@db.command("prune")
@url_option
@click.option(
    "--older-than",
    "older_than",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Age of the readings to fold (default: [store] readings_retention).",
)
@pass_app
def prune(app: App, url: str | None, older_than: float | None) -> None:
    """Roll readings older than the retention up into hourly rows, then delete them.

    Job summaries are never pruned. Run daily (conf/systemd/slurm-gpu-db-prune.timer).
    """
    age = older_than if older_than is not None else float(app.config.store.readings_retention)
    store = _open(app, url)
    hourly, pruned = store.rollup_and_prune(time.time() - age)
    click.echo(f"{store.where}: {pruned} readings folded into {hourly} hourly rows")


@db.command("rebuild-rollups")
@url_option
@click.option(
    "--since",
    default=None,
    metavar="DATE",
    help="Only jobs that ended on or after this day (sacct's time formats; default: all).",
)
@pass_app
def rebuild_rollups(app: App, url: str | None, since: str | None) -> None:
    """Recompute the usage rollups from the raw rows.

    job_usage, usage_daily, usage_monthly, usage_across, usage_unfolded and usage_extent.

    Ingest keeps them up to date; run this after restoring raw rows, or to check them.
    With --since, the rollups of the UTC days from that day's on are rebuilt.
    """
    start = None
    if since is not None:
        try:
            start = parse_time(since, now_local(), argument="--since")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    store = _open(app, url)
    written = store.rebuild_rollups(start)
    click.echo(f"{store.where}: usage rollups rebuilt, {written} job usage rows")


# ---- db check (issue 25) ---------------------------------------------------------------

OVERLAPS = "overlapping-intervals"
NEGATIVE = "negative-intervals"
ENDED = "ended-in-slurm"
ORPHANS = "summaries-without-job"
# A job sacct shows in one of these has not ended, whatever its End says (a requeued or
# resized job's End is that of its previous record).
STILL_RUNNING = ACTIVE_STATES | {"REQUEUED", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED"}


@dataclass
class _Check:
    """One check's outcome, as the text and the JSON show it.

    `found`: every finding; `lines`: the listed ones (text), `listed`: the same as JSON;
    `reason`: why the check did not run (never clean); `closing`: its last line's text.
    """

    name: str
    found: int = 0
    lines: list[str] = field(default_factory=list)
    listed: list[dict[str, Any]] = field(default_factory=list)
    closing: str = "none"
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return self.reason is None and self.found == 0

    def document(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "checked": self.reason is None,
            "reason": self.reason,
            "found": self.found,
            "findings": self.listed,
            "left_out": self.found - len(self.listed),
            **self.extra,
        }


@db.command("check")
@url_option
@click.option("--json", "as_json", is_flag=True, help="The findings as one JSON object.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=checks.LIMIT,
    show_default=True,
    metavar="N",
    help="Findings listed per check; the others are counted.",
)
@click.option(
    "--no-slurm",
    "no_slurm",
    is_flag=True,
    help=f"Do not ask sacct ({ENDED} is then skipped, and does not fail the check).",
)
@pass_app
def check(app: App, url: str | None, as_json: bool, limit: int, no_slurm: bool) -> None:
    """Check the store's invariants and print what is wrong, one line each (read-only).

    overlapping-intervals: two gpu_intervals rows of one slot (node, slot) overlap in
    time (their time is counted twice). negative-intervals: a gpu_intervals row ends
    before it starts. ended-in-slurm: a job of [cluster] name that the store holds as
    running (no end time) has ended in Slurm (sacct -j); `slurm-gpu sync -S TIME`
    closes them. summaries-without-job: GPU summaries of a job with no jobs row, which
    no report counts.

    Each check lists its first --limit findings, then a line of its own: how many, or
    `none`, or `not checked: WHY` (sacct not reachable is never reported as clean). The
    last line sums up. Times are local, as sacct prints them; --json gives POSIX seconds.

    Exit status: 0 when every check ran and found nothing; 1 when a check found
    something or could not run, or the store could not be read; 2 on a usage error.
    """
    store = _open(app, url)
    results = [
        _overlaps(store, limit),
        _negative(store, limit),
        _check_not_run(ENDED, "skipped (--no-slurm)") if no_slurm else _ended(app, store, limit),
        _orphans(store, limit),
    ]
    failing = [r for r in results if not r.clean and not (no_slurm and r.name == ENDED)]
    if as_json:
        document = {
            "store": store.where,
            "clean": not failing,
            "checks": [r.document() for r in results],
        }
        click.echo(json.dumps(document, indent=2))
    else:
        for result in results:
            for line in result.lines:
                click.echo(f"{result.name}: {line}")
            click.echo(f"{result.name}: {result.closing}")
        click.echo(f"{store.where}: {_verdict(results, failing)}")
    if failing:
        click.get_current_context().exit(1)


def _verdict(results: Sequence[_Check], failing: Sequence[_Check]) -> str:
    found = sum(r.found for r in results)
    not_run = [r.name for r in results if r.reason is not None]
    if not failing:
        ran = len(results) - len(not_run)
        return f"clean ({ran} of {len(results)} checks ran)" if not_run else "clean"
    parts = []
    if found:
        checked = sum(1 for r in results if r.found)
        parts.append(f"{_count(found, 'finding')} in {_count(checked, 'check')}")
    if not_run:
        parts.append(f"not checked: {', '.join(not_run)}")
    return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _time(seconds: float | None) -> str:
    return format_sacct_time(seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _listed_more(listing: checks.Listing[Any]) -> str:
    return f" (first {len(listing.shown)} listed)" if listing.left_out else ""


def _span(interval: checks.Interval) -> str:
    job = "no job" if interval.job_id is None else f"job {interval.job_id}"
    return f"{job} from {_time(interval.period_start)} to {_time(interval.period_end)}"


def _where(node: str, slot_id: str) -> str:
    return f"node {node} slot {slot_id}"


def _check_not_run(name: str, reason: str) -> _Check:
    return _Check(name, closing=f"not checked: {reason}", reason=reason)


def _overlaps(store: Store, limit: int) -> _Check:
    report = checks.interval_overlaps(store, limit)
    result = _Check(OVERLAPS, found=report.overlaps.total)
    for o in report.overlaps.shown:
        where = _where(o.interval.node, o.interval.slot_id)
        if o.previous.period_end == o.earlier_end:
            other = _span(o.previous)
        else:  # the previous row ends in time: one before it does not
            other = f"an earlier interval ending {_time(o.earlier_end)}"
        by = _duration(o.overlap_seconds)
        result.lines.append(f"{where}: {_span(o.interval)} overlaps {other} by {by}")
        result.listed.append(
            {**dataclasses.asdict(o), "overlap_seconds": o.overlap_seconds},
        )
    for slot in report.slots.shown:
        counted = _count(slot.count, "interval")
        overlap = "overlaps" if slot.count == 1 else "overlap"
        result.lines.append(
            f"{_where(slot.node, slot.slot_id)}: {counted} {overlap} an earlier one"
        )
    result.extra = {
        "slots_found": report.slots.total,
        "slots": [dataclasses.asdict(s) for s in report.slots.shown],
    }
    if report.overlaps.total:
        overlap = "overlaps" if report.overlaps.total == 1 else "overlap"
        result.closing = (
            f"{_count(report.overlaps.total, 'interval')} on "
            f"{_count(report.slots.total, 'slot')} {overlap} an earlier one of the same slot"
            f"{_listed_more(report.overlaps)}: that time is counted twice"
        )
    return result


def _negative(store: Store, limit: int) -> _Check:
    listing = checks.negative_intervals(store, limit)
    result = _Check(NEGATIVE, found=listing.total)
    for interval in listing.shown:
        short = _duration(interval.period_start - interval.period_end)
        where = _where(interval.node, interval.slot_id)
        result.lines.append(f"{where}: {_span(interval)} ends {short} before it starts")
        result.listed.append(dataclasses.asdict(interval))
    if listing.total:
        end = "ends before it starts" if listing.total == 1 else "end before they start"
        result.closing = f"{_count(listing.total, 'interval')} {end}{_listed_more(listing)}"
    return result


def _orphans(store: Store, limit: int) -> _Check:
    listing = checks.orphan_summaries(store, limit)
    result = _Check(ORPHANS, found=listing.total)
    for o in listing.shown:
        result.lines.append(
            f"job {o.job_id} (cluster {o.cluster or '(none)'}): "
            f"{_count(o.summaries, 'GPU summary')} from {_time(o.first_start)} "
            f"to {_time(o.last_end)}, no jobs row"
        )
        result.listed.append(dataclasses.asdict(o))
    if listing.total:
        first = min(o.first_start for o in listing.shown)
        result.closing = (
            f"{_count(listing.total, 'job')} with GPU summaries but no jobs row"
            f"{_listed_more(listing)}: reports never count them; "
            f"`slurm-gpu sync -S {_time(first)}` adds the ones sacct still knows"
        )
    return result


def _ended(app: App, store: Store, limit: int) -> _Check:
    """The store's open jobs (no end time) that sacct says have ended, a page at a time."""
    try:
        runner = app.runner
        cluster = app.config.cluster.name
    except ConfigError as exc:
        return _check_not_run(ENDED, str(exc))
    result = _Check(ENDED)
    checked = unknown = 0
    first_end: float | None = None
    for page in checks.all_open_jobs(store, cluster):
        try:
            slurm = _by_id(run_sacct(runner, jobs=[str(j.job_id) for j in page], all_users=True))
        except SlurmError as exc:
            return _check_not_run(ENDED, str(exc))
        checked += len(page)
        for job in page:
            known = slurm.get(job.job_id)
            if known is None:
                unknown += 1
                continue
            if known.end_time is None or known.state in STILL_RUNNING:
                continue
            result.found += 1
            first_end = known.end_time if first_end is None else min(first_end, known.end_time)
            if len(result.lines) < limit:
                since = job.start_time if job.start_time is not None else job.submit_time
                result.lines.append(
                    f"job {job.job_id}: store {job.state or '(no state)'} since {_time(since)}, "
                    f"Slurm {known.state_text} at {_time(known.end_time)}"
                )
                result.listed.append(
                    {
                        "job_id": job.job_id,
                        "store_state": job.state,
                        "store_start_time": job.start_time,
                        "store_submit_time": job.submit_time,
                        "slurm_state": known.state_text,
                        "slurm_end_time": known.end_time,
                    }
                )
    fix = None if first_end is None else f"slurm-gpu sync -S {_time(first_end)}"
    result.extra = {"cluster": cluster, "open_jobs": checked, "unknown_to_sacct": unknown}
    result.extra["fix"] = fix
    of = f"of {_count(checked, 'open job')} of cluster {cluster or '(none)'}"
    unknown_note = f" ({unknown} not in sacct)" if unknown else ""
    listed = f" (first {len(result.lines)} listed)" if result.found > len(result.lines) else ""
    if result.found:
        result.closing = (
            f"{result.found} {of} ended in Slurm{unknown_note}{listed}: `{fix}` closes them"
        )
    else:
        result.closing = f"none {of} ended in Slurm{unknown_note}"
    return result


def _by_id(jobs: Sequence[SacctJob]) -> dict[int, SacctJob]:
    """sacct's rows by JobIDRaw (the id the store keeps); a later row of an id wins."""
    return {job.job_id: job for job in jobs}
