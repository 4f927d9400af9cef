"""sacct's -S/-E time formats (slurm/timespec.py), against Slurm's parse_time(past=1)."""

from __future__ import annotations

import datetime as dt

import pytest

from slurm_gpu.slurm.timespec import format_elapsed, parse_elapsed, parse_time

UTC = dt.UTC
CET = dt.timezone(dt.timedelta(hours=1))
NOW = dt.datetime(2026, 11, 29, 19, 40, 15, tzinfo=UTC)


def at(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    *,
    tz: dt.tzinfo = UTC,
) -> float:
    """The epoch seconds of a wall-clock time in `tz`."""
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW.timestamp()),
        ("now-7days", NOW.timestamp() - 7 * 86400),
        ("now-7day", NOW.timestamp() - 7 * 86400),
        ("now+90", NOW.timestamp() + 90),
        ("now-3hours", NOW.timestamp() - 3 * 3600),
        ("now-2weeks", NOW.timestamp() - 14 * 86400),
        ("now-5minutes", NOW.timestamp() - 300),
        ("now-30seconds", NOW.timestamp() - 30),
        ("NOW-1HOUR", NOW.timestamp() - 3600),
        ("today", at(2026, 11, 29)),
        ("midnight", at(2026, 11, 29)),
        ("noon", at(2026, 11, 29, 12)),
        ("fika", at(2026, 11, 29, 15)),
        ("teatime", at(2026, 11, 29, 16)),
        ("tomorrow", at(2026, 11, 30)),
        ("2026-11-01T00:00", at(2026, 11, 1)),
        ("2026-11-01", at(2026, 11, 1)),
        ("2026-11-01T08:30:15", at(2026, 11, 1, 8, 30, 15)),
        ("14:30", at(2026, 11, 29, 14, 30)),
        ("21:00", at(2026, 11, 29, 21)),  # sacct looks into the past: still today
        ("2:30PM", at(2026, 11, 29, 14, 30)),
        ("12:00am", at(2026, 11, 29, 0, 0)),
        ("12:05 pm", at(2026, 11, 29, 12, 5)),
        ("1101", at(2026, 11, 1)),
        ("110125", at(2025, 11, 1)),
        ("1201", at(2025, 12, 1)),  # a later month than now: last year
        ("11/01", at(2026, 11, 1)),
        ("11/01/25", at(2025, 11, 1)),
        ("11.01.25-10:00", at(2025, 11, 1, 10)),
        ("11/01-10:00:05", at(2026, 11, 1, 10, 0, 5)),
        ("uts1795980945", 1795980945.0),
    ],
)
def test_parse_time_forms(text: str, expected: float) -> None:
    """Each documented sacct form gives the instant Slurm's parse_time(past=1) gives."""
    assert expected == parse_time(text, NOW)


def test_parse_time_uses_now_time_zone() -> None:
    """Dates are local time: the zone of the injected now."""
    now = NOW.astimezone(CET)
    assert at(2026, 11, 1, tz=CET) == parse_time("2026-11-01", now)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "now-7parsecs",
        "now*3",
        "2026-13-01",
        "25:00",
        "13:00pm",
        "11/32",
        "2026-02-30",
        "uts12",
        "abc",
        "now-",
        "now+999999999999",
        "now+99999999999weeks",
        "now-99999999999weeks",
        "now+" + "9" * 5000,
        "uts²",
        "uts99999999999999",
        "\u0661\u0662:\u0660\u0660",  # Arabic-Indic digits: \d and isdigit() take them
    ],
)
def test_parse_time_rejects_the_rest(text: str) -> None:
    """Anything else is an error naming the argument, like sacct's 'Invalid time'."""
    with pytest.raises(ValueError, match="-S/--starttime: invalid time specification"):
        parse_time(text, NOW, argument="-S/--starttime")


def test_parse_time_needs_aware_now() -> None:
    """A naive now would silently use the wrong zone: refused."""
    with pytest.raises(ValueError, match="aware"):
        parse_time("now", dt.datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:30", 30.0),
        ("01:02:03", 3723.0),
        ("2-00:00:01", 172801.0),
        ("05:00", 300.0),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("1-12", 129600.0),
    ],
)
def test_parse_elapsed(text: str, seconds: float | None) -> None:
    """sacct's Elapsed/Timelimit forms."""
    assert seconds == parse_elapsed(text)


def test_format_elapsed_matches_sacct() -> None:
    """[D-]HH:MM:SS, whole seconds."""
    assert ["00:00:30", "01:02:03", "2-00:00:01"] == [
        format_elapsed(s) for s in (30.9, 3723, 172801)
    ]
