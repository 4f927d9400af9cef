"""Config sections of the reports: [cost], [access] and [reports]."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from slurm_gpu.config._loader import doc
from slurm_gpu.config.names import check_user_names
from slurm_gpu.durations import Duration

CostUnit = Literal["gpu_hour", "gpu_mem_hour", "job_hour"]
CostCharge = Literal["held", "effective"]
SlotPrice = Literal["share", "whole"]


def _check_currency(text: str) -> str | None:
    if re.fullmatch(r"[A-Za-z]{1,8}|.{1,3}", text):
        return None
    return f'expected a currency code like "EUR" or a symbol like "$", got {json.dumps(text)}'


def _check_prices(prices: dict[str, float]) -> str | None:
    bad = [k for k, v in prices.items() if v < 0 or not k.strip()]
    if bad:
        return f"prices must be >= 0 with non-empty model names; check {', '.join(bad)}"
    return None


def _check_absolute(path: str) -> str | None:
    if not path or path.startswith("/"):
        return None
    return f"expected an absolute path, got {json.dumps(path)}"


@dataclass(frozen=True)
class CostSettings:
    """[cost]: what GPU use costs, per GPU model."""

    currency: str = field(
        default="EUR", metadata=doc("Currency shown with every cost.", check=_check_currency)
    )
    unit: CostUnit = field(
        default="gpu_hour",
        metadata=doc(
            'What is charged: "gpu_hour" (one GPU for one hour), "gpu_mem_hour" (one GiB '
            'of GPU memory in use for one hour) or "job_hour" (job runtime).'
        ),
    )
    prices: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "Price per unit by GPU model; a key matches a model whose name contains it "
            '(case-insensitive, longest key wins): { a100 = 2.5, "H100 80GB" = 4.0 }. A key '
            '"model:profile" prices a MIG slice of that profile: { "h100:1g.10gb" = 0.7 }.',
            check=_check_prices,
        ),
    )
    default_price: float = field(
        default=0.0, metadata=doc("Price per unit of a GPU model no key matches.", minimum=0)
    )
    charge: CostCharge = field(
        default="held",
        metadata=doc(
            '"held": every unit held is charged (GPUs x hours held, whatever they did). '
            '"effective": where NVML GPM measured SM activity (Hopper and newer), the charge '
            "is the measured part x SM activity, and the measured but unused rest is priced "
            "apart as IdleHeldCost (not added to Cost); GPU time GPM did not measure (older "
            "GPUs, readings missing) is charged as held, and reports say it was not measured."
        ),
    )
    slot_price: SlotPrice = field(
        default="share",
        metadata=doc(
            '"share": a MIG slice without its own "model:profile" price costs its share of '
            "its GPU's price (compute slices / the GPU's, 1/7 for a 1g.10gb slice of an "
            "H100), a gres/shard or gres/mps share its share (shards held / the GPU's), so "
            'slices held together bill as the physical GPU-hours. "whole": every slot costs '
            "its GPU's full price. GPU-memory-hours are never scaled by the share."
        ),
    )
    charge_suspended: bool = field(
        default=False,
        metadata=doc(
            "Charge the time a job was suspended (scontrol suspend, preemption or gang "
            "scheduling in SUSPEND mode) under unit gpu_hour and job_hour. Off, as Slurm's "
            "Elapsed and GPU-hours count, a suspended job is charged its run time only; "
            "its GPU memory stays held and is charged under gpu_mem_hour either way."
        ),
    )


@dataclass(frozen=True)
class AccessSettings:
    """[access]: who sees whose jobs (Slurm's PrivateData=usage)."""

    admins: list[str] = field(
        default_factory=list,
        metadata=doc(
            "Users who see every job, besides root, the SlurmUser and Slurm Operators and "
            "Administrators.",
            check=check_user_names,
        ),
    )
    slurm_roles: bool = field(
        default=True,
        metadata=doc(
            "Ask sacctmgr for AdminLevel and account coordinators (coordinators see their "
            "accounts' jobs)."
        ),
    )


@dataclass(frozen=True)
class ReportSettings:
    """[reports]: the sacct, report, job and status commands, and the monthly delivery."""

    # Read with a deprecation warning for one release; the next moves it to REMOVED_KEYS.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"hot_node_factor": "busy_node_factor"}

    busy_node_factor: float = field(
        default=1.5,
        metadata=doc(
            "`report nodes` flags a node as busy when its share of GPU-hours exceeds the "
            "mean node's share by this factor (formerly hot_node_factor, still read with a "
            "warning).",
            above=0,
        ),
    )
    live_sacct: bool = field(
        default=True,
        metadata=doc(
            "Reports ask sacct for the period they show and lay its job facts (submit, "
            "start, end, state, name) over the store's; false reads the store only."
        ),
    )
    status_window: Duration = field(
        default=Duration(180.0),
        metadata=doc("`status` uses GPU intervals that ended this recently.", above=0),
    )
    monthly_dir: str = field(
        default="/var/lib/slurm-gpu/reports",
        metadata=doc(
            "`report monthly` writes each month's report into <monthly_dir>/<YYYY-MM>/ "
            "when no --out is given (the monthly timer's unit gives none).",
            check=_check_absolute,
        ),
    )
    mail_outbox: str = field(
        default="",
        metadata=doc(
            "`report monthly --deliver` writes its messages as .eml files into this folder "
            'instead of sending them by [notify] SMTP; "" sends them.',
            check=_check_absolute,
        ),
    )
