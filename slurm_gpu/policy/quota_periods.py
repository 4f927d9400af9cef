"""Quota periods: which [period_start, period_end) a [[quota]] budget counts at a moment.

- "month": the calendar month in the cluster's local time: from the 1st at 00:00 to the
  1st of the next month at 00:00. A budget resets when the cluster's month does.
- "week": the ISO week in local time, Monday 00:00 to the next Monday 00:00 (`date +%V`).
- "<N>d": a rolling window of the last N*86400 seconds, ending now: [now - N days, now).
  It never "ends"; usage leaves it as it ages.

Local midnights are computed with zoneinfo, so a month holding a daylight-saving change is
an hour shorter or longer than its days times 86400 seconds, as the wall clock says.
Pure: the time zone is an argument (see `cluster_timezone` for the config's choice).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

__all__ = ["DAY_SECONDS", "cluster_timezone", "is_rolling", "period_bounds", "rolling_days"]

DAY_SECONDS = 86400.0


def cluster_timezone(name: str) -> dt.tzinfo | None:
    """The tzinfo for [controller].timezone: an IANA name; None ("") is the host's zone.

    None rather than a fixed offset: naive local datetimes follow the host's daylight-saving
    rules (mktime), a fixed offset would not.

    Raises:
        zoneinfo.ZoneInfoNotFoundError: unknown name (the config check reports it first).
    """
    return zoneinfo.ZoneInfo(name) if name else None


def rolling_days(period: str) -> int | None:
    """N for a rolling "<N>d" period; None for "week" and "month"."""
    if period.endswith("d") and period[:-1].isdigit():
        return int(period[:-1])
    return None


def is_rolling(period: str) -> bool:
    """True for "<N>d" periods, which move with now and never end."""
    return rolling_days(period) is not None


def period_bounds(now: float, period: str, tz: dt.tzinfo | None) -> tuple[float, float]:
    """The [start, end) of the quota period holding `now`, in POSIX seconds.

    Args:
        now: the moment, POSIX seconds.
        period: "week", "month" or "<N>d".
        tz: the cluster's time zone (calendar periods start at its local midnight);
            None is the host's local time.

    Returns:
        (period_start, period_end); for "<N>d" that is (now - N days, now).

    Raises:
        ValueError: `period` is none of the forms above.
    """
    days = rolling_days(period)
    if days is not None:
        return now - days * DAY_SECONDS, now
    local = dt.datetime.fromtimestamp(now, tz)
    if period == "month":
        start = dt.datetime(local.year, local.month, 1, tzinfo=tz)
        year, month = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
        end = dt.datetime(year, month, 1, tzinfo=tz)
    elif period == "week":
        monday = local.date() - dt.timedelta(days=local.weekday())
        start = dt.datetime(monday.year, monday.month, monday.day, tzinfo=tz)
        following = monday + dt.timedelta(days=7)
        end = dt.datetime(following.year, following.month, following.day, tzinfo=tz)
    else:
        raise ValueError(f'unknown quota period {period!r}; expected "week", "month" or "<N>d"')
    return start.timestamp(), end.timestamp()
