"""slurm_gpu.policy.rules, hot_node and unallocated_use."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_gpu.config import Config
from slurm_gpu.config.policy import HotNodeSettings, UnallocatedUseSettings
from slurm_gpu.models import Action, NodeHealth, UnallocatedUse, Verdict
from slurm_gpu.policy.rules import evaluate

NOW = 1_717_236_000.0


def config(hot: dict[str, Any] | None = None, unallocated: dict[str, Any] | None = None) -> Config:
    base = Config()
    policy = dataclasses.replace(
        base.policy,
        hot_node=dataclasses.replace(HotNodeSettings(), **(hot or {})),
        unallocated_use=dataclasses.replace(UnallocatedUseSettings(), **(unallocated or {})),
    )
    return dataclasses.replace(base, policy=policy)


def reasons(verdicts: list[Verdict]) -> list[tuple[Action, str, str]]:
    return [(v.action, v.target, v.reason) for v in verdicts]


# ---------------------------------------------------------------------------- hot_node


def test_hot_gpu_drains_the_node() -> None:
    """A GPU at 91C (limit 85C): DRAIN with the reason Slurm will show."""
    verdicts = evaluate([], [], NOW, config(), node_health=[NodeHealth("gpu1", 91.0)])
    expected = [(Action.DRAIN, "node:gpu1", "GPU at 91C (limit 85C)")]
    assert expected == reasons(verdicts)


def test_cool_node_is_left_alone() -> None:
    """84C, no ECC errors, no lost GPU: nothing."""
    expected: list[Verdict] = []
    assert expected == evaluate([], [], NOW, config(), node_health=[NodeHealth("gpu1", 84.0)])


def test_ecc_errors_drain() -> None:
    """New ECC errors drain the node (drain_on_ecc)."""
    health = [NodeHealth("gpu1", 60.0, new_ecc_errors=2)]
    expected = [(Action.DRAIN, "node:gpu1", "2 new GPU ECC error(s)")]
    assert expected == reasons(evaluate([], [], NOW, config(), node_health=health))


def test_ecc_errors_ignored_when_configured() -> None:
    """drain_on_ecc = false: ECC errors alone do not drain."""
    health = [NodeHealth("gpu1", 60.0, new_ecc_errors=2)]
    expected: list[Verdict] = []
    assert expected == evaluate([], [], NOW, config({"drain_on_ecc": False}), node_health=health)


def test_lost_gpu_drains_and_all_problems_are_named() -> None:
    """Several problems go into one reason."""
    health = [NodeHealth("gpu2", 90.0, new_ecc_errors=1, lost_gpus=("GPU-abc",))]
    expected = [
        (
            Action.DRAIN,
            "node:gpu2",
            "GPU at 90C (limit 85C); 1 new GPU ECC error(s); lost GPU GPU-abc",
        )
    ]
    assert expected == reasons(evaluate([], [], NOW, config(), node_health=health))


def test_drained_node_is_not_drained_again() -> None:
    """A node Slurm already drains gets no new DRAIN."""
    health = [NodeHealth("gpu1", 95.0, drained=True)]
    expected: list[Verdict] = []
    assert expected == evaluate([], [], NOW, config(), node_health=health)


def test_exempt_node_is_not_drained() -> None:
    """exempt_nodes = ["gpu1"]: never drained."""
    health = [NodeHealth("gpu1", 95.0)]
    expected: list[Verdict] = []
    settings = config({"exempt_nodes": ["gpu1"]})
    assert expected == evaluate([], [], NOW, settings, node_health=health)


def test_hot_node_disabled() -> None:
    """enabled = false: nothing."""
    health = [NodeHealth("gpu1", 95.0)]
    expected: list[Verdict] = []
    assert expected == evaluate([], [], NOW, config({"enabled": False}), node_health=health)


# ---------------------------------------------------------------------------- unallocated_use


def test_unallocated_use_is_reported() -> None:
    """Processes on a GPU no job holds: one REPORT naming PIDs, owner, GPU and node."""
    use = [UnallocatedUse("gpu1", "GPU-1", (4242, 4243), slurm_index=1, users=("mallory",))]
    expected = [
        (
            Action.REPORT,
            "node:gpu1",
            "Processes 4242, 4243 of mallory use GPU 1 (GPU-1) on gpu1 without a Slurm allocation.",
        )
    ]
    assert expected == reasons(evaluate([], [], NOW, config(), unallocated=use))


def test_unallocated_use_details() -> None:
    """The REPORT carries the GPU and the PIDs as figures."""
    use = [UnallocatedUse("gpu1", "GPU-1", (4242,))]
    verdicts = evaluate([], [], NOW, config(), unallocated=use)
    expected = [(("gpu_uuid", "GPU-1"), ("slurm_index", None), ("pids", (4242,)))]
    assert expected == [v.details for v in verdicts]


def test_exempt_process_owner() -> None:
    """exempt_users = ["root"]: a monitoring process of root is not reported."""
    use = [UnallocatedUse("gpu1", "GPU-1", (1,), users=("root",))]
    expected: list[Verdict] = []
    settings = config(unallocated={"exempt_users": ["root"]})
    assert expected == evaluate([], [], NOW, settings, unallocated=use)


def test_unallocated_use_disabled() -> None:
    """enabled = false: nothing."""
    use = [UnallocatedUse("gpu1", "GPU-1", (1,))]
    expected: list[Verdict] = []
    assert expected == evaluate(
        [], [], NOW, config(unallocated={"enabled": False}), unallocated=use
    )
