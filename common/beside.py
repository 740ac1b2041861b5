"""Beside: one request sent on a thread of its own while the caller sends others (a cold instance's first call
is shorter for it).

A cold instance's first lock reads the signing key and prepares its expiry minute; its first message
registers the endpoint and reads the event. Neither pair depends on the other's answer, only on both being
done before the write that needs them, so the first of each pair runs here while the caller sends the
second, and the caller waits for it (:meth:`Beside.result`) right before that write. Nothing is sent
after the caller has answered: an invocation never leaves work behind.

The thread carries the caller's context (its telemetry span) and its open round-trip tallies, so a
request made here is traced and counted as the operation's own.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from common.roundtrips import ROUND_TRIPS


class Beside[T]:
    """``fn()`` started now on a thread of its own; :meth:`result` waits for it."""

    def __init__(self, fn: Callable[[], T], *, name: str) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        tallies = ROUND_TRIPS.open_tallies()
        context = contextvars.copy_context()

        def run() -> None:
            ROUND_TRIPS.adopt(tallies)
            try:
                self._value = context.run(fn)
            except BaseException as exc:  # handed to the caller by result()
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Wait for ``fn`` to end, whatever it did (the caller is raising something of its own)."""
        self._thread.join()

    def result(self) -> T:
        """What ``fn`` returned, once it has; what it raised is raised here, on the caller's thread."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def side_by_side[A, T](fn: Callable[[A], T], items: Sequence[A], *, workers: int, name: str) -> list[T]:
    """``fn`` of each item, at most ``workers`` at once, in the items' order: point reads a listing makes
    of the rows it found, each counted and traced as the caller's own (as :class:`Beside`)."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    tallies = ROUND_TRIPS.open_tallies()
    context = contextvars.copy_context()

    def run(item: A) -> T:
        ROUND_TRIPS.adopt(tallies)
        return context.copy().run(fn, item)

    with ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix=name) as pool:
        return list(pool.map(run, items))
