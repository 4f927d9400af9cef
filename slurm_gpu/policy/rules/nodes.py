"""hot_node and unallocated_use: the node-level policies.

hot_node drains a node with a GPU at or above its temperature limit, new ECC errors or a
lost GPU; unallocated_use reports GPU processes that no Slurm allocation holds.
"""

from __future__ import annotations

from slurm_gpu.models import Action, NodeHealth, UnallocatedUse, Verdict
from slurm_gpu.policy.rules.context import HOT_NODE, UNALLOCATED_USE, Context


def hot_node(ctx: Context, health: NodeHealth) -> Verdict | None:
    """A drain of a node with a GPU too hot, new ECC errors or a lost GPU; None if healthy.

    A node already drained, or exempt by `[policy.hot_node] exempt_nodes`, gets None.
    """
    settings = ctx.config.policy.hot_node
    if health.drained or health.node in settings.exempt_nodes:
        return None
    problems = []
    temperature = health.max_temperature_celsius
    if temperature is not None and temperature >= settings.temperature_celsius:
        problems.append(f"GPU at {temperature:g}C (limit {settings.temperature_celsius:g}C)")
    if settings.drain_on_ecc and health.new_ecc_errors > 0:
        problems.append(f"{health.new_ecc_errors} new GPU ECC error(s)")
    if settings.drain_on_lost_gpu and health.lost_gpus:
        problems.append(f"lost GPU {', '.join(health.lost_gpus)}")
    if not problems:
        return None
    return Verdict(
        policy=HOT_NODE,
        action=Action.DRAIN,
        target=f"node:{health.node}",
        reason="; ".join(problems),  # the drain prefixes "slurm-gpu: "
        node=health.node,
        details=(
            ("max_temperature_celsius", temperature),
            ("new_ecc_errors", health.new_ecc_errors),
            ("lost_gpus", health.lost_gpus),
        ),
    )


def unallocated_use(ctx: Context, use: UnallocatedUse) -> Verdict | None:
    """A report of GPU processes outside any allocation; None for exempt nodes or users."""
    settings = ctx.config.policy.unallocated_use
    if use.node in settings.exempt_nodes:
        return None
    if use.users and all(u in settings.exempt_users for u in use.users):
        return None
    gpu = f"GPU {use.slurm_index} ({use.gpu_uuid})" if use.slurm_index is not None else use.gpu_uuid
    owners = f" of {', '.join(sorted(set(use.users)))}" if use.users else ""
    noun, verb = ("Process", "uses") if len(use.pids) == 1 else ("Processes", "use")
    return Verdict(
        policy=UNALLOCATED_USE,
        action=Action.REPORT,
        target=f"node:{use.node}",
        reason=(
            f"{noun} {', '.join(map(str, use.pids))}{owners} {verb} {gpu} on {use.node} "
            "without a Slurm allocation."
        ),
        user=",".join(sorted(set(use.users))),
        node=use.node,
        details=(
            ("gpu_uuid", use.gpu_uuid),
            ("slurm_index", use.slurm_index),
            ("pids", use.pids),
        ),
    )
