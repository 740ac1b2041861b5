"""The one clock Settle judges time by: the storage service's.

Every Function instance has its own clock; locks are shared between instances, so their expiry must be
judged against one clock. Settle uses the Table service's clock, learned from the ``Date`` header of
every storage response (an azure-core policy feeds :class:`ServerClock`). ``now()`` is the local
monotonic clock plus the last measured offset, so it needs no extra round trip.

Skew bound: the ``Date`` header has one-second resolution and arrives half a round trip late, so two
instances that both talked to storage in the last minute agree within about 1 s + RTT/2. Until the first
response arrives the local UTC clock is used (offset 0).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy

# Offsets older than this are not trusted to have tracked drift; they are still used (better than 0).
_MAX_SAMPLE_AGE_S = 60.0


class ServerClock:
    """Estimates the storage service's UTC time from response ``Date`` headers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset_s = 0.0  # server minus local wall clock
        self._sampled_at = 0.0
        self._samples = 0

    def observe(self, server_date: datetime, *, received_at: float | None = None) -> None:
        local = received_at if received_at is not None else time.time()
        # The header is truncated to whole seconds: on average the true time is 0.5 s later.
        offset = server_date.timestamp() + 0.5 - local
        with self._lock:
            if self._samples == 0 or time.monotonic() - self._sampled_at > _MAX_SAMPLE_AGE_S:
                self._offset_s = offset
            else:
                # Smooth the 1 s quantisation noise without lagging real drift for long.
                self._offset_s = 0.8 * self._offset_s + 0.2 * offset
            self._sampled_at = time.monotonic()
            self._samples += 1

    @property
    def offset(self) -> timedelta:
        return timedelta(seconds=self._offset_s)

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + self._offset_s, tz=UTC)


class ServerClockPolicy(SansIOHTTPPolicy[Any, Any]):
    """azure-core policy that feeds each response's ``Date`` header to a :class:`ServerClock`."""

    def __init__(self, clock: ServerClock) -> None:
        self._clock = clock

    def on_response(self, request: Any, response: Any) -> None:
        header = response.http_response.headers.get("Date")
        if not header:
            return
        try:
            self._clock.observe(parsedate_to_datetime(header))
        except (TypeError, ValueError):
            return


SERVER_CLOCK = ServerClock()


def utcnow() -> datetime:
    """Now, by the storage service's clock (see module docstring)."""
    return SERVER_CLOCK.now()


def iso(value: datetime) -> str:
    """ISO-8601 UTC with a ``Z``, millisecond precision."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
