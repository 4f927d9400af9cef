"""`policy backtest` (#11 item 15): it lists the notices an enforcing run gives, too.

A real SQLite store holding two jobs' hook events and GPU intervals; the CLI via click.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from click.testing import CliRunner

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuInterval, JobEvent, JobEventKind
from slurm_gpu.policy.backtest import backtest
from slurm_gpu.store import Store

T0 = 1_800_000_000.0


def config() -> Config:
    base = Config()
    idle = dataclasses.replace(
        base.policy.idle_gpu, warn_after=Duration(30.0), cancel_after=Duration(60.0)
    )
    return dataclasses.replace(
        base,
        policy=dataclasses.replace(base.policy, idle_gpu=idle),
        controller=dataclasses.replace(base.controller, interval=Duration(10.0)),
        node=dataclasses.replace(base.node, interval=Duration(10.0)),
        store=dataclasses.replace(base.store, ship_aggregate=Duration(10.0)),
    )


def interval(job: int, uuid: str, start: float, busy: bool) -> GpuInterval:
    util = 80.0 if busy else 0.0
    return GpuInterval(
        "gpu1", uuid, start, start + 10, job, util, util, util, 10, 10.0 if busy else 0.0,
        10.0, 2**30, 2**34, None, None, None, None,
    )  # fmt: skip


def history(store: Store) -> Store:
    """Job 5: GPU A busy, GPU B idle (a notice). Job 6: its one GPU idle (warn, cancel)."""
    events = [
        JobEvent("gpu1", 5, JobEventKind.STARTED, T0, "bob", 1002, "physics", "gpu", (0, 1)),
        JobEvent("gpu1", 6, JobEventKind.STARTED, T0, "amy", 1003, "physics", "gpu", (2,)),
        JobEvent("gpu1", 5, JobEventKind.ENDED, T0 + 120),
        JobEvent("gpu1", 6, JobEventKind.ENDED, T0 + 120),
    ]
    store.add_events(events)
    store.add_intervals(
        [
            row
            for start in range(0, 120, 10)
            for row in (
                interval(5, "GPU-A", T0 + start, busy=True),
                interval(5, "GPU-B", T0 + start, busy=False),
                interval(6, "GPU-C", T0 + start, busy=False),
            )
        ]
    )
    return store


def test_backtest_lists_the_notice_of_a_partly_idle_job(store: Store) -> None:
    """The partly idle job is noticed (never warned); the idle one is warned and cancelled."""
    result = backtest(history(store), config(), T0, T0 + 120)
    idle = result.policies["idle_gpu"]
    assert ([5], [6], [6]) == (sorted(idle.noticed), sorted(idle.warned), sorted(idle.cancelled))


def test_backtest_json_and_text_name_the_noticed_jobs(store: Store, tmp_path: Path) -> None:
    """`policy backtest --json` has a "noticed" list per policy; the text says "noticed"."""
    history(store)
    toml = tmp_path / "slurm-gpu.toml"
    toml.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\nship_aggregate = "10s"\n'
        '[node]\ninterval = "10s"\n[controller]\ninterval = "10s"\n'
        '[policy.idle_gpu]\nwarn_after = "30s"\ncancel_after = "60s"\n'
    )
    app = AppContext(env={}, default_path=toml)
    window = ["-S", f"uts{int(T0)}", "-E", f"uts{int(T0 + 120)}"]
    runner = CliRunner()
    result = runner.invoke(cli, ["policy", "backtest", *window, "--json"], obj=app)
    assert (0, None) == (result.exit_code, result.exception)
    assert [5] == json.loads(result.output)["policies"]["idle_gpu"]["noticed"]
    text = runner.invoke(
        cli, ["policy", "backtest", *window], obj=AppContext(env={}, default_path=toml)
    )
    assert "noticed 1 [5]" in text.output
