"""`policy backtest` (#11 item 15): it lists the notices an enforcing run gives, too.

And (#13) it replays idle_gpu by either signal (utilization or GPM SM activity) and the
low_efficiency notice, from the GPM figures stored with the intervals.

A real SQLite store holding two jobs' hook events and GPU intervals; the CLI via click.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

from click.testing import CliRunner

from slurm_gpu.cli.context import AppContext
from slurm_gpu.cli.main import cli
from slurm_gpu.config import Config
from slurm_gpu.durations import Duration
from slurm_gpu.models import GpuInterval, JobEvent, JobEventKind
from slurm_gpu.policy.backtest import BacktestResult, backtest
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


def gpm_interval(job: int, uuid: str, start: float, util: float, sm: float | None) -> GpuInterval:
    """A 10 s interval at duty cycle `util` and SM activity `sm` (None: no GPM, an A100)."""
    return dataclasses.replace(
        interval(job, uuid, start, busy=util >= 5),
        util_mean_percent=util,
        gpm_seconds=0.0 if sm is None else 10.0,
        sm_active_mean_percent=sm,
    )


def gpm_history(store: Store) -> Store:
    """Job 7 fake-busy (99% / SM 1%), job 8 busy (95% / SM 70%), job 9 an idle A100."""
    loads = {7: ("GPU-H0", 99.0, 1.0), 8: ("GPU-H1", 95.0, 70.0), 9: ("GPU-A0", 0.0, None)}
    store.add_events(
        [
            JobEvent("gpu2", job, JobEventKind.STARTED, T0, "amy", 1003, "physics", "gpu", (n,))
            for n, job in enumerate(loads)
        ]
        + [JobEvent("gpu2", job, JobEventKind.ENDED, T0 + 120) for job in loads]
    )
    store.add_intervals(
        [
            gpm_interval(job, uuid, T0 + start, util, sm)
            for start in range(0, 120, 10)
            for job, (uuid, util, sm) in loads.items()
        ]
    )
    return store


def gpm_config(signal: Literal["util", "sm_active"]) -> Config:
    base = config()
    idle = dataclasses.replace(base.policy.idle_gpu, signal=signal)
    low = dataclasses.replace(base.policy.low_efficiency, notice_after=Duration(40.0))
    return dataclasses.replace(
        base, policy=dataclasses.replace(base.policy, idle_gpu=idle, low_efficiency=low)
    )


def decisions(result: BacktestResult) -> dict[str, tuple[list[int], list[int], list[int]]]:
    return {
        name: (sorted(o.warned), sorted(o.noticed), sorted(o.cancelled))
        for name, o in result.policies.items()
        if name != "max_runtime"
    }


def test_backtest_by_utilization_leaves_the_fake_busy_job_to_the_notice(store: Store) -> None:
    """signal util: only the idle A100 job is warned and cancelled; job 7 is only noticed."""
    result = backtest(gpm_history(store), gpm_config("util"), T0, T0 + 120)
    expected = {"idle_gpu": ([9], [], [9]), "low_efficiency": ([], [7], [])}
    assert ("util", expected) == (result.signal, decisions(result))


def test_backtest_by_sm_activity_cancels_the_fake_busy_job(store: Store) -> None:
    """signal sm_active: job 7 warned and cancelled too; busy job 8 untouched; A100 by util."""
    result = backtest(gpm_history(store), gpm_config("sm_active"), T0, T0 + 120)
    expected = {"idle_gpu": ([7, 9], [], [7, 9]), "low_efficiency": ([], [7], [])}
    assert ("sm_active", expected) == (result.signal, decisions(result))


def test_backtest_signal_option_overrides_the_config(store: Store, tmp_path: Path) -> None:
    """`policy backtest --signal sm_active` replays SM activity; the text names the signal."""
    gpm_history(store)
    toml = tmp_path / "slurm-gpu.toml"
    toml.write_text(
        f'[cluster]\nname = "c"\n[store]\nurl = "{store.engine.url}"\nship_aggregate = "10s"\n'
        '[node]\ninterval = "10s"\n[controller]\ninterval = "10s"\n'
        '[policy.idle_gpu]\nwarn_after = "30s"\ncancel_after = "60s"\n'
        '[policy.low_efficiency]\nnotice_after = "40s"\n'
    )
    window = ["-S", f"uts{int(T0)}", "-E", f"uts{int(T0 + 120)}"]
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["policy", "backtest", *window, "--signal", "sm_active", "--json"],
        obj=AppContext(env={}, default_path=toml),
    )
    assert (0, None) == (result.exit_code, result.exception)
    document = json.loads(result.output)
    assert ("sm_active", [7, 9], [7]) == (
        document["signal"],
        document["policies"]["idle_gpu"]["cancelled"],
        document["policies"]["low_efficiency"]["noticed"],
    )
    text = runner.invoke(
        cli, ["policy", "backtest", *window], obj=AppContext(env={}, default_path=toml)
    ).output
    assert [
        "idle_gpu (signal util): warned 1 [9]; noticed 0 []; cancelled 1 [9]; "
        "GPU-hours returned 0.02",
        "low_efficiency: warned 0 []; noticed 1 [7]; cancelled 0 []; GPU-hours returned 0.00",
    ] == text.splitlines()[1:3]
