"""`slurm-gpu db ...`: create, migrate and inspect the accounting store's schema."""

from __future__ import annotations

import click

from slurm_gpu.cli.context import AppContext, pass_app
from slurm_gpu.store import Store

url_option = click.option(
    "--url",
    default=None,
    metavar="URL",
    help="Store URL (default: [store] url of the config file).",
)


def _open(app: AppContext, url: str | None) -> Store:
    if url is not None:
        return Store(url)
    config = app.config
    return Store(config.store.url, cluster=config.cluster.name, echo=config.store.echo_sql)


@click.group("db")
def db() -> None:
    """Create, migrate and inspect the accounting store's schema."""


@db.command("upgrade")
@url_option
@click.option("--revision", default="head", show_default=True, help="Target schema revision.")
@pass_app
def upgrade(app: AppContext, url: str | None, revision: str) -> None:
    """Create the schema, or migrate it to REVISION (safe to run again: a no-op at head)."""
    store = _open(app, url)
    try:
        before = store.current_revision()
        store.upgrade(revision)
        after = store.current_revision()
    finally:
        store.dispose()
    if before == after:
        click.echo(f"{store.where}: schema already at {after}")
    else:
        click.echo(f"{store.where}: schema upgraded {before or '(empty)'} -> {after}")


@db.command("current")
@url_option
@pass_app
def current(app: AppContext, url: str | None) -> None:
    """Print the schema revision of the store and the newest this slurm-gpu knows."""
    store = _open(app, url)
    try:
        revision = store.current_revision()
    finally:
        store.dispose()
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
def prune(app: AppContext, url: str | None, older_than: float | None) -> None:
    """Roll readings older than the retention up into hourly rows, then delete them.

    Job summaries are never pruned. Run daily (conf/systemd/slurm-gpu-db-prune.timer).
    """
    import time

    age = older_than if older_than is not None else float(app.config.store.readings_retention)
    store = _open(app, url)
    try:
        hourly, pruned = store.rollup_and_prune(time.time() - age)
    finally:
        store.dispose()
    click.echo(f"{store.where}: {pruned} readings folded into {hourly} hourly rows")
