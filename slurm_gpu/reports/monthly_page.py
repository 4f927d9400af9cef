"""The monthly report's page: one self-contained HTML document (inline CSS and SVG).

Every text that reaches the page goes through `esc` (reports/widgets.py), since job
names, users and accounts are whatever users typed into sbatch.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from slurm_gpu.reports.monthly_model import MonthlyReport
from slurm_gpu.reports.widgets import (
    HtmlColumn,
    col,
    column_chart,
    esc,
    hbar_chart,
    heat_map,
    number,
    table,
    text_col,
)
from slurm_gpu.slurm.timespec import format_elapsed
from slurm_gpu.units import is_known

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 color:#24292f;background:#f6f8fa;margin:0;line-height:1.4}
main{max-width:1000px;margin:0 auto;padding:16px 24px 48px;background:#fff}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:32px 0 8px;
 border-bottom:2px solid #3b6ea5;padding-bottom:4px}
.meta{color:#57606a;font-size:13px;margin:0 0 8px}
nav{font-size:13px;margin:8px 0 0}nav a{margin-right:12px;color:#3b6ea5}
.kpis{display:grid;grid-template-columns:repeat(4,1fr);gap:10px;margin:12px 0}
.kpi{border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;background:#f6f8fa}
.kpi .label{font-size:12px;color:#57606a}.kpi .value{font-size:20px;font-weight:600}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0;width:100%}
th,td{border-bottom:1px solid #d0d7de;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eaeef2}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:600;border-top:2px solid #57606a}td.empty{color:#57606a}
svg.chart{display:block;margin:8px 0;max-width:100%;height:auto}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:6px 10px;font-size:13px}
.defs{font-size:12.5px;color:#57606a}.defs dt{font-weight:600;color:#24292f}
.small{font-size:12px;color:#57606a}
table.actions td:first-child{white-space:nowrap}
"""
SECTIONS = (
    ("overview", "Cluster overview"),
    ("accounts", "GPU-hours and cost by account"),
    ("users", "GPU-hours and cost by user"),
    ("utilization", "Utilization distribution"),
    ("efficiency", "Efficiency beyond utilization"),
    ("idle", "Idle waste"),
    ("waste-jobs", "Top wasteful jobs"),
    ("queue", "Queue wait by partition"),
    ("nodes", "Node heat map"),
    ("controller", "What the controller did"),
)
USERS_SHOWN = 40
EFFICIENCY_USERS_SHOWN = 15
HEAT_ROWS = 120  # nodes drawn in the heat map: the busiest and idlest halves beyond this


def _when(seconds: float, tz: Any = None) -> str:
    return dt.datetime.fromtimestamp(seconds, tz).strftime("%Y-%m-%d %H:%M")


def _duration(value: Any) -> str:
    """A queue wait (a mean, a percentile) as `[D-]HH:MM:SS`, to the nearest second."""
    return format_elapsed(round(float(value))) if is_known(value) else ""


def _kpi(key: str, label: str, value: Any, shown: str) -> str:
    raw = "" if value is None else esc(value)
    return (
        f'<div class="kpi"><div class="label">{esc(label)}</div>'
        f'<div class="value" id="kpi-{esc(key)}" data-value="{raw}">{esc(shown)}</div></div>'
    )


def _section(key: str, title: str, *parts: str) -> str:
    return f'<section id="{key}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def render_page(report: MonthlyReport) -> str:
    """The whole report as one self-contained HTML document (inline CSS and SVG)."""
    o, cur = report.overview, report.currency
    titles = dict(SECTIONS)
    kpis = [
        _kpi("gpu_hours", "GPU-hours", o["gpu_hours"], number(o["gpu_hours"])),
        _kpi("cost", f"Cost ({cur})", o["cost"], number(o["cost"], 2)),
        _kpi("util", "Mean GPU utilization", o["util_mean_percent"],
             f"{number(o['util_mean_percent'])} %"),
        _kpi("occupancy", "GPU occupancy", o["occupancy_percent"],
             f"{number(o['occupancy_percent'])} %" if o["occupancy_percent"] is not None
             else "n/a"),
        _kpi("idle_gpu_hours", "Idle GPU-hours", o["idle_gpu_hours"],
             f"{number(o['idle_gpu_hours'])} ({number(o['idle_percent'])} %)"),
        _kpi("idle_cost", f"Idle cost ({cur})", o["idle_cost"], number(o["idle_cost"], 2)),
        _kpi("missing_gpu_hours", "Missing GPU-hours", o["missing_gpu_hours"],
             f"{number(o['missing_gpu_hours'])} ({number(o['missing_percent'])} %)"),
        _kpi("suspended_gpu_hours", "Suspended GPU-hours (not charged)",
             o["suspended_gpu_hours"], number(o["suspended_gpu_hours"])),
        _kpi("jobs", "GPU jobs", o["jobs"], number(o["jobs"])),
        _kpi("users", "Users / accounts", o["users"], f"{o['users']:,} / {o['accounts']:,}"),
        _kpi("energy", "GPU energy (kWh)", o["energy_kwh"], number(o["energy_kwh"])),
        _kpi("gpus", "GPUs (capacity GPU-h)", o["gpus"],
             f"{o['gpus']:,} ({number(o['capacity_gpu_hours'], 0)})"),
        _kpi("cancellations", "Jobs cancelled by the controller", o["cancellations"],
             number(o["cancellations"])),
        _kpi("returned", "GPU-hours returned", o["gpu_hours_returned"],
             number(o["gpu_hours_returned"])),
    ]  # fmt: skip
    money = f"Cost ({cur})"
    group_cols = [
        col("Jobs", "jobs", 0), col("GPU-hours", "gpu_hours", 2), col(money, "cost", 2),
        col("Util %", "util_mean_percent"), col("Idle GPU-h", "idle_gpu_hours", 2),
        col("Idle %", "idle_percent"), col("Missing GPU-h", "missing_gpu_hours", 2),
        col("Suspended GPU-h", "suspended_gpu_hours", 2),
        col("GPU-mem GiB-h", "gpu_mem_hours", 0), col("Energy kWh", "energy_kwh"),
    ]  # fmt: skip
    total_row = {**o, "key": "TOTAL", "_total": True}
    accounts = [
        hbar_chart(
            [(r["key"], r["gpu_hours"], r["idle_gpu_hours"] or 0.0) for r in report.accounts[:15]],
            label="GPU-hours by account (top 15)", unit="GPU-h", second="idle",
        ),
        table([text_col("Account", "key"), col("Users", "users", 0), *group_cols],
              [*report.accounts, total_row]),
    ]  # fmt: skip
    users = [
        table([text_col("User", "key"), text_col("Account", "account"), *group_cols],
              [*report.users[:USERS_SHOWN], total_row]),
        f'<p class="small">{min(len(report.users), USERS_SHOWN)} of {len(report.users)} users '
        "by GPU-hours; users.csv lists all.</p>",
    ]  # fmt: skip
    utilization = [
        column_chart([r["bin"] for r in report.utilization],
                     [r["gpu_hours"] for r in report.utilization],
                     label="GPU-hours by mean GPU utilization", unit="GPU-h"),
        table([text_col("Mean utilization", "bin"), col("GPU-hours", "gpu_hours", 2),
               col("Share %", "share_percent"), col("Job GPUs", "gpus", 0)],
              report.utilization),
        '<p class="small">Each job\'s GPU counts once, at its mean utilization over the '
        "job, weighted by its GPU-hours in the month.</p>",
    ]  # fmt: skip
    efficiency = _efficiency_part(report, total_row)
    idle = [
        hbar_chart([(r["key"], r["idle_gpu_hours"], 0.0) for r in report.idle[:15]],
                   label="Idle GPU-hours by account (top 15)", unit="GPU-h"),
        table([text_col("Account", "key"), col("Idle GPU-h", "idle_gpu_hours", 2),
               col("GPU-hours", "gpu_hours", 2), col("Idle %", "idle_percent"),
               col(f"Idle cost ({cur})", "idle_cost", 2)],
              [*report.idle, {**total_row, "key": "TOTAL"}]),
    ]  # fmt: skip
    waste = [
        table([text_col("JobID", "job_id"), text_col("JobName", "name"), text_col("User", "user"),
               text_col("Account", "account"), text_col("Partition", "partition"),
               text_col("State", "state"), col("GPUs", "gpus", 0), col("GPU-hours", "gpu_hours", 2),
               col("Idle GPU-h", "idle_gpu_hours", 2), col("Util %", "util_mean_percent"),
               col(money, "cost", 2)], report.waste_jobs, cls="waste"),
    ]  # fmt: skip
    queue = [
        table([text_col("Partition", "key"), col("Jobs started", "jobs", 0),
               HtmlColumn("Mean", lambda r: _duration(r.get("mean_seconds"))),
               HtmlColumn("Median", lambda r: _duration(r.get("median_seconds"))),
               HtmlColumn("95th pct", lambda r: _duration(r.get("p95_seconds"))),
               HtmlColumn("Max", lambda r: _duration(r.get("max_seconds")))], report.queue),
        '<p class="small">Start - Submit of the jobs that started in the month.</p>',
    ]  # fmt: skip
    nodes = _nodes_part(report)
    controller = [
        table([text_col("Kind", "kind"), text_col("Policy", "policy"),
               text_col("Action", "action"), col("Entries", "entries", 0), col("Done", "done", 0),
               col("Failed", "failed", 0), col("Jobs", "jobs", 0),
               col("GPU-h returned", "gpu_hours_returned", 2),
               col("Limit unknown", "unknown_limit", 0)], report.controller),
        '<p class="small">Enforced audit-log entries only (dry runs and withdrawn warnings '
        "left out). GPU-hours returned: for each cancellation that was done, the job's "
        "GPUs x the time left until its time limit (Start + Timelimit from sacct) when it "
        "was cancelled; a job with an unknown or unlimited limit is counted under "
        "Limit unknown instead.</p>",
        table([HtmlColumn("Time", lambda r: _when(r["time"]), numeric=False),
               text_col("Kind", "kind"), text_col("Policy", "policy"), text_col("Action", "action"),
               text_col("Target", "target"), text_col("User", "user"),
               text_col("Outcome", "outcome"), col("GPU-h returned", "gpu_hours_returned", 2),
               text_col("Reason", "reason")],
              [a for a in report.actions if a["kind"] != "warning"][:50], cls="actions"),
    ]  # fmt: skip
    parts = {
        "overview": [
            f'<div class="kpis">{"".join(kpis)}</div>',
            column_chart(report.days, report.daily_gpu_hours, label="GPU-hours per day",
                         unit="GPU-h", every=2),
        ],
        "accounts": accounts, "users": users, "utilization": utilization,
        "efficiency": efficiency, "idle": idle,
        "waste-jobs": waste, "queue": queue, "nodes": nodes, "controller": controller,
    }  # fmt: skip
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in report.notes)
    nav = "".join(f'<a href="#{k}">{esc(t)}</a>' for k, t in SECTIONS)
    title = f"GPU usage report {report.month}: {report.cluster}"
    body = "".join(_section(k, titles[k], *parts[k]) for k, _ in SECTIONS)
    if report.slots:  # MIG slices and shares (issue 14): held slot-hours and GPU-hours
        body += _section(
            "slots",
            "GPU slots: MIG slices and shares",
            table([text_col("Model and slot", "key"), col("Jobs", "jobs", 0),
                   col("Slot-hours", "gpu_hours"), col("GPU-hours", "physical_gpu_hours"),
                   col(f"Cost {cur}", "cost", 2)], report.slots),
            '<p class="small">Slot-hours are held; GPU-hours are the physical GPU\'s share '
            "(a 1g.10gb slice of seven: 1/7 of each slot-hour), as the cost is.</p>",
        )  # fmt: skip
    meta = (
        f"Cluster {report.cluster} | {_when(report.since)} to {_when(report.until)} | "
        f"generated {_when(report.generated)} | {report.scope} | cost per {report.unit} "
        f"in {cur}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
        f'<h1>{esc(title)}</h1><p class="meta">{esc(meta)}</p><nav>{nav}</nav>{notes}'
        f"{body}{_definitions()}</main></body></html>\n"
    )


def _efficiency_part(report: MonthlyReport, total_row: dict[str, Any]) -> list[str]:
    """The GPM figures per account and for the top users; blank where not measured."""
    cur = report.currency
    cols = [
        col("GPU-hours", "gpu_hours", 2), col("Util %", "util_mean_percent"),
        col("SM active %", "sm_active_mean_percent"),
        col("Tensor %", "tensor_active_mean_percent"), col("DRAM BW %", "dram_bw_mean_percent"),
        col("Effective GPU-h", "effective_gpu_hours", 2), col("GPM measured %", "gpm_percent"),
    ]  # fmt: skip
    if report.charge == "effective":
        cols += [col(f"Cost ({cur})", "cost", 2), col(f"Idle held ({cur})", "idle_held_cost", 2)]
    note = (
        [f'<p class="note" id="efficiency-note">{esc(report.efficiency_note)}</p>']
        if report.efficiency_note
        else []
    )
    users = report.efficiency_users[:EFFICIENCY_USERS_SHOWN]
    return [
        *note,
        table([text_col("Account", "key"), *cols], [*report.efficiency, total_row],
              cls="efficiency"),
        table([text_col("User", "key"), text_col("Account", "account"), *cols], users,
              cls="efficiency-users"),
        f'<p class="small">{len(users)} of {len(report.efficiency_users)} users GPM measured, '
        "by GPU-hours measured; efficiency_users.csv lists all. Utilization is a duty cycle "
        "(time any kernel ran); SM activity, tensor activity and DRAM bandwidth (NVML GPM, "
        "Hopper and newer GPUs) are means over the GPU-hours GPM measured, blank where it "
        "measured nothing. Effective GPU-hours: GPU-hours measured x SM activity.</p>",
    ]  # fmt: skip


def _nodes_part(report: MonthlyReport) -> list[str]:
    nodes = [n for n in report.nodes if n["gpus"]]
    shown = nodes
    note = ""
    if len(nodes) > HEAT_ROWS:
        ranked = sorted(nodes, key=lambda n: -(n["gpu_hours"]))
        half = HEAT_ROWS // 2
        keep = {n["node"] for n in ranked[:half]} | {n["node"] for n in ranked[-half:]}
        shown = [n for n in nodes if n["node"] in keep]
        note = (
            f"The {half} busiest and {half} least busy of {len(nodes)} nodes; "
            "node_heatmap.csv has every node."
        )
    chart = heat_map(
        [n["node"] for n in shown], report.days, [n["daily_percent"] for n in shown],
        label="GPU occupancy per node and day (%)",
    )  # fmt: skip
    busy = [n for n in report.nodes if n["busy"]]
    return [
        chart,
        f'<p class="small">Occupancy: the node\'s GPU-hours that day / (its GPUs x 24 h). '
        f"{esc(note)}</p>",
        # "Hot node" (now "busy") stays until the monthly format's next version.
        table([text_col("Hot node", "node"), col("GPUs", "gpus", 0),
               col("GPU-hours", "gpu_hours", 2), col("Occupancy %", "occupancy_percent"),
               col("Share %", "share_percent")],
              busy[:30]),
    ]  # fmt: skip


def _definitions() -> str:
    items = (
        ("GPU-hours", "one GPU held by a job for one hour; a job that ran partly in the "
         "month counts the part inside it."),
        ("Utilization", "mean GPU utilization weighted by GPU-hours."),
        ("Idle GPU-hours", "measured GPU-hours below the active threshold; idle cost is "
         "the cost of those hours. Time with no readings is never idle."),
        ("Missing GPU-hours", "GPU-hours held with no readings (agent down, GPU lost): "
         "neither active nor idle, charged all the same, and no reason to list a job as "
         "wasteful."),
        ("Occupancy", "GPU-hours / (GPUs in the inventory x hours of the month so far)."),
        ("SM activity", "NVML GPM (Hopper and newer): the share of SMs with work, over the "
         "GPU-hours GPM measured; unlike utilization (any kernel running), one small "
         "kernel keeping a GPU busy reads low. Blank where not measured, never 0 %."),
        ("Effective GPU-hours", "GPU-hours GPM measured x their SM activity; with [cost] "
         'charge = "effective" they are billed and the rest of the measured time is priced '
         "apart as idle held; GPU-hours GPM did not measure are billed as held."),
        # The old word and key name (now "busy", busy_node_factor) stay until the
        # monthly format's next version: the page stays byte-identical till then.
        ("Hot node", "a node whose share of GPU-hours exceeds [reports] hot_node_factor "
         "x the mean node's share."),
    )  # fmt: skip
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    return f'<section id="definitions" class="defs"><h2>Definitions</h2><dl>{rows}</dl></section>'
