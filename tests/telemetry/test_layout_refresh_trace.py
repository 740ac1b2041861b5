"""The recorded layouts' re-read on a thread of its own stays in the trace of the call that prompted it.

A long-lived instance re-reads the layouts beside a call once its copy is older than the refresh interval.
That read ran with no context of its own, so its Table spans started traces of their own, outside the
invocation (the worker conformance suite saw them in a whole-suite run: two storage traces beside the
host's).
"""

from __future__ import annotations

import threading
import time

import pytest

from common import runtime, telemetry
from common.layouts import STATE, LayoutBook
from tests.telemetry.conftest import Recorded

pytestmark = pytest.mark.usefixtures("settle_tables")


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _refreshes_running() -> bool:
    return any(t.name == "settle-layout-refresh" for t in threading.enumerate())


def test_a_refresh_beside_a_call_is_a_child_of_that_calls_span(otel: Recorded, fresh_tables: str) -> None:
    clock = _Clock()
    book = LayoutBook(runtime.tables(), clock=clock)
    configured = lambda: [(1, 1)]  # noqa: E731
    row = book.recorded(STATE, configured)  # the first read, on the caller's thread
    clock.now += row.refresh_s * 1.5  # old enough to refresh beside the next call, not to block it

    with telemetry.span("test.caller"):
        book.recorded(STATE, configured)
    deadline = time.monotonic() + 10
    while (_refreshes_running() or not otel.spans("settle.layout.refresh")) and time.monotonic() < deadline:
        time.sleep(0.01)

    caller = otel.span("test.caller")
    refresh = otel.span("settle.layout.refresh")
    assert refresh.parent is not None and refresh.parent.span_id == caller.context.span_id
    since = caller.start_time or 0
    later = [s for s in otel.spans() if (s.start_time or 0) >= since]
    storage = [s for s in later if not s.name.startswith(("test.", "settle."))]
    assert storage, "the refresh sent no storage request"
    outside = [s.name for s in storage if s.context.trace_id != caller.context.trace_id]
    assert not outside, f"spans of the refresh outside the caller's trace: {outside}"
