"""Who may take a record's lock and what a refused caller is told (``state.model``), one example per rule:
``lock_decision``, ``held_reason``, ``retry_after_seconds``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from common.clock import iso
from state.model import LockDecision, Status, held_reason, lock_decision, retry_after_seconds

NOW = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize("status", [Status.NONE, Status.FAILED, Status.EXPIRED])
def test_lock_decision_acquires_a_record_that_is_free(status: Status) -> None:
    decision = lock_decision(status, None, NOW)

    assert decision.acquire and not decision.takeover and decision.reason is None


@pytest.mark.parametrize("status", [Status.PROCESSED, Status.SKIPPED])
def test_lock_decision_refuses_a_finished_record_saying_so(status: Status) -> None:
    decision = lock_decision(status, None, NOW)

    assert not decision.acquire and not decision.takeover
    assert decision.reason == f"The item is already {status.label}."


@pytest.mark.parametrize("status", [Status.PROCESSED, Status.SKIPPED])
def test_lock_decision_acquires_a_finished_record_past_its_retention(status: Status) -> None:
    decision = lock_decision(status, None, NOW, retention_expired=True)

    assert decision.acquire and not decision.takeover


def test_lock_decision_takes_over_an_expired_lock() -> None:
    assert lock_decision(Status.PROCESSING, NOW, NOW).takeover  # expired at this very instant
    decision = lock_decision(Status.PROCESSING, NOW - timedelta(seconds=1), NOW)

    assert decision.acquire and decision.takeover and decision.reason is None


def test_lock_decision_refuses_a_held_lock_with_the_held_reason() -> None:
    until = NOW + timedelta(seconds=30)
    decision = lock_decision(Status.PROCESSING, until, NOW)

    assert not decision.acquire and not decision.takeover
    assert decision.reason == held_reason(until)


def test_lock_decision_refuses_a_lock_whose_expiry_is_unknown() -> None:
    decision = lock_decision(Status.PROCESSING, None, NOW)

    assert not decision.acquire
    assert decision.reason == "Another caller holds the lock (until unknown)."


def test_lock_decision_refuses_a_superseded_version() -> None:
    decision = lock_decision(Status.SUPERSEDED, None, NOW)

    assert not decision.acquire and decision.reason == f"The record is {Status.SUPERSEDED.label}."


def test_held_reason_says_until_when_and_what_happens_after() -> None:
    until = NOW + timedelta(minutes=5)
    reason = held_reason(until)

    assert reason.startswith(f"Another caller holds the lock until {iso(until)}.")
    assert f"after {iso(until)} the lock will be taken over" in reason
    assert "takeover: true" in reason and reason.endswith("Retry after Retry-After.")


@pytest.mark.parametrize(
    ("left", "seconds"),
    [
        (timedelta(seconds=30), 31),  # whole seconds, plus one for the storage clock's margin
        (timedelta(seconds=29, milliseconds=1), 31),  # rounded up
        (timedelta(milliseconds=1), 2),
        (timedelta(0), 1),
        (timedelta(seconds=-5), 1),  # never less than one second
    ],
)
def test_retry_after_seconds_rounds_up_and_adds_the_clock_margin(left: timedelta, seconds: int) -> None:
    assert retry_after_seconds(NOW + left, NOW) == seconds


def test_a_lock_decision_is_acquire_takeover_and_a_reason() -> None:
    assert lock_decision(Status.NONE, None, NOW) == LockDecision(acquire=True, takeover=False, reason=None)
    assert LockDecision(acquire=False).reason is None and not LockDecision(acquire=False).takeover
