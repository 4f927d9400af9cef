"""Slurm's bracket ranges: `gpu[1-3,7]` -> gpu1 gpu2 gpu3 gpu7 (`scontrol show hostnames`)."""

from __future__ import annotations

import re

from slurm_gpu.errors import SlurmError

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand(expression: str) -> list[str]:
    """Expands a Slurm hostlist or device-file range, keeping zero padding (`n[01-03]`).

    Commas outside brackets separate items. Raises SlurmError on a malformed range.
    """
    items: list[str] = []
    for part in _split_top_level(expression.strip()):
        items.extend(_expand_one(part))
    return items


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"unbalanced ']' in {text!r}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise SlurmError(f"unbalanced '[' in {text!r}")
    parts.append(current)
    return [p for p in parts if p]


def _expand_one(item: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    expanded: list[str] = []
    for rng in match.group(1).split(","):
        lo, sep, hi = rng.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmError(f"bad range {rng!r} in {item!r}")
        width = len(lo) if lo.startswith("0") else 0
        start, end = int(lo), int(hi) if sep else int(lo)
        if end < start or end - start > 100_000:
            raise SlurmError(f"bad range {rng!r} in {item!r}")
        for n in range(start, end + 1):
            expanded.extend(_expand_one(f"{head}{n:0{width}d}{tail}"))
    return expanded
