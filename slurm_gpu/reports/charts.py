"""Inline SVG charts and HTML tables for the monthly report: no JavaScript, no external URLs.

Every text that reaches the page goes through `esc` (html.escape with quotes), since job
names, users and accounts are whatever users typed into sbatch.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_gpu.reports.monthly import MonthlyReport

BAR = "#3b6ea5"
IDLE = "#d9822b"
GRID = "#d0d7de"
INK = "#24292f"
MUTED = "#57606a"


def esc(value: object) -> str:
    """`value` as page text: &, <, >, " and ' escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def number(value: Any, digits: int = 1) -> str:
    """A figure with thousands separators; "" for unknown (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{float(value):,.{digits}f}"


def _svg(width: int, height: int, label: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="{esc(label)}"><title>{esc(label)}</title>' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, text: str, *, anchor: str = "start", size: int = 12) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" fill="{INK}" '
        f'text-anchor="{anchor}">{esc(text)}</text>'
    )


def hbar_chart(
    items: Sequence[tuple[str, float, float]],
    *,
    label: str,
    unit: str,
    width: int = 950,
    second: str = "",
) -> str:
    """Horizontal bars: (name, value, part of it drawn in the second colour, e.g. idle).

    Args:
        items: rows, top first.
        label: the chart's accessible name and title.
        unit: appended to each value label ("GPU-h").
        second: legend text of the second colour ("" = no second part, no legend).
    """
    row, left, right, top = 22, 170, 110, 24 if second else 6
    height = top + row * max(len(items), 1) + 6
    peak = max((v for _, v, _ in items), default=0.0) or 1.0
    span = width - left - right
    body: list[str] = []
    if second:
        body += [
            f'<rect x="{left}" y="6" width="12" height="10" fill="{BAR}"/>',
            _text(left + 16, 15, "total", size=11),
            f'<rect x="{left + 70}" y="6" width="12" height="10" fill="{IDLE}"/>',
            _text(left + 86, 15, second, size=11),
        ]
    for i, (name, value, part) in enumerate(items):
        y = top + i * row
        w = max(span * value / peak, 0.0)
        shown = name if len(name) <= 24 else name[:23] + "…"
        body.append(_text(left - 6, y + 15, shown, anchor="end"))
        body.append(
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{BAR}"/>'
        )
        if second and part > 0:
            pw = max(span * min(part, value) / peak, 0.0)
            body.append(
                f'<rect x="{left}" y="{y + 3}" width="{pw:.1f}" height="{row - 6}" fill="{IDLE}"/>'
            )
        body.append(_text(left + w + 6, y + 15, f"{number(value, 2)} {unit}", size=11))
    return _svg(width, height, label, body)


def column_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    label: str,
    unit: str,
    width: int = 950,
    height: int = 220,
    every: int = 1,
) -> str:
    """Vertical columns with a y axis (0, half, max); every `every`-th x label is written."""
    left, bottom, top = 64, 28, 12
    span_x, span_y = width - left - 10, height - top - bottom
    peak = max(values, default=0.0) or 1.0
    step = span_x / max(len(values), 1)
    body: list[str] = []
    for fraction in (0.0, 0.5, 1.0):
        y = top + span_y * (1 - fraction)
        body.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="{GRID}"/>'
        )
        tick = number(peak * fraction, 0 if peak >= 20 else 2)
        body.append(_text(left - 6, y + 4, tick, anchor="end", size=11))
    body.append(_text(4, top + 10, unit, size=11))
    for i, (name, value) in enumerate(zip(labels, values, strict=True)):
        h = span_y * max(value, 0.0) / peak
        x = left + i * step
        body.append(
            f'<rect x="{x + step * 0.1:.1f}" y="{top + span_y - h:.1f}" '
            f'width="{step * 0.8:.1f}" height="{h:.1f}" fill="{BAR}">'
            f"<title>{esc(name)}: {esc(number(value))} {esc(unit)}</title></rect>"
        )
        if i % every == 0:
            body.append(_text(x + step / 2, height - 10, name, anchor="middle", size=10))
    return _svg(width, height, label, body)


def heat_colour(fraction: float) -> str:
    """White (0) through amber to dark red (1)."""
    f = min(max(fraction, 0.0), 1.0)
    stops = ((255, 255, 255), (253, 186, 74), (189, 0, 38))
    if f < 0.5:
        a, b, t = stops[0], stops[1], f / 0.5
    else:
        a, b, t = stops[1], stops[2], (f - 0.5) / 0.5
    r, g, bl = (round(a[k] + (b[k] - a[k]) * t) for k in range(3))
    return f"#{r:02x}{g:02x}{bl:02x}"


def heat_map(
    rows: Sequence[str],
    columns: Sequence[str],
    values: Sequence[Sequence[float]],
    *,
    label: str,
    unit: str = "%",
    scale: float = 100.0,
    width: int = 900,
) -> str:
    """A grid of cells coloured by value / scale (occupancy %), one row per node."""
    left, top, legend = 110, 22, 30
    cell_w = (width - left - 10) / max(len(columns), 1)
    cell_h = 14 if len(rows) <= 60 else 6
    height = top + cell_h * len(rows) + legend
    body: list[str] = []
    for j, name in enumerate(columns):
        if j % 2 == 0:
            body.append(_text(left + (j + 0.5) * cell_w, 14, name, anchor="middle", size=10))
    for i, (name, line) in enumerate(zip(rows, values, strict=True)):
        y = top + i * cell_h
        if cell_h >= 10 or i % 10 == 0:
            body.append(_text(left - 6, y + min(cell_h, 12) - 1, name, anchor="end", size=10))
        for j, value in enumerate(line):
            body.append(
                f'<rect x="{left + j * cell_w:.1f}" y="{y}" width="{cell_w:.1f}" '
                f'height="{cell_h}" fill="{heat_colour(value / scale)}" stroke="#eef1f4" '
                f'stroke-width="0.5">'
                f"<title>{esc(name)} {esc(columns[j])}: {value:.0f}{esc(unit)}</title></rect>"
            )
    y = top + cell_h * len(rows) + 10
    for k in range(11):
        body.append(
            f'<rect x="{left + k * 24}" y="{y}" width="24" height="10" '
            f'fill="{heat_colour(k / 10)}" stroke="{GRID}"/>'
        )
    body.append(_text(left - 6, y + 9, f"0{unit}", anchor="end", size=10))
    body.append(_text(left + 11 * 24 + 6, y + 9, f"{scale:.0f}{unit}", size=10))
    return _svg(width, height, label, body)


@dataclass(frozen=True)
class Column:
    """One table column: header, how to get the cell's text, numeric (right-aligned)."""

    title: str
    get: Callable[[Mapping[str, Any]], str]
    numeric: bool = True


def col(title: str, key: str, digits: int = 1) -> Column:
    """A numeric column of `record[key]`."""
    return Column(title, lambda r: number(r.get(key), digits))


def text_col(title: str, key: str) -> Column:
    """A text column of `record[key]`."""
    return Column(title, lambda r: "" if r.get(key) is None else str(r.get(key)), numeric=False)


def table(columns: Sequence[Column], records: Sequence[Mapping[str, Any]], cls: str = "") -> str:
    """An HTML table; every cell escaped. A record with "_total" is shown as the totals row."""
    head = "".join(f'<th class="{"num" if c.numeric else ""}">{esc(c.title)}</th>' for c in columns)
    lines = []
    for record in records:
        total = ' class="total"' if record.get("_total") else ""
        cells = "".join(
            f'<td class="{"num" if c.numeric else ""}">{esc(c.get(record))}</td>' for c in columns
        )
        lines.append(f"<tr{total}>{cells}</tr>")
    if not records:
        lines.append(f'<tr><td colspan="{len(columns)}" class="empty">none</td></tr>')
    return (
        f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(lines)}</tbody></table>"
    )


# ---- the monthly page ------------------------------------------------------------------

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
    ("idle", "Idle waste"),
    ("waste-jobs", "Top wasteful jobs"),
    ("queue", "Queue wait by partition"),
    ("nodes", "Node heat map"),
    ("controller", "What the controller did"),
)
USERS_SHOWN = 40
HEAT_ROWS = 120  # nodes drawn in the heat map: the busiest and idlest halves beyond this


def _when(seconds: float, tz: Any = None) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, tz).strftime("%Y-%m-%d %H:%M")


def _duration(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    s = round(float(value))
    days, rest = divmod(s, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


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
        col("Idle %", "idle_percent"), col("GPU-mem GiB-h", "gpu_mem_hours", 0),
        col("Energy kWh", "energy_kwh"),
    ]  # fmt: skip
    total_row = {**o, "key": "TOTAL", "_total": True}
    accounts = [
        hbar_chart(
            [(r["key"], r["gpu_hours"], r["idle_gpu_hours"]) for r in report.accounts[:15]],
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
               Column("Mean", lambda r: _duration(r.get("mean_seconds"))),
               Column("Median", lambda r: _duration(r.get("median_seconds"))),
               Column("95th pct", lambda r: _duration(r.get("p95_seconds"))),
               Column("Max", lambda r: _duration(r.get("max_seconds")))], report.queue),
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
        table([Column("Time", lambda r: _when(r["time"]), numeric=False), text_col("Kind", "kind"),
               text_col("Policy", "policy"), text_col("Action", "action"),
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
        "accounts": accounts, "users": users, "utilization": utilization, "idle": idle,
        "waste-jobs": waste, "queue": queue, "nodes": nodes, "controller": controller,
    }  # fmt: skip
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in report.notes)
    nav = "".join(f'<a href="#{k}">{esc(t)}</a>' for k, t in SECTIONS)
    title = f"GPU usage report {report.month}: {report.cluster}"
    body = "".join(_section(k, titles[k], *parts[k]) for k, _ in SECTIONS)
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
    hot = [n for n in report.nodes if n["hot"]]
    return [
        chart,
        f'<p class="small">Occupancy: the node\'s GPU-hours that day / (its GPUs x 24 h). '
        f"{esc(note)}</p>",
        table([text_col("Hot node", "node"), col("GPUs", "gpus", 0),
               col("GPU-hours", "gpu_hours", 2), col("Occupancy %", "occupancy_percent"),
               col("Share %", "share_percent")],
              hot[:30]),
    ]  # fmt: skip


def _definitions() -> str:
    items = (
        ("GPU-hours", "one GPU held by a job for one hour; a job that ran partly in the "
         "month counts the part inside it."),
        ("Utilization", "mean GPU utilization weighted by GPU-hours."),
        ("Idle GPU-hours", "GPU-hours minus the hours the GPU was above the active "
         "threshold; idle cost is the cost of those hours."),
        ("Occupancy", "GPU-hours / (GPUs in the inventory x hours of the month so far)."),
        ("Hot node", "a node whose share of GPU-hours exceeds [reports] hot_node_factor "
         "x the mean node's share."),
    )  # fmt: skip
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items)
    return f'<section id="definitions" class="defs"><h2>Definitions</h2><dl>{rows}</dl></section>'
