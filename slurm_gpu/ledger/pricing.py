"""What GPU slots cost: [cost] prices per GPU model and slot, in the [cost] unit.

`[cost] charge = "held"` (the default) charges every unit held. `"effective"` splits each
charge by what NVML GPM measured: of the share GPM measured, the SM-active part is
charged (`cost`) and the rest, held but unused, is priced apart (`idle_held_cost`, not in
`cost`); the share GPM did not measure (a GPU without GPM, readings missing) is charged
as held. Unknown is never idle, nor free: `cost + idle_held_cost` is always what "held"
charges.

GPU slots (issue 14): a `[cost] prices` key "model:profile" ("h100:1g.10gb") prices a MIG
slice of that profile per slot-hour. Without one, a MIG slice costs its share of its
GPU's price (`share x` the model's price; 1g.10gb of an H100: 1/7), and a shard or MPS
share its share, so seven 1g slices held for a month bill as one GPU-month
(`[cost] slot_price = "whole"` charges every slot its GPU's full price instead). A whole
GPU's share is 1. GPU-memory-hours are priced by the model (or "model:profile") alone:
a GiB-hour is one whatever holds it.

Units (`UNIT_SUMS`): gpu_hour charges held GPU-seconds, gpu_mem_hour GiB-seconds,
job_hour each row's share of its job's elapsed seconds (a job is charged its runtime
once, at its GPUs' prices). Held and elapsed exclude suspended time, as Slurm's charge
does; `[cost] charge_suspended` adds it back (`SUSPENDED_UNIT_SUMS`). Suspended time is
never idle: it has no idle cost.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from slurm_gpu.config.reports import CostSettings
from slurm_gpu.ledger import time

UNIT_SUMS = {
    "gpu_hour": ("gpu_seconds", "gpu_unused_seconds"),
    "gpu_mem_hour": ("mem_gib_seconds", "mem_unused_gib_seconds"),
    "job_hour": ("job_hour_seconds", "job_hour_unused_seconds"),
}
"""[cost] unit -> (the sum it charges, that sum's GPM-unused part), in unit-seconds."""

SUSPENDED_UNIT_SUMS = {
    "gpu_hour": "suspended_seconds",
    "job_hour": "job_hour_suspended_seconds",
}
"""[cost] unit -> its units in suspended time ([cost] charge_suspended; GiB-seconds are
measured memory, held while suspended, so gpu_mem_hour charges them either way)."""

IDLE_UNIT_SUMS = {
    "gpu_mem_hour": "mem_idle_gib_seconds",
    "job_hour": "job_hour_idle_seconds",
}
"""[cost] unit -> the part of its sum in measured idle time (gpu_hour: the idle time)."""


def price_for(model: str, cost: CostSettings) -> float:
    """Price per unit of a GPU model: the longest [cost] prices key the model contains.

    Keys naming a MIG profile ("h100:1g.10gb") price slices only (`slot_price_for`).
    """
    lowered = model.lower()
    matches = [k for k in cost.prices if ":" not in k and k.lower() in lowered]
    if not matches:
        return cost.default_price
    return cost.prices[max(matches, key=len)]


def profile_price_for(model: str, profile: str, cost: CostSettings) -> float | None:
    """The [cost] prices "model:profile" key's price of a MIG slice; None without one.

    The profile must be the slice's ("1g.10gb", case-insensitive); of the keys whose
    model part the model contains, the longest wins, as for models.
    """
    if not profile:
        return None
    lowered, wanted = model.lower(), profile.lower()
    matches = []
    for key in cost.prices:
        name, colon, key_profile = key.lower().rpartition(":")
        if colon and key_profile.strip() == wanted and name.strip() in lowered:
            matches.append(key)
    return cost.prices[max(matches, key=len)] if matches else None


def slot_price_for(model: str, cost: CostSettings, share: float = 1.0, profile: str = "") -> float:
    """Price per unit of one GPU slot, in the [cost] unit (module docstring).

    Args:
        model: the physical GPU's model.
        cost: [cost].
        share: the slot's part of its GPU (1: a whole GPU).
        profile: a MIG slice's profile ("" otherwise).
    """
    explicit = profile_price_for(model, profile, cost)
    if explicit is not None:
        return explicit
    price = price_for(model, cost)
    per_gpu = cost.unit != "gpu_mem_hour"  # a GiB-hour is one whatever holds it
    if per_gpu and cost.slot_price == "share" and 0.0 <= share < 1.0:
        return price * share
    return price


class Charge(NamedTuple):
    """A charge: billed, held but unused, and idle.

    `cost` is billed; `idle_held_cost` is the GPM-unused part not billed (charge
    "effective"; else NaN); `idle_cost` is what the measured idle time costs at the held
    price.
    """

    cost: Any
    idle_held_cost: Any
    idle_cost: Any


def charged_sums(cost: CostSettings) -> tuple[str, ...]:
    """The sums `charge` reads under this [cost] (its unit and charge), no other."""
    units, unused = UNIT_SUMS[cost.unit]
    idle = (IDLE_UNIT_SUMS[cost.unit],) if cost.unit in IDLE_UNIT_SUMS else ()
    suspended = _suspended_units(cost)
    return tuple(
        dict.fromkeys(
            (
                units,
                *((suspended,) if suspended else ()),
                *((unused,) if cost.charge == "effective" else ()),
                *(idle or ("gpu_seconds", "active_seconds", "missing_seconds")),
            )
        )
    )


def charge(price: Any, sums: Any, cost: CostSettings) -> Charge:
    """The charge of sums (rows or groups) at `price` per unit of [cost] unit.

    Idle cost is the held price of the units spent in measured idle time: each row's
    held charge x its idle share, summed as the rows' sums are (`sums.SUMS`). Time nobody
    measured costs no idle money: missing is never idle.

    Args:
        price: per row, `slot_price_for` of its place.
        sums: `sums.SUMS` by name (a mapping or frame of arrays or numbers).
        cost: [cost]: its unit and charge.
    """
    units, unused = UNIT_SUMS[cost.unit]
    per_second = np.asarray(price, dtype=float) / 3600.0
    held = per_second * np.asarray(sums[units], dtype=float)
    suspended = _suspended_units(cost)
    if suspended:
        held = held + per_second * np.asarray(sums[suspended], dtype=float)
    idle_units = (
        sums[IDLE_UNIT_SUMS[cost.unit]]
        if cost.unit in IDLE_UNIT_SUMS
        else np.nan_to_num(
            np.asarray(
                time.idle(
                    np.asarray(sums["gpu_seconds"], dtype=float),
                    np.asarray(sums["active_seconds"], dtype=float),
                    np.asarray(sums["missing_seconds"], dtype=float),
                ),
                dtype=float,
            )
        )
    )
    idle_cost = _plain(per_second * np.asarray(idle_units, dtype=float))
    if cost.charge == "effective":
        idle = per_second * np.asarray(sums[unused], dtype=float)
        return Charge(_plain(held - idle), _plain(idle), idle_cost)
    return Charge(_plain(held), _plain(np.full(np.shape(held), np.nan)), idle_cost)


def _suspended_units(cost: CostSettings) -> str | None:
    """The sum of suspended units `charge` adds under this [cost]; None: not charged."""
    return SUSPENDED_UNIT_SUMS.get(cost.unit) if cost.charge_suspended else None


def _plain(value: Any) -> Any:
    return float(value) if np.ndim(value) == 0 else value
