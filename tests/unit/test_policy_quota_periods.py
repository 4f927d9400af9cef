"""slurm_gpu.policy.quota_periods: the [start, end) a quota counts, in the cluster's time."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from slurm_gpu.policy.quota_periods import (
    cluster_timezone,
    is_rolling,
    period_bounds,
    rolling_days,
)

UTC = zoneinfo.ZoneInfo("UTC")
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def ts(text: str, tz: dt.tzinfo = UTC) -> float:
    """POSIX seconds of a local wall-clock time "YYYY-MM-DD HH:MM" in `tz`."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=tz).timestamp()


def test_month_in_utc() -> None:
    """Mid-June: from June 1st 00:00 to July 1st 00:00."""
    expected = (ts("2024-06-01 00:00"), ts("2024-07-01 00:00"))
    assert expected == period_bounds(ts("2024-06-15 12:34"), "month", UTC)


def test_month_starts_at_local_midnight() -> None:
    """In Berlin (UTC+2 in summer) June starts at May 31st 22:00 UTC."""
    expected = (ts("2024-05-31 22:00"), ts("2024-06-30 22:00"))
    assert expected == period_bounds(ts("2024-05-31 23:30"), "month", BERLIN)


def test_december_rolls_into_next_year() -> None:
    """December's period ends on January 1st of the next year."""
    expected = (ts("2024-12-01 00:00"), ts("2025-01-01 00:00"))
    assert expected == period_bounds(ts("2024-12-31 23:59"), "month", UTC)


def test_month_with_dst_change_is_an_hour_short() -> None:
    """March 2024 in Berlin has 31 days minus the hour lost to summer time."""
    start, end = period_bounds(ts("2024-03-15 12:00", BERLIN), "month", BERLIN)
    expected = 31 * 86400 - 3600
    assert expected == end - start


def test_week_is_monday_to_monday() -> None:
    """Saturday June 1st 2024 is in the ISO week from Monday May 27th to Monday June 3rd."""
    expected = (ts("2024-05-27 00:00"), ts("2024-06-03 00:00"))
    assert expected == period_bounds(ts("2024-06-01 10:00"), "week", UTC)


def test_monday_midnight_starts_a_new_week() -> None:
    """The start is inclusive: Monday 00:00 belongs to the week it starts."""
    expected = (ts("2024-06-03 00:00"), ts("2024-06-10 00:00"))
    assert expected == period_bounds(ts("2024-06-03 00:00"), "week", UTC)


def test_rolling_window_ends_now() -> None:
    """A period of "30d" is the last 30 x 86400 seconds up to now."""
    now = ts("2024-06-01 10:00")
    expected = (now - 30 * 86400, now)
    assert expected == period_bounds(now, "30d", UTC)


def test_rolling_days_parses_only_nd() -> None:
    """rolling_days gives N for "<N>d" and None for calendar periods."""
    expected = [7, 30, None, None]
    assert expected == [rolling_days(p) for p in ("7d", "30d", "week", "month")]


def test_is_rolling() -> None:
    """Only "<N>d" periods are rolling."""
    expected = [True, False]
    assert expected == [is_rolling("90d"), is_rolling("month")]


def test_unknown_period_raises() -> None:
    """A period the config check would reject raises ValueError."""
    with pytest.raises(ValueError, match="unknown quota period"):
        period_bounds(0.0, "fortnight", UTC)


def test_cluster_timezone() -> None:
    """An IANA name gives that zone; "" gives None (the host's local time)."""
    expected = [BERLIN, None]
    assert expected == [cluster_timezone("Europe/Berlin"), cluster_timezone("")]
