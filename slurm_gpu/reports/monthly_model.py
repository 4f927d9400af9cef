"""The monthly report's contents (`MonthlyReport`), apart from what builds and renders it.

reports/monthly.py builds it, reports/monthly_page.py renders its page; both import it
from here, so neither imports the other's module to name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class MonthlyReport:
    """Everything the page and the CSV files show; each list is one table's records."""

    month: str
    since: float
    until: float
    cluster: str
    scope: str
    currency: str
    unit: str
    generated: float
    overview: dict[str, Any]
    days: list[str]
    daily_gpu_hours: list[float]
    accounts: list[dict[str, Any]]
    users: list[dict[str, Any]]
    utilization: list[dict[str, Any]]
    idle: list[dict[str, Any]]
    waste_jobs: list[dict[str, Any]]
    queue: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    controller: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    # Efficiency beyond utilization (reports/efficiency.py): the GPM figures per account
    # and per user, the section's note where GPM measured nothing or part, and [cost]
    # charge ("effective": Cost and IdleHeldCost apart).
    efficiency: list[dict[str, Any]] = field(default_factory=list)
    efficiency_users: list[dict[str, Any]] = field(default_factory=list)
    efficiency_note: str | None = None
    charge: str = "held"
    # GPU slots (issue 14): GPU-hours and cost by GPU model and slot ("H100 MIG 1g.10gb"),
    # held slot-hours and physical GPU-hours apart; empty where every GPU was whole.
    slots: list[dict[str, Any]] = field(default_factory=list)
