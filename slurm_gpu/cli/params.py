"""click helpers shared by the commands."""

from __future__ import annotations

import click

from slurm_gpu.slurm.timespec import now_local, parse_time


def sacct_time(text: str | None, option: str) -> float | None:
    """POSIX seconds of a -S/-E value as sacct takes it (None: the option was not given).

    Args:
        text: what the user typed ("now-7days", "2026-11-01T00:00", "midnight"...).
        option: the option's names, for the message ("-S/--starttime").

    Raises:
        click.BadParameter: not a time (exit 2), the message naming the option.
    """
    if text is None:
        return None
    try:
        return parse_time(text, now_local(), argument=option)
    except ValueError as exc:  # the message starts with the option's name
        raise click.BadParameter(str(exc)) from None


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated option value: "a,,b" -> ["a", "b"]."""
    return [item for item in text.split(",") if item]
