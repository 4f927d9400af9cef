"""low_efficiency (#13): a notice about GPUs that look busy but barely compute, never a cancel.

Pure `evaluate()` over hand-made activity rows and stored intervals (one per minute).
"""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

import pytest

from slurm_gpu.config import Config, parse_settings
from slurm_gpu.config.policy import ControllerSettings, LowEfficiencySettings
from slurm_gpu.errors import ConfigError
from slurm_gpu.models import Action, GpuActivity, GpuInterval, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate

NOW = 1_717_236_000.0  # 2024-06-01 10:00:00 UTC
MIN = 60.0
START = NOW - 3 * 3600


def config(**low: Any) -> Config:
    """Defaults (80% duty cycle, under 10% SM, 30 min), only low_efficiency on; UTC."""
    base = Config()
    policy = dataclasses.replace(
        base.policy,
        idle_gpu=dataclasses.replace(base.policy.idle_gpu, enabled=False),
        max_runtime=dataclasses.replace(base.policy.max_runtime, enabled=False),
        low_efficiency=dataclasses.replace(LowEfficiencySettings(), **low),
    )
    return dataclasses.replace(base, controller=ControllerSettings(timezone="UTC"), policy=policy)


CONFIG = config()


def job(gpus: tuple[int, ...] = (0,), job_id: int = 1) -> SlurmJob:
    return SlurmJob(
        job_id, "alice", "physics", "gpu", "RUNNING", start_time=START,
        gpu_count=len(gpus), nodes=("gpu2",), gpus=(("gpu2", gpus),),
    )  # fmt: skip


def row(index: int = 0, util: float = 99.0, sm: float | None = 1.0, job_id: int = 1) -> GpuActivity:
    """The agent's activity row: duty cycle `util`, SM activity `sm` (None: no GPM)."""
    return GpuActivity(
        job_id, "gpu2", f"GPU-{index}", index, START, NOW - 5, NOW - 5, util, 2**30, 1,
        sm_active_recent_percent=sm, last_sm_active=None,
    )  # fmt: skip


def minutes(
    index: int = 0,
    count: int = 40,
    util: float = 99.0,
    sm: float | None = 1.0,
    end: float = NOW - 30,
    job_id: int = 1,
) -> list[GpuInterval]:
    """`count` one-minute intervals of one GPU ending at `end` (sm None: GPM measured none)."""
    out = []
    for n in range(count):
        start = end - (count - n) * MIN
        interval = GpuInterval(
            "gpu2", f"GPU-{index}", start, start + MIN, job_id, util, util, util, 6,
            MIN if util >= 5 else 0.0, MIN, 2**30, 80 * 2**30, 300.0, 300.0 * MIN, 50.0, 0,
            gpm_seconds=0.0 if sm is None else MIN, sm_active_mean_percent=sm,
        )  # fmt: skip
        out.append(interval)
    return out


def notices(
    jobs: list[SlurmJob],
    rows: list[GpuActivity],
    intervals: list[GpuInterval],
    config: Config = CONFIG,
) -> list[Verdict]:
    return evaluate(jobs, rows, NOW, config, intervals=intervals)


def test_fake_busy_gpu_gets_a_notice() -> None:
    """Duty cycle 99%, SM activity 1% for 40 min (over 30): a notice with figures and advice."""
    expected = [
        Verdict(
            policy="low_efficiency",
            action=Action.NOTICE,
            target="job:1",
            reason=(
                "GPU 0 on gpu2 of job 1 has looked busy for 40 min while barely computing: "
                "utilization (the share of time some kernel runs) 99%, but only 1% of its "
                "SMs active. The job holds the GPU while using little of it: larger batches, "
                "fewer and bigger kernels, or a smaller GPU would serve it better. This is a "
                "notice: the job will not be cancelled for it."
            ),
            job_id=1,
            user="alice",
            account="physics",
            details=(
                ("gpus", 1),
                ("seconds", 40 * MIN),
                ("util_mean_percent", 99.0),
                ("sm_active_mean_percent", 1.0),
                ("min_util_percent", 80.0),
                ("max_sm_active_percent", 10.0),
                ("unmeasured_gpus", 0),
            ),
        )
    ]
    assert expected == notices([job()], [row()], minutes())


def test_busy_gpu_gets_no_notice() -> None:
    """Duty cycle 99% with 70% of the SMs active: real work, nothing to say."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row(sm=70.0)], minutes(sm=70.0))


def test_not_yet_long_enough() -> None:
    """Fake-busy for 25 min (notice_after 30): nothing yet."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], minutes(count=25))


def test_gpu_without_gpm_is_never_judged() -> None:
    """An A100 (no GPM) at 99% duty cycle: unknown is never inefficient, no notice."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row(sm=None)], minutes(sm=None))


def test_idle_gpu_is_not_low_efficiency() -> None:
    """Duty cycle 0% (an idle GPU is idle_gpu's business): no notice."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row(util=0.0, sm=0.0)], minutes(util=0.0, sm=0.0))


def test_stretch_starts_after_the_last_efficient_interval() -> None:
    """20 fake-busy minutes after 20 of real work: the stretch is 20 min, no notice."""
    history = minutes(count=20, sm=60.0, end=NOW - 30 - 20 * MIN) + minutes(count=20)
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], history)


def test_gap_in_readings_breaks_the_stretch() -> None:
    """20 + 20 fake-busy minutes with 5 unread minutes between: neither is 30 min long."""
    history = minutes(count=20, end=NOW - 30 - 25 * MIN) + minutes(count=20)
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], history)


def test_newest_gpm_window_has_the_last_word() -> None:
    """40 fake-busy minutes, but the agent's newest window shows 50% SM activity: no notice."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row(sm=50.0)], minutes())


def test_stale_intervals_are_unknown() -> None:
    """The newest interval ended 10 min ago (fresh: 30 s + a shipping period): not judged."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], minutes(end=NOW - 10 * MIN))


def test_unmeasured_gpu_beside_a_flagged_one_is_named() -> None:
    """A fake-busy H100 and an unmeasured GPU in one job: the notice says which was not judged."""
    verdicts = notices(
        [job(gpus=(0, 1))], [row(0), row(1, sm=None)], minutes(0) + minutes(1, sm=None)
    )
    assert [
        (Action.NOTICE, "SM activity is not measured on GPU 1 on gpu2, which was not judged.")
    ] == [(v.action, v.reason.split("cancelled for it. ")[1]) for v in verdicts]


def test_thresholds_are_the_config_keys() -> None:
    """SM activity 15% is barely computing under max_sm_active_percent = 20, not under 10."""
    rows, history = [row(sm=15.0)], minutes(sm=15.0)
    assert ([], [Action.NOTICE]) == (
        [v.action for v in notices([job()], rows, history)],
        [v.action for v in notices([job()], rows, history, config(max_sm_active_percent=20.0))],
    )


def test_exempt_user_gets_no_notice() -> None:
    """[policy.low_efficiency] exempt_users skips the job."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], minutes(), config(exempt_users=["alice"]))


def test_disabled_policy_gives_nothing() -> None:
    """enabled = false: no notice."""
    expected: list[Verdict] = []
    assert expected == notices([job()], [row()], minutes(), config(enabled=False))


def test_cancel_is_refused_with_the_way_to_cancel() -> None:
    """`action = "cancel"` is an error that points to idle_gpu's sm_active signal."""
    with pytest.raises(ConfigError) as caught:
        parse_settings(
            Config, tomllib.loads('[policy.low_efficiency]\naction = "cancel"\n'), "t.toml"
        )
    expected = [
        't.toml: policy.low_efficiency.action: expected "notify", got "cancel"; this policy '
        "never cancels: to end jobs whose SMs stay idle, set [policy.idle_gpu] "
        'signal = "sm_active" (warned first, with its grace period)'
    ]
    assert expected == caught.value.problems


def test_signal_and_notice_keys_load() -> None:
    """signal = "sm_active" and the low_efficiency keys read from TOML as written."""
    loaded = parse_settings(
        Config,
        tomllib.loads(
            '[policy.idle_gpu]\nsignal = "sm_active"\n'
            "[policy.low_efficiency]\nmin_util_percent = 90\nmax_sm_active_percent = 5\n"
            'notice_after = "1h"\n'
        ),
        "t.toml",
    )
    low = loaded.policy.low_efficiency
    expected = ("sm_active", 90.0, 5.0, 3600.0, "notify")
    assert expected == (
        loaded.policy.idle_gpu.signal,
        low.min_util_percent,
        low.max_sm_active_percent,
        low.notice_after,
        low.action,
    )
