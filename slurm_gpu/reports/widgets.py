"""Page widgets: inline SVG charts and HTML tables, no JavaScript, no external URLs.

Every text that reaches the page goes through `esc` (html.escape with quotes), since job
names, users and accounts are whatever users typed into sbatch.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.units import is_known

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
    if not is_known(value):
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
        width: of the chart, pixels.
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
class HtmlColumn:
    """One HTML table column: header, how to get the cell's text, numeric (right-aligned)."""

    title: str
    get: Callable[[Mapping[str, Any]], str]
    numeric: bool = True


def col(title: str, key: str, digits: int = 1) -> HtmlColumn:
    """A numeric column of `record[key]`."""
    return HtmlColumn(title, lambda r: number(r.get(key), digits))


def text_col(title: str, key: str) -> HtmlColumn:
    """A text column of `record[key]`."""
    return HtmlColumn(title, lambda r: "" if r.get(key) is None else str(r.get(key)), numeric=False)


def table(
    columns: Sequence[HtmlColumn], records: Sequence[Mapping[str, Any]], cls: str = ""
) -> str:
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
