"""Times written the way sacct's -S/-E take them, as pure functions of the text and `now`.

A port of Slurm's `parse_time(time_str, past=1)` (src/common/parse_time.c), the parser
behind `sacct -S/-E` (https://slurm.schedmd.com/sacct.html#OPT_starttime):

    HH:MM[:SS][AM|PM]                 today at that time
    MMDD[YY][-HH:MM[:SS]]             a date (this year, or last year if the month is later
    MM.DD[.YY][-HH:MM[:SS]]           than the current one: sacct looks into the past)
    MM/DD[/YY][-HH:MM[:SS]]
    YYYY-MM-DD[THH:MM[:SS]]
    today, midnight, noon, fika (3 PM), teatime (4 PM), tomorrow
    now[{+|-}count[seconds(default)|minutes|hours|days|weeks]]
    uts<POSIX seconds>

Everything else is rejected with a ValueError naming the argument, where Slurm prints
"Invalid time specification". Local time is `now`'s time zone, so tests inject both.
"""

from __future__ import annotations

import datetime as dt
import re

from slurm_gpu.units import is_known

FORMS = (
    "HH:MM[:SS][AM|PM], MMDD[YY][-HH:MM[:SS]], MM.DD[.YY][-HH:MM[:SS]], "
    "MM/DD[/YY][-HH:MM[:SS]], YYYY-MM-DD[THH:MM[:SS]], today, midnight, noon, fika, "
    "teatime, now[{+|-}count[seconds|minutes|hours|days|weeks]]"
)

_UNITS = (
    ("seconds", 1),
    ("second", 1),
    ("minutes", 60),
    ("minute", 60),
    ("hours", 3600),
    ("hour", 3600),
    ("days", 86400),
    ("day", 86400),
    ("weeks", 604800),
    ("week", 604800),
)
_WORDS = {"midnight": 0, "noon": 12, "fika": 15, "teatime": 16}
# [0-9], not \d or str.isdigit(): those accept other scripts' digits and '²'.
_ISO_DATE = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})")
_SHORT_DATE = re.compile(r"([0-9]{1,2})[./]?([0-9]{1,2})[./]?([0-9]{2})?")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?\s*(am|pm)?", re.IGNORECASE)
_DELTA = re.compile(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*")
_MAX_SECONDS = 253402300799  # 9999-12-31T23:59:59Z: the last second a datetime can hold


class _Bad(Exception):
    """The text is not a time; the message says where."""


def now_local() -> dt.datetime:
    """The current time, aware, in the local time zone (what Slurm's localtime_r uses)."""
    return dt.datetime.now().astimezone()


def parse_time(text: str, now: dt.datetime, *, argument: str = "time") -> float:
    """POSIX seconds of a sacct time specification.

    Args:
        text: what the user typed after -S/-E.
        now: the current time, timezone-aware; its zone is the local time zone.
        argument: the option name, for the error message (e.g. "-S/--starttime").

    Raises:
        ValueError: `text` is not one of sacct's time forms; the message names `argument`.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    try:
        return _parse(text.strip(), now)
    except _Bad as exc:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise ValueError(
            f"{argument}: invalid time specification {shown!r} ({exc}); expected {FORMS}"
        ) from None


def _parse(text: str, now: dt.datetime) -> float:
    if text[:3].lower() == "uts":
        digits = text[3:]
        if not re.fullmatch(r"[0-9]{1,20}", digits) or int(digits) < 1_000_000:
            raise _Bad("uts needs POSIX seconds")
        if int(digits) > _MAX_SECONDS:
            raise _Bad("uts seconds beyond the year 9999")
        return float(int(digits))
    if not text:
        raise _Bad("empty")
    hour = minute = -1
    second = 0
    date: dt.date | None = None
    month_day: tuple[int, int] | None = None  # a date without a year
    pos = 0
    lower = text.lower()
    while pos < len(text):
        char = text[pos]
        if char.isspace() or char in "-T":
            pos += 1
            continue
        if lower.startswith("today", pos):
            date, month_day, pos = now.date(), None, pos + 5
            continue
        if lower.startswith("tomorrow", pos):
            date, month_day, pos = (now + dt.timedelta(days=1)).date(), None, pos + 8
            continue
        word = next((w for w in _WORDS if lower.startswith(w, pos)), None)
        if word is not None:
            hour, minute, second, pos = _WORDS[word], 0, 0, pos + len(word)
            continue
        if lower.startswith("now", pos):
            later, pos = _now_delta(text, pos + 3, now)
            date, month_day = later.date(), None
            hour, minute, second = later.hour, later.minute, later.second
            continue
        if not "0" <= char <= "9":
            raise _Bad(f"unexpected {char!r} at position {pos + 1}")
        if text[pos + 1 : pos + 2] == ":" or text[pos + 2 : pos + 3] == ":":
            match = _TIME.match(text, pos)
            if match is None:
                raise _Bad(f"bad time of day at position {pos + 1}")
            hour, minute = int(match.group(1)), int(match.group(2))
            second = int(match.group(3) or 0)
            hour = _ampm(hour, (match.group(4) or "").lower())
            if hour > 23 or minute > 59 or second > 59:
                raise _Bad(f"time of day out of range at position {pos + 1}")
            pos = match.end()
            continue
        iso = _ISO_DATE.match(text, pos)
        if iso is not None:
            date = _date(int(iso.group(1)), int(iso.group(2)), int(iso.group(3)))
            month_day, pos = None, iso.end()
            continue
        short = _SHORT_DATE.match(text, pos)
        if short is None:
            raise _Bad(f"bad date at position {pos + 1}")
        month, day = int(short.group(1)), int(short.group(2))
        if not 1 <= month <= 12 or not 1 <= day <= 31:
            raise _Bad(f"month or day out of range at position {pos + 1}")
        if short.group(3) is not None:
            date, month_day = _date(2000 + int(short.group(3)), month, day), None
        else:
            date, month_day = None, (month, day)
        pos = short.end()
    if hour == -1 and date is None and month_day is None:
        raise _Bad("no date or time")
    if hour == -1:
        hour, minute, second = 0, 0, 0
    if date is None and month_day is None:
        date = now.date()  # a time of day alone: today (sacct looks into the past)
    if date is None and month_day is not None:
        month, day = month_day
        date = _date(now.year - 1 if month > now.month else now.year, month, day)
    assert date is not None
    local = dt.datetime(date.year, date.month, date.day, hour, minute, second)
    return local.replace(tzinfo=now.tzinfo).timestamp()


def _ampm(hour: int, suffix: str) -> int:
    if suffix == "pm":
        hour += 12
        if hour > 23:
            if hour != 24:
                raise _Bad("hour out of range for PM")
            hour = 12
    elif suffix == "am" and hour > 11:
        if hour != 12:
            raise _Bad("hour out of range for AM")
        hour = 0
    return hour


def _date(year: int, month: int, day: int) -> dt.date:
    try:
        return dt.date(year, month, day)
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def _now_delta(text: str, pos: int, now: dt.datetime) -> tuple[dt.datetime, int]:
    rest = text[pos:].lstrip()
    if not rest:
        return now, len(text)
    sign = {"+": 1, "-": -1}.get(rest[0])
    if sign is None:
        raise _Bad("after 'now' expected + or -")
    match = _DELTA.fullmatch(rest[1:])
    if match is None:
        raise _Bad("after now+/now- expected a count and an optional unit")
    unit = match.group(2).lower()
    factor = 1 if not unit else next((f for name, f in _UNITS if name == unit), 0)
    if factor == 0:
        raise _Bad(f"unknown unit {match.group(2)!r}; use seconds, minutes, hours, days, weeks")
    count = match.group(1).lstrip("0") or "0"
    # Length first: int() refuses past 4300 digits, and no offset that long is a date.
    seconds = sign * int(count) * factor if len(count) <= 20 else sign * (_MAX_SECONDS + 1)
    try:
        if abs(seconds) > _MAX_SECONDS:
            raise OverflowError
        later = dt.datetime.fromtimestamp(now.timestamp() + seconds, tz=now.tzinfo)
    except (OverflowError, OSError, ValueError):  # before year 1 or after 9999
        offset = f"{rest[0]}{_brief(match.group(1))}{match.group(2)}"
        raise _Bad(f"now{offset} is outside the years 1 to 9999") from None
    return later, len(text)


def _brief(digits: str) -> str:
    return digits if len(digits) <= 20 else f"{digits[:17]}... ({len(digits)} digits)"


def format_sacct_time(seconds: float | None, tz: dt.tzinfo | None = None) -> str:
    """A time as sacct prints it: local `YYYY-MM-DDTHH:MM:SS`, "Unknown" when unset."""
    if not is_known(seconds) or seconds <= 0:
        return "Unknown"
    return (
        dt.datetime.fromtimestamp(int(seconds), tz=tz).astimezone(tz).strftime("%Y-%m-%dT%H:%M:%S")
    )


def format_elapsed(seconds: float | None) -> str:
    """Seconds as sacct's Elapsed: `[D-]HH:MM:SS` (whole seconds, truncated like Slurm).

    The one `[D-]HH:MM:SS` writer; a caller that shows a mean rounds it first (the
    monthly page's queue waits).
    """
    if not is_known(seconds):
        return ""
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_elapsed(text: str) -> float | None:
    """sacct's `[D-][HH:]MM:SS` (Elapsed, Timelimit) to seconds; None for UNLIMITED/empty.

    Raises:
        ValueError: the text is none of those forms.
    """
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT", "INVALID"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?", text)
    if match is None:
        match_days = re.fullmatch(r"(\d+)-(\d+)", text)
        if match_days is None:
            raise ValueError(f"not a Slurm duration: {text!r}")
        return float(int(match_days.group(1)) * 86400 + int(match_days.group(2)) * 3600)
    days, hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
    return float(days * 86400 + hours * 3600 + minutes * 60 + secs)
