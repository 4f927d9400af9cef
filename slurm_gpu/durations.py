"""Durations written the way admins write them: "90s", "45m", "2h", "7d", "1h30m".

One parser for the config file and the command line, so that `interval = "1h30m"` in
slurm-gpu.toml and `--idle-for 1h30m` on the command line mean the same thing.
A duration is a float of seconds; `Duration` marks such a float in type hints so the
config loader knows to accept the text forms.
"""

from __future__ import annotations

import math
import re
from typing import NewType

Duration = NewType("Duration", float)
"""Seconds, as a float. Config fields typed `Duration` accept "10s", "1h30m" or a number."""

# Largest unit first: components must appear in this order, each at most once.
UNIT_SECONDS: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}

DURATION_FORMS = '"90s", "45m", "2h", "7d", "1h30m" or a number of seconds'
"""What a duration may look like, for error messages."""

_COMPONENT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]+)\s*")


def parse_duration(value: str | int | float) -> Duration:
    """Parse a duration into seconds.

    Args:
        value: "90s", "45m", "2h", "7d", "1h30m", "1.5h", a bare number of seconds as
            text ("30"), or an int/float of seconds.

    Returns:
        The duration in seconds.

    Raises:
        ValueError: the text is not a duration, or the duration is negative or not finite.
            The message says what was expected.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"a duration is text or a number of seconds, not {type(value).__name__}")
    if isinstance(value, int | float):
        try:
            return _checked(float(value), value)
        except OverflowError:
            raise ValueError(f"a duration must be finite, got {value!r}") from None
    text = value.strip()
    if not text:
        raise ValueError(f"empty duration; expected {DURATION_FORMS}")
    try:
        bare_seconds = float(text)
    except ValueError:
        pass
    else:
        return _checked(bare_seconds, value)
    if text.startswith("-"):
        raise ValueError(f"a duration must not be negative, got {value!r}")
    total = 0.0
    position = 0
    previous_rank = -1
    ranks = list(UNIT_SECONDS)
    while position < len(text):
        match = _COMPONENT.match(text, position)
        if match is None:
            raise ValueError(f"not a duration: {value!r}; expected {DURATION_FORMS}")
        number, unit = match.groups()
        if unit not in UNIT_SECONDS:
            raise ValueError(
                f"unknown unit {unit!r} in duration {value!r}; use d, h, m or s "
                f"(expected {DURATION_FORMS})"
            )
        rank = ranks.index(unit)
        if rank <= previous_rank:
            raise ValueError(
                f"units out of order or repeated in duration {value!r}; "
                "write the largest unit first, each once (e.g. 1d2h30m)"
            )
        previous_rank = rank
        total += float(number) * UNIT_SECONDS[unit]
        position = match.end()
    return _checked(total, value)


def format_duration(seconds: float) -> str:
    """Write seconds in the shortest form parse_duration reads back to the same float.

    Whole seconds are split into units (5400 -> "1h30m", 7776000 -> "90d", 0 -> "0s");
    fractional seconds are written as seconds ("0.25s").

    Raises:
        ValueError: seconds is negative or not finite.
    """
    _checked(float(seconds), seconds)
    if not float(seconds).is_integer():
        return f"{float(seconds)!r}s"
    remaining = int(seconds)
    if remaining == 0:
        return "0s"
    parts = []
    for unit, size in UNIT_SECONDS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _checked(seconds: float, given: object) -> Duration:
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {given!r}")
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {given!r}")
    return Duration(seconds)
