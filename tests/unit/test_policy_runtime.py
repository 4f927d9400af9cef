"""slurm_gpu.policy.rules, max_runtime: limits by account/partition/default, warn, cancel, cap."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.config.policy import ControllerSettings, MaxRuntimeSettings, PolicySettings
from slurm_gpu.durations import Duration
from slurm_gpu.models import Action, Exemption, SlurmJob, Verdict
from slurm_gpu.policy.rules import evaluate

NOW = 1_717_236_000.0  # 2024-06-01 10:00:00 UTC
HOUR = 3600.0


def config(**runtime: Any) -> Config:
    """max_runtime 24h, warn 1h before, UTC; idle_gpu off (no activity is given)."""
    base = Config()
    policy = PolicySettings(
        idle_gpu=dataclasses.replace(base.policy.idle_gpu, enabled=False),
        max_runtime=dataclasses.replace(MaxRuntimeSettings(), **runtime),
    )
    return dataclasses.replace(base, controller=ControllerSettings(timezone="UTC"), policy=policy)


CONFIG = config()


def job(elapsed_hours: float, **fields: Any) -> SlurmJob:
    values: dict[str, Any] = {
        "job_id": 7,
        "user": "bob",
        "account": "chem",
        "partition": "gpu",
        "state": "RUNNING",
        "start_time": NOW - elapsed_hours * HOUR,
        "time_limit_seconds": None,
        "gpus": (("gpu2", (0,)),),
        "gpu_count": 1,
    }
    values.update(fields)
    return SlurmJob(**values)


def summary(verdicts: list[Verdict]) -> list[tuple[Action, float | None]]:
    return [(v.action, v.deadline) for v in verdicts]


def test_young_job_gets_nothing() -> None:
    """22 h into a 24 h limit with 1 h warning: nothing yet."""
    expected: list[Verdict] = []
    assert expected == evaluate([job(22)], [], NOW, CONFIG)


def test_warning_before_the_limit() -> None:
    """23.5 h into 24 h, first warned at 23 h: WARN, deadline at start + 24 h."""
    warned = {(7, "max_runtime"): NOW - 0.5 * HOUR}
    expected = [
        Verdict(
            policy="max_runtime",
            action=Action.WARN,
            target="job:7",
            reason=(
                "Job 7 has run 23 h 30 min and will be cancelled at 10:30 by the 24 h runtime "
                "limit of this cluster; save your work."
            ),
            job_id=7,
            user="bob",
            account="chem",
            deadline=NOW + 0.5 * HOUR,
            details=(
                ("elapsed_seconds", 23.5 * HOUR),
                ("limit_seconds", 24 * HOUR),
                ("limit_source", "this cluster"),
            ),
        )
    ]
    assert expected == evaluate([job(23.5)], [], NOW, CONFIG, warned=warned)


def test_late_first_warning_still_gives_warn_before() -> None:
    """23.5 h and never warned: the job ends warn_before (1 h) after this warning."""
    expected = [(Action.WARN, NOW + HOUR)]
    assert expected == summary(evaluate([job(23.5)], [], NOW, CONFIG))


def test_cancel_at_the_limit_after_warning() -> None:
    """24.1 h, warned 1.1 h ago: CANCEL."""
    warned = {(7, "max_runtime"): NOW - 1.1 * HOUR}
    expected = [(Action.CANCEL, None)]
    assert expected == summary(evaluate([job(24.1)], [], NOW, CONFIG, warned=warned))


def test_limit_reached_without_warning_warns_first() -> None:
    """30 h when the policy is first applied: WARN, end warn_before from now."""
    expected = [(Action.WARN, NOW + HOUR)]
    assert expected == summary(evaluate([job(30)], [], NOW, CONFIG))


def test_cap_sets_the_time_limit() -> None:
    """action = "cap": CAP_TIME with the new time limit (the policy limit) in details."""
    warned = {(7, "max_runtime"): NOW - 2 * HOUR}
    verdicts = evaluate([job(24.1)], [], NOW, config(action="cap"), warned=warned)
    expected = [(Action.CAP_TIME, 24 * HOUR)]
    assert expected == [(v.action, dict(v.details)["time_limit_seconds"]) for v in verdicts]


def test_cap_applies_when_slurm_limit_is_larger() -> None:
    """A 48 h Slurm time limit is larger than the 24 h policy: it gets capped."""
    warned = {(7, "max_runtime"): NOW - 2 * HOUR}
    row = job(24.1, time_limit_seconds=48 * HOUR)
    expected = [(Action.CAP_TIME, None)]
    assert expected == summary(evaluate([row], [], NOW, config(action="cap"), warned=warned))


def test_shorter_slurm_limit_is_left_to_slurm() -> None:
    """A job whose own time limit (20 h) ends before the policy's: no verdict."""
    expected: list[Verdict] = []
    assert expected == evaluate([job(23.5, time_limit_seconds=20 * HOUR)], [], NOW, CONFIG)


def test_partition_limit_beats_default() -> None:
    """partitions = { short = "2h" }: a 1.5 h job in short is warned."""
    settings = config(partitions={"short": Duration(2 * HOUR)})
    verdicts = evaluate([job(1.5, partition="short")], [], NOW, settings)
    expected = [(Action.WARN, "partition short")]
    assert expected == [(v.action, dict(v.details)["limit_source"]) for v in verdicts]


def test_account_limit_beats_partition() -> None:
    """accounts = { chem = "48h" } beats partitions = { gpu = "2h" }: 23.5 h is fine."""
    settings = config(
        partitions={"gpu": Duration(2 * HOUR)}, accounts={"chem": Duration(48 * HOUR)}
    )
    expected: list[Verdict] = []
    assert expected == evaluate([job(23.5)], [], NOW, settings)


def test_exempt_partition() -> None:
    """exempt_partitions = ["long"]: a 100 h job there gets nothing."""
    expected: list[Verdict] = []
    settings = config(exempt_partitions=["long"])
    assert expected == evaluate([job(100, partition="long")], [], NOW, settings)


def test_explicit_exemption_for_user() -> None:
    """An unexpired exemption for the user from every policy: nothing."""
    exemptions = [Exemption("user:bob", expires=NOW + HOUR)]
    expected: list[Verdict] = []
    assert expected == evaluate([job(30)], [], NOW, CONFIG, exemptions=exemptions)


def test_jobs_without_gpus_are_not_judged() -> None:
    """slurm-gpu limits GPU jobs only; CPU jobs are Slurm's business."""
    expected: list[Verdict] = []
    assert expected == evaluate([job(30, gpus=(), gpu_count=0)], [], NOW, CONFIG)


def test_zero_warn_before_cancels_at_the_limit() -> None:
    """warn_before = 0: no warning is needed, the job is cancelled at its limit."""
    expected = [(Action.CANCEL, None)]
    assert expected == summary(evaluate([job(24)], [], NOW, config(warn_before=Duration(0.0))))
