"""`slurm-gpu policy backtest`: try the job policies on the stored history."""

from __future__ import annotations

import dataclasses
import json
from typing import Literal, cast

import click

from slurm_gpu.app import App
from slurm_gpu.cli.context import pass_app
from slurm_gpu.cli.params import sacct_time
from slurm_gpu.durations import parse_duration
from slurm_gpu.policy.backtest import BacktestResult, backtest


@click.group("policy")
def policy_group() -> None:
    """Policies: try them on history before enforcing."""


@policy_group.command("backtest")
@click.option("-S", "--starttime", "start", required=True, help="From (sacct time formats).")
@click.option("-E", "--endtime", "end", default="now", show_default=True, help="Until.")
@click.option("--step", default=None, help="Replay step (default: [controller] interval).")
@click.option(
    "--signal",
    type=click.Choice(["util", "sm_active"]),
    default=None,
    help="What idle_gpu judges idle by (default: [policy.idle_gpu] signal).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
@pass_app
def backtest_cmd(
    app: App, start: str, end: str, step: str | None, signal: str | None, as_json: bool
) -> None:
    """What idle_gpu, low_efficiency and max_runtime would have done over the stored history.

    Like sacct, a user replays their own jobs only (a coordinator their accounts').
    `--signal sm_active` replays idle_gpu by SM activity (GPM) where it was measured.
    """
    since = sacct_time(start, "-S/--starttime")
    until = sacct_time(end, "-E/--endtime")
    assert since is not None and until is not None  # both options always have a value
    try:
        step_seconds = parse_duration(step) if step else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--step") from None
    config = app.config
    if signal is not None:  # click.Choice allowed only the two
        idle = dataclasses.replace(
            config.policy.idle_gpu, signal=cast(Literal["util", "sm_active"], signal)
        )
        config = dataclasses.replace(
            config, policy=dataclasses.replace(config.policy, idle_gpu=idle)
        )
    result = backtest(app.store, config, since, until, step_seconds, scope=app.scope)
    if as_json:
        click.echo(json.dumps(_document(result), indent=2))
        return
    click.echo(f"{result.jobs} GPU jobs replayed every {result.step:g}s")
    for name, outcome in result.policies.items():
        label = f"{name} (signal {result.signal})" if name == "idle_gpu" else name
        click.echo(
            f"{label}: warned {len(outcome.warned)} {sorted(outcome.warned)}; "
            f"noticed {len(outcome.noticed)} {sorted(outcome.noticed)}; "
            f"cancelled {len(outcome.cancelled)} {sorted(outcome.cancelled)}; "
            f"GPU-hours returned {outcome.gpu_hours_returned:.2f}"
        )


def _document(result: BacktestResult) -> dict[str, object]:
    """`--json`'s document: the period, the jobs replayed, each policy's decisions."""
    return {
        "since": result.since,
        "until": result.until,
        "jobs": result.jobs,
        "signal": result.signal,
        "policies": {
            name: {
                "warned": sorted(o.warned),
                "noticed": sorted(o.noticed),
                "cancelled": sorted(o.cancelled),
                "gpu_hours_returned": round(o.gpu_hours_returned, 4),
            }
            for name, o in result.policies.items()
        },
    }
