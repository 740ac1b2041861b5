"""Counting storage round trips: an azure-core policy that every Table client carries.

The counter is per thread, so a test or the benchmark can measure one operation while other threads
run. ``RoundTrips.measure()`` yields a tally of the requests sent inside the block (retries included,
since the policy sits per retry).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy


@dataclass(eq=False)  # nested measures hold equal tallies: each is removed by identity
class Tally:
    methods: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.methods)


class RoundTrips(SansIOHTTPPolicy[Any, Any]):
    """Counts HTTP requests per thread while a ``measure()`` block is open on that thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def on_request(self, request: Any) -> None:
        for tally in getattr(self._local, "tallies", ()):
            tally.methods.append(request.http_request.method)

    @contextmanager
    def measure(self) -> Iterator[Tally]:
        tally = Tally()
        if not hasattr(self._local, "tallies"):
            self._local.tallies = []
        self._local.tallies.append(tally)
        try:
            yield tally
        finally:
            self._local.tallies.remove(tally)

    def open_tallies(self) -> list[Tally]:
        """The measures open on this thread (hand them to a worker thread with :meth:`adopt`)."""
        return list(getattr(self._local, "tallies", ()))

    def adopt(self, tallies: list[Tally]) -> None:
        """Count this thread's requests in ``tallies`` too (work an operation fans out to threads)."""
        self._local.tallies = list(tallies)


ROUND_TRIPS = RoundTrips()
