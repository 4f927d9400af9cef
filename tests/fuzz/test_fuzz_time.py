"""Time arguments (-S/-E, --for, durations in the config): a number or a clear ValueError.

parse_time's errors name the option (`-S/--starttime: invalid time specification ...`),
so a CLI can show them as they are; parse_duration's say what a duration looks like.
"""

from __future__ import annotations

import datetime as dt
import math

from hypothesis import example, given
from hypothesis import strategies as st

from slurm_gpu.durations import parse_duration
from slurm_gpu.slurm.timespec import parse_time
from tests.fuzz.strategies import TOKENS, fuzz

NOW = dt.datetime(2026, 11, 29, 19, 12, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
ARGUMENT = "-S/--starttime"

TIME_PIECES = st.sampled_from(
    [
        "now",
        "now+",
        "now-",
        "today",
        "tomorrow",
        "midnight",
        "noon",
        "fika",
        "teatime",
        "uts",
        "T",
        "-",
        ":",
        ".",
        "/",
        " ",
        "am",
        "pm",
        "AM",
        "days",
        "weeks",
        "seconds",
        "minutes",
        "hours",
        "2026-11-01",
        "11/01",
        "1101",
        "12:30",
        "23:59:59",
        "24:00",
        "99",
        "0",
        "00",
        "1",
        "12",
        "31",
        "13",
        "9" * 12,
        *TOKENS[:12],
    ]
)
TIME_TEXT = st.one_of(
    st.lists(TIME_PIECES, max_size=6).map("".join),
    st.text(max_size=20),
    st.text(alphabet="0123456789:-./Tnowupm+ ", max_size=20),
)


@fuzz(600)
@given(TIME_TEXT)
@example("now+99999999999weeks")
@example("now-99999999999weeks")
@example("uts²")
@example("now+" + "9" * 5000)
def test_parse_time_gives_seconds_or_error_naming_the_option(text: str) -> None:
    """parse_time on any text: finite POSIX seconds, or a ValueError naming the option.

    Never an OverflowError or a bare int() message.
    """
    try:
        seconds = parse_time(text, NOW, argument=ARGUMENT)
    except ValueError as exc:
        assert str(exc).startswith(f"{ARGUMENT}: invalid time specification"), str(exc)
        return
    assert math.isfinite(seconds)


DURATION_PIECES = st.sampled_from(
    [
        *("1", "90", "1.5", ".5", "0", "d", "h", "m", "s", "x", " ", "-", "e", "inf", "nan"),
        *("_", "1h30m", "7d", "9" * 400, "٣", "²", "1e999"),
    ]
)


@fuzz(600)
@given(
    st.one_of(
        st.lists(DURATION_PIECES, max_size=6).map("".join),
        st.text(max_size=16),
        st.integers(),
        st.floats(),
        st.integers(min_value=10**400, max_value=10**401),
    )
)
@example("٣h")
@example(10**400)
def test_parse_duration_gives_seconds_or_value_error(value: str | int | float) -> None:
    """parse_duration on any text or number: finite seconds >= 0, or a ValueError.

    The ValueError says what was given.
    """
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert "duration" in str(exc), str(exc)
        return
    assert math.isfinite(seconds) and seconds >= 0


@fuzz(50)
@given(st.one_of(st.none(), st.booleans(), st.lists(st.integers(), max_size=2)))
def test_parse_duration_rejects_other_types_with_type_error(value: object) -> None:
    """A value neither text nor a number (a TOML boolean or array) is a TypeError.

    As documented; the config loader checks types before calling it.
    """
    try:
        parse_duration(value)  # type: ignore[arg-type]
    except TypeError as exc:
        assert "duration" in str(exc)
    else:
        raise AssertionError(f"parse_duration accepted {value!r}")
