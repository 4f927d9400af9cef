"""Output like sacct's: fixed-width table, -P/--parsable2, -p/--parsable, --json, --csv.

- Table: each column has a width (`User%12` on -o, else the field's default), values
  right-justified (left when the width is negative, as sacct does for JobID), cut to
  the width with a trailing "+" like sacct, a header row and a row of dashes, one space
  after every column.
- -P: `|` between fields, nothing after the last; -p: `|` after every field.
- --json: a list of objects keyed by the field names, numbers as numbers.
- --csv: RFC 4180 with a header row.
See https://slurm.schedmd.com/sacct.html (--format, --parsable, --parsable2).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from slurm_gpu.units import is_known

OutputMode = Literal["table", "parsable", "parsable2", "json", "csv"]
Cell = str | int | float | None


@dataclass(frozen=True)
class Field:
    """One output column.

    Attributes:
        name: the name on -o and in the header (sacct style, e.g. "GPUHours").
        width: default table width; negative means left-justified.
        help: one line for --helpformat (says the unit).
        get: the value of this field for a record (a mapping of record keys).
        fmt: how the value is written in text outputs.
    """

    name: str
    width: int
    help: str
    get: Callable[[Mapping[str, Any]], Cell]
    fmt: Callable[[Cell], str]


@dataclass(frozen=True)
class ChosenField:
    """A field chosen on -o, with its table width."""

    field: Field
    width: int


def parse_format(
    text: str, fields: Mapping[str, Field], *, option: str = "-o/--format"
) -> list[ChosenField]:
    """`JobID,User%12,GPUUtilAvg` -> columns (names case-insensitive, like sacct).

    Raises:
        ValueError: an unknown field or a bad width; the message lists the valid names.
    """
    by_lower = {name.lower(): f for name, f in fields.items()}
    columns: list[ChosenField] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, width_text = item.partition("%")
        found = by_lower.get(name.strip().lower())
        if found is None:
            raise ValueError(f"{option}: unknown field {name!r}; valid fields: {', '.join(fields)}")
        width = found.width
        if sep:
            try:
                width = int(width_text)
            except ValueError:
                raise ValueError(f"{option}: bad width in {item!r}") from None
            if width == 0:
                raise ValueError(f"{option}: width 0 in {item!r}")
        columns.append(ChosenField(found, width))
    if not columns:
        raise ValueError(f"{option}: no fields given")
    return columns


def cell_text(value: Cell, fmt: Callable[[Cell], str]) -> str:
    """A value as text; None (unknown) is empty."""
    return fmt(value) if is_known(value) else ""


def render(
    columns: Sequence[ChosenField],
    records: Sequence[Mapping[str, Any]],
    mode: OutputMode,
    *,
    header: bool = True,
    delimiter: str = "|",
) -> str:
    """Write records in one of the output modes; the text ends with a newline (or is "").

    `delimiter` separates -p/-P fields (sacct's --delimiter; its default is "|").
    """
    if mode == "json":
        return json.dumps([json_record(columns, r) for r in records], indent=2) + "\n"
    rows = [[cell_text(c.field.get(r), c.field.fmt) for c in columns] for r in records]
    names = [c.field.name for c in columns]
    if mode == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if header:
            writer.writerow(names)
        writer.writerows(rows)
        return out.getvalue()
    lines: list[str] = []
    if mode in ("parsable", "parsable2"):
        tail = delimiter if mode == "parsable" else ""
        if header:
            lines.append(delimiter.join(names) + tail)
        lines.extend(delimiter.join(row) + tail for row in rows)
    else:
        if header:
            lines.append(
                " ".join(_fit(n, c.width) for n, c in zip(names, columns, strict=True)) + " "
            )
            lines.append(" ".join("-" * abs(c.width) for c in columns) + " ")
        for row in rows:
            lines.append(
                " ".join(_fit(v, c.width) for v, c in zip(row, columns, strict=True)) + " "
            )
    return "".join(line + "\n" for line in lines)


def _fit(text: str, width: int) -> str:
    """sacct's cell: cut to |width| with a trailing '+', justified by the width's sign."""
    size = abs(width)
    text = text.replace("\n", " ")
    if len(text) > size:
        text = text[: size - 1] + "+" if size > 1 else "+"
    return text.ljust(size) if width < 0 else text.rjust(size)


def json_record(columns: Sequence[ChosenField], record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as a JSON object: numbers stay numbers (rounded as in text), None is null."""
    out: dict[str, Any] = {}
    for column in columns:
        value = column.field.get(record)
        if isinstance(value, float):
            if not is_known(value):
                value = None
            else:
                text = column.field.fmt(value)
                with contextlib.suppress(ValueError):
                    value = float(text)
        out[column.field.name] = value
    return out


def help_format(fields: Mapping[str, Field]) -> str:
    """--helpformat: every field with its meaning and unit, one per line."""
    width = max(len(n) for n in fields)
    return "".join(f"{name:<{width}}  {f.help}\n" for name, f in fields.items())


# ---------------------------------------------------------------------------- formatters


def fmt_text(value: Cell) -> str:
    """Text as is."""
    return str(value)


def fmt_int(value: Cell) -> str:
    """Whole number."""
    return str(int(float(value))) if value is not None else ""


def fixed(decimals: int) -> Callable[[Cell], str]:
    """A formatter with a fixed number of decimals."""

    def fmt(value: Cell) -> str:
        return f"{float(value):.{decimals}f}" if value is not None else ""

    return fmt
