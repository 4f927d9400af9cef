"""Slurm's bracket ranges: `gpu[1-3,7]` -> gpu1 gpu2 gpu3 gpu7 (`scontrol show hostnames`)."""

from __future__ import annotations

import itertools
import re

from slurm_gpu.errors import SlurmError, brief

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


MAX_NAMES = 100_000
"""Most names one expression may expand to, all ranges multiplied: a hostile or mistyped
node list (`n[0-99999][0-99999]`) is refused instead of exhausting memory."""

_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")  # ASCII digits only: '²'.isdigit()


def expand(expression: str) -> list[str]:
    """Expands a Slurm hostlist or device-file range, keeping zero padding (`n[01-03]`).

    Commas outside brackets separate items. Raises SlurmError on a malformed range or
    when the expression names more than MAX_NAMES in all.
    """
    items: list[str] = []
    for part in _split_top_level(expression.strip()):
        items.extend(_expand_one(part, MAX_NAMES - len(items)))
    return items


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"unbalanced ']' in {brief(text, 60)}")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise SlurmError(f"unbalanced '[' in {brief(text, 60)}")
    parts.append(current)
    return [p for p in parts if p]


def _expand_one(item: str, budget: int) -> list[str]:
    # re.split with one group alternates literal text and bracket contents.
    pieces = _BRACKET.split(item)
    choices: list[list[str]] = []
    count = 1
    for number, piece in enumerate(pieces):
        if number % 2 == 0:
            if "[" in piece or "]" in piece:
                raise SlurmError(f"nested brackets in {brief(item, 60)}")
            choices.append([piece])
            continue
        ranges = [_parse_range(rng, item) for rng in piece.split(",")]
        count *= sum(end - start + 1 for start, end, _width in ranges)
        if count > budget:  # checked before the names are built
            break
        choices.append(
            [f"{n:0{width}d}" for start, end, width in ranges for n in range(start, end + 1)]
        )
    if count > budget:
        raise SlurmError(f"{brief(item, 60)}: the list expands to more than {MAX_NAMES} names")
    return ["".join(names) for names in itertools.product(*choices)]


def _parse_range(rng: str, item: str) -> tuple[int, int, int]:
    """`01-03` -> (1, 3, 2): first, last, zero-padded width (0: none)."""
    match = _RANGE.fullmatch(rng)
    if match is None:
        raise SlurmError(f"bad range {brief(rng, 60)} in {brief(item, 60)}")
    lo, hi = match.group(1), match.group(2)
    start, end = int(lo), int(hi if hi is not None else lo)
    if end < start:
        raise SlurmError(f"bad range {brief(rng, 60)} in {brief(item, 60)}")
    return start, end, len(lo) if lo.startswith("0") else 0
