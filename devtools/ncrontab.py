"""NCRONTAB: the six-field cron of Azure Functions timers (second minute hour day month day-of-week).

The development host schedules timers with it, and the infra checks parse the deployed schedules with it.
"""

from __future__ import annotations

import calendar
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = {name: i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: i for i, name in enumerate(["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"])}


_MONTHS = {name: i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: i for i, name in enumerate(["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"])}


def _field_values(text: str, low: int, high: int, names: Mapping[str, int]) -> frozenset[int]:
    values: set[int] = set()

    def number(token: str) -> int:
        for name, value in names.items():
            if token.lower() == name.lower():
                return value
        if not token.isdigit():
            raise ValueError(f"not a number: {token!r}")
        return int(token)

    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/", 1)
            step = int(step_text)
            if step < 1:
                raise ValueError("step must be >= 1")
        if part == "*":
            start, end = low, high
        elif "-" in part:
            first, last = part.split("-", 1)
            start, end = number(first), number(last)
        else:
            start = number(part)
            end = high if step > 1 else start
        if high == 6 and end == 7:  # Sunday written as 7
            end = 6 if start != 7 else 0
            start = 0 if start == 7 else start
        if not (low <= start <= high and low <= end <= high) or start > end:
            raise ValueError(f"{part!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Schedule:
    """A parsed NCRONTAB expression; ``next_after`` gives the next occurrence (UTC, whole seconds)."""

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday

    @classmethod
    def parse(cls, expression: str) -> Schedule:
        fields = expression.split()
        if len(fields) != 6:
            raise ValueError(
                f"NCRONTAB needs six fields (second minute hour day month day-of-week); got {expression!r}"
            )
        second, minute, hour, day, month, weekday = fields
        return cls(
            expression=expression,
            seconds=_field_values(second, 0, 59, {}),
            minutes=_field_values(minute, 0, 59, {}),
            hours=_field_values(hour, 0, 23, {}),
            days=_field_values(day, 1, 31, {}),
            months=_field_values(month, 1, 12, _MONTHS),
            weekdays=_field_values(weekday, 0, 6, _DAYS),
        )

    def _day_matches(self, moment: datetime) -> bool:
        # NCrontab (the library the Functions host uses) requires both day fields to match.
        weekday = (moment.weekday() + 1) % 7
        return moment.day in self.days and moment.month in self.months and weekday in self.weekdays

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment``."""
        candidate = moment.astimezone(UTC).replace(microsecond=0) + timedelta(seconds=1)
        limit = candidate + timedelta(days=366 * 5)
        while candidate < limit:
            if not self._day_matches(candidate):
                candidate = candidate.replace(hour=0, minute=0, second=0) + timedelta(days=1)
                continue
            if candidate.hour not in self.hours:
                candidate = candidate.replace(minute=0, second=0) + timedelta(hours=1)
                continue
            if candidate.minute not in self.minutes:
                candidate = candidate.replace(second=0) + timedelta(minutes=1)
                continue
            if candidate.second not in self.seconds:
                candidate += timedelta(seconds=1)
                continue
            return candidate
        raise ValueError(f"{self.expression!r} never fires")
