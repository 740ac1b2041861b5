"""What one invocation may spend on storage, and what it did there: its deadline and its writes.

An HTTP function answers within :data:`HTTP_DEADLINE_S` (20 s; the app setting
``SETTLE_HTTP_DEADLINE_SECONDS`` changes it) however long storage takes to answer, well inside the 230 s
after which Azure's front end gives up on an HTTP request. Without a deadline a paused storage held a call
for 4 x 30 s (the SDK's attempts, each waiting out its read timeout) and answered nothing. The resolver
gives up after :data:`RESOLVER_DEADLINE_S` (it raises, so Service Bus delivers the message again), a timer
after :data:`TIMER_DEADLINE_S` (it ends; its next run goes on), both inside host.json's ``functionTimeout``.

How it is kept (``common.table_retry.SettleRetryPolicy``): every storage request of the invocation, its
retries and back-off included, gets the time that is left as its total, and each attempt's connection and
read timeouts are cut to it; once it is spent no request is sent, the call fails as a timeout, and the
HTTP layer answers 503 problem+json with ``Retry-After`` (:func:`common.http.within_deadline`).

A long poll (``handoff.receive.receiver.long_poll``) has its wait added to its deadline.

What it did: each write request sent (a per-attempt policy on the table clients,
``common.tables.WriteWatch``) counts as *maybe applied* unless storage answered with a refusal that
proves it was not (a 4xx, 503 ``ServerBusy``). A 503 after such a write says that its outcome is unknown
(``outcome: "unknown"``), as a settlement answers ``confirmed: false``: the caller's retry (same
``requestId``, same ``lockToken``) is answered from what was written.

Threads started for the invocation (``common.beside``, catch-up's workers) copy its context, so they
share its budget. Code outside an invocation (the benchmark, scripts) has no deadline.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from common.settings import env

HTTP_DEADLINE_S = 20.0
HTTP_DEADLINE_SETTING = "SETTLE_HTTP_DEADLINE_SECONDS"
RESOLVER_DEADLINE_S = 60.0
TIMER_DEADLINE_S = 240.0  # host.json functionTimeout is 5 minutes

# The clock deadlines are kept by (monotonic seconds); tests put a clock of their own here.
clock: Callable[[], float] = time.monotonic


class Budget:
    """One invocation's deadline (monotonic seconds) and its write tally."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends = clock() + seconds
        self._lock = threading.Lock()
        self._writes_sent = 0
        self._writes_refused = 0

    def remaining(self) -> float:
        return max(0.0, self.ends - clock())

    def extend(self, seconds: float) -> None:
        """Push the deadline out by ``seconds``: a long poll's wait comes on top of its storage time."""
        self.seconds += seconds
        self.ends += seconds

    def sent_write(self) -> None:
        with self._lock:
            self._writes_sent += 1

    def refused_write(self) -> None:
        with self._lock:
            self._writes_refused += 1

    @property
    def maybe_written(self) -> bool:
        """A write was sent that storage may have applied (answered, or no answer that says it was not)."""
        with self._lock:
            return self._writes_sent > self._writes_refused


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("settle_budget", default=None)


def http_deadline() -> float:
    """The HTTP deadline in seconds: ``SETTLE_HTTP_DEADLINE_SECONDS`` or :data:`HTTP_DEADLINE_S`."""
    text = env(HTTP_DEADLINE_SETTING)
    try:
        value = float(text) if text is not None else HTTP_DEADLINE_S
    except ValueError:
        value = HTTP_DEADLINE_S
    return value if value > 0 else HTTP_DEADLINE_S


@contextmanager
def within(seconds: float) -> Iterator[Budget]:
    """Run the block as one invocation that must be done within ``seconds`` (an enclosing invocation's
    earlier end wins)."""
    outer = _CURRENT.get()
    budget = Budget(seconds if outer is None else min(seconds, outer.remaining()))
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


def current() -> Budget | None:
    """The running invocation's budget, if any."""
    return _CURRENT.get()


def remaining() -> float | None:
    """Seconds left of the running invocation's deadline; None outside an invocation."""
    budget = _CURRENT.get()
    return None if budget is None else budget.remaining()
