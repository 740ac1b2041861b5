"""The one clock Settle judges time by: the storage service's.

Every Function instance has its own clock; locks are shared between instances, so their expiry must be
judged against one clock. Settle uses the Table service's clock, learned from the ``Date`` header of
every storage response (an azure-core policy feeds :class:`ServerClock`), so it needs no extra round trip.

Each response bounds the offset (server minus local clock): the header says the server's second ``D``
(truncated), sent between our send time ``s`` and receive time ``r``, so the offset lies in
``[D - r, D + 1 - s]``. The clock keeps the intersection of the bounds of recent samples (they land at
different phases of the second, so it narrows quickly to about one round trip). Its estimate starts at the
first interval's middle and then moves only as far as a narrower interval forces it (onto its nearest
bound). A narrower interval can still force it back a little (its upper bound fell below the estimate), so
the readings of :meth:`ServerClock.now` are kept from stepping back while the samples agree: a reading below
the last one is the last one, until time catches up (by how far it was pulled back: at most the interval's
width). A lock extended twice by the same length never ends earlier the second time. The safety bounds
(:func:`earliest_now`, :func:`latest_now`) come from the interval itself, never from a held reading. When
samples disagree (a clock stepped) the estimate restarts and readings follow it. Samples older than a minute
are dropped so that drift is followed. Skew bound between two instances that talk to storage: about one
round trip plus the remaining width of their intervals; before any response has arrived, the local UTC clock
is used.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy

_WINDOW_S = 60.0
# Before any storage response, how far the local clock is trusted to be from the storage clock (NTP-synced
# hosts are within a second; the first storage request of a process replaces this with a measurement).
UNSAMPLED_UNCERTAINTY_S = 5.0
_MAX_SAMPLES = 64
_SENT = "settle_clock_sent"


class ServerClock:
    """Estimates the storage service's UTC time from response ``Date`` headers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=_MAX_SAMPLES)  # (lo, hi, at)
        self._offset_s = 0.0
        self._lo = float("-inf")  # the offset lies in [_lo, _hi]
        self._hi = float("inf")
        self.width_s = float("inf")  # how uncertain the current offset is (_hi - _lo)
        self._last_reading = float("-inf")  # the latest now() handed out since the estimate (re)started

    def observe(self, server_second: float, *, sent_at: float, received_at: float) -> None:
        """One response: the server's ``Date`` (whole seconds, epoch) seen between two local times."""
        low = server_second - received_at
        high = server_second + 1.0 - sent_at
        with self._lock:
            self._samples.append((low, high, received_at))
            while self._samples and received_at - self._samples[0][2] > _WINDOW_S:
                self._samples.popleft()
            lo = max(sample[0] for sample in self._samples)
            hi = min(sample[1] for sample in self._samples)
            restart = lo > hi or self.width_s == float("inf")
            if lo > hi:  # the clocks moved (drift, a step): start again from this sample
                self._samples.clear()
                self._samples.append((low, high, received_at))
                lo, hi = low, high
                self._last_reading = float("-inf")  # readings follow the new estimate, even back
            # the first interval (or a restart): its middle; then only as far as the interval forces
            self._offset_s = (lo + hi) / 2 if restart else min(max(self._offset_s, lo), hi)
            self._lo, self._hi = lo, hi
            self.width_s = hi - lo

    @property
    def offset_s(self) -> float:
        return self._offset_s

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._reading(time.time()), tz=UTC)

    def _reading(self, local: float) -> float:
        """The estimate at local time ``local``, never below a reading already handed out (see above)."""
        reading = local + self._offset_s
        with self._lock:
            if reading < self._last_reading:
                return self._last_reading
            self._last_reading = reading
            return reading

    def earliest(self) -> datetime:
        """The earliest the storage clock may read now: the interval's lower bound (see :meth:`bounds_s`)."""
        below, _ = self.bounds_s()
        return datetime.fromtimestamp(time.time() + self._offset_s - below, tz=UTC)

    def latest(self) -> datetime:
        """The latest the storage clock may read now: the interval's upper bound, or a held reading above
        it (so a lock ending at a reading is never judged still valid past it)."""
        local = time.time()
        _, above = self.bounds_s()
        return datetime.fromtimestamp(max(local + self._offset_s + above, self._reading(local)), tz=UTC)

    def bounds_s(self) -> tuple[float, float]:
        """How far below and above the estimate (:attr:`offset_s`) the storage clock may read (the offset
        interval around it; ``UNSAMPLED_UNCERTAINTY_S`` either way before any response)."""
        if self.width_s == float("inf"):
            return UNSAMPLED_UNCERTAINTY_S, UNSAMPLED_UNCERTAINTY_S
        return max(self._offset_s - self._lo, 0.0), max(self._hi - self._offset_s, 0.0)

    def uncertainty_s(self) -> float:
        """How far :meth:`now` may be from the storage clock: the distance from the estimate to the farther
        bound of the offset interval (about 0.5 s after one response, a round trip once samples at
        different phases of the second narrowed it), or ``UNSAMPLED_UNCERTAINTY_S`` before any response
        (the local clock is all there is)."""
        if self.width_s == float("inf"):
            return UNSAMPLED_UNCERTAINTY_S
        return max(self._offset_s - self._lo, self._hi - self._offset_s, 0.0)


class ServerClockPolicy(SansIOHTTPPolicy[Any, Any]):
    """azure-core policy that feeds each response's ``Date`` header to a :class:`ServerClock`."""

    def __init__(self, clock: ServerClock) -> None:
        self._clock = clock

    def on_request(self, request: Any) -> None:
        request.context[_SENT] = time.time()

    def on_response(self, request: Any, response: Any) -> None:
        received = time.time()
        header = response.http_response.headers.get("Date")
        sent = request.context.get(_SENT)
        if not header or sent is None:
            return
        try:
            server = parsedate_to_datetime(header).timestamp()
        except (TypeError, ValueError):
            return
        self._clock.observe(server, sent_at=sent, received_at=received)


SERVER_CLOCK = ServerClock()


def utcnow() -> datetime:
    """Now, by the storage service's clock (see module docstring)."""
    return SERVER_CLOCK.now()


def earliest_now() -> datetime:
    """The earliest the storage clock may read now: judge "has it expired?" by this before acting on
    someone else's expiry (a takeover, catch-up failing a lock), so an uncertain estimate waits instead."""
    return SERVER_CLOCK.earliest()


def latest_now() -> datetime:
    """The latest the storage clock may read now: judge "is my lock still valid?" by this (the fence), so
    an uncertain estimate stops writing before the lock may have ended."""
    return SERVER_CLOCK.latest()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(value: datetime) -> int:
    """Milliseconds since the epoch (integer arithmetic: exact, no float rounding)."""
    delta = value.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def from_epoch_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def to_ms(value: datetime) -> datetime:
    """``value`` truncated to the millisecond (what Settle stores, and what tokens and index keys carry)."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


# What Table Storage's DateTime holds (``reference/idempotency-anchors.md`` §4.1: UTC, from 1601-01-01),
# up to the last instant a datetime holds.
STORABLE_FROM = datetime(1601, 1, 1, tzinfo=UTC)
STORABLE_UNTIL = datetime.max.replace(tzinfo=UTC)


def storable_utc(value: datetime) -> datetime | None:
    """``value`` in UTC (naive = UTC) within what Table Storage holds: past the end (year 9999 with a
    negative offset is year 10000 in UTC) it is the last instant; before 1601 it is None. Never raises."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # beyond year 1 or 9999 once in UTC
        return STORABLE_UNTIL if value.year > 1 else None
    return utc if utc >= STORABLE_FROM else None


def iso(value: datetime) -> str:
    """ISO-8601 UTC with a ``Z``, millisecond precision."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
