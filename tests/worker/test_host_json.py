"""host.json: the values the host reads, their relations, and the reasons docs/host-json.md gives for them.

Given the host settings as committed, then an invocation can never outlive its Service Bus lock renewal,
a session is released while a receive is still inside its try timeout, and every value the relations
rely on is the one the document explains.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOST = json.loads((ROOT / "host.json").read_text(encoding="utf-8"))
BUS = HOST["extensions"]["serviceBus"]


def span(text: str) -> timedelta:
    """A host.json TimeSpan (``[d.]hh:mm:ss[.fff]``)."""
    match = re.fullmatch(r"(?:(\d+)\.)?(\d{2}):(\d{2}):(\d{2}(?:\.\d+)?)", text)
    assert match, f"not a TimeSpan: {text!r}"
    days, hours, minutes, seconds = match.groups()
    return timedelta(days=int(days or 0), hours=int(hours), minutes=int(minutes), seconds=float(seconds))


def test_an_invocation_never_outlives_its_lock_renewal() -> None:
    # A resolver invocation that ran past maxAutoLockRenewalDuration would lose its session lock: the broker
    # hands the session (and the next message of the event) to another instance while this one still writes.
    assert span(HOST["functionTimeout"]) <= span(BUS["maxAutoLockRenewalDuration"])


def test_a_session_is_released_within_a_receive_s_try_timeout() -> None:
    assert span(BUS["sessionIdleTimeout"]) < span(BUS["clientRetryOptions"]["tryTimeout"])


def test_an_idle_session_holds_its_slot_briefly() -> None:
    # Every event is its own session and most sessions bring one message at a time: each of the
    # maxConcurrentSessions slots waits sessionIdleTimeout after its last message before it takes another
    # session. At 1 s an instance turns over 16 sessions a second even when every session is idle.
    turnover = BUS["maxConcurrentSessions"] / span(BUS["sessionIdleTimeout"]).total_seconds()
    assert turnover >= 16


def test_the_document_explains_every_value_it_relies_on() -> None:
    doc = (ROOT / "docs" / "host-json.md").read_text(encoding="utf-8")
    for value in (
        f'"functionTimeout": "{HOST["functionTimeout"]}"',
        f'"maxAutoLockRenewalDuration": "{BUS["maxAutoLockRenewalDuration"]}"',
        f'"sessionIdleTimeout": "{BUS["sessionIdleTimeout"]}"',
        f'"maxConcurrentSessions": {BUS["maxConcurrentSessions"]}',
        f'"tryTimeout": "{BUS["clientRetryOptions"]["tryTimeout"]}"',
    ):
        assert value in doc, value
