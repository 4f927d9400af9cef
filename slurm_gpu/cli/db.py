"""`slurm-gpu db ...`: create, migrate and inspect the accounting store's schema."""

from __future__ import annotations

import time

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.slurm.timespec import now_local, parse_time
from slurm_gpu.store import Store

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
    """Create, migrate and inspect the accounting store's schema."""


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
