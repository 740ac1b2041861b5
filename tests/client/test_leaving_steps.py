"""Leaving a processing block, as the steps both clients take (``processing.leaving``): no server, no I/O.

Each step is a call to send, a release to send (shielded by the async client) or seconds to sleep; the
test plays the client, answering each call or failing it with a typed error.
"""

from __future__ import annotations

import time

import pytest
from settle_client import RetryPolicy
from settle_client._calls import Call, Requests
from settle_client.errors import InvalidInput, LockLost, SettleError, Unavailable
from settle_client.models import Key, LockResult, Record
from settle_client.processing import Item, Release, Steps, leaving

KEY = Key.of({"tenantId": 1, "scopeId": 4, "entityId": 1, "itemEntityKey": "invoice", "itemKey": "INV-1"})
REQUESTS = Requests(prefix="api", handler=None)
RECORD = Record.model_validate(
    {
        "tenantId": 1,
        "scopeId": 4,
        "scope": "Element",
        "entityId": 1,
        "itemKey": "INV-1",
        "itemEntityKey": "invoice",
        "status": "Processed",
        "statusCode": 1,
        "version": 2,
    }
)


def entered(lock_seconds: int = 60) -> Item:
    lock = LockResult(acquired=True, lock_token="token-1", status="Processing")
    return Item(KEY, lock, expires_at=time.monotonic() + lock_seconds)


def steps_of(item: Item, exc: BaseException | None = None) -> Steps:
    return leaving(REQUESTS, item, exc, lock_seconds=60, policy=RetryPolicy(), lost_note="lost")


def test_a_normal_end_records_the_outcome_in_one_fenced_set() -> None:
    item = entered()
    item.data = {"posted": True}
    steps = steps_of(item)

    call = steps.next()
    assert isinstance(call, Call) and call.path == "/api/v1/state/set"
    assert call.body["lockToken"] == "token-1" and call.body["data"] == {"posted": True}
    steps.answered(RECORD)

    assert steps.next() is None
    assert item.record == RECORD


def test_while_settle_is_unavailable_the_outcome_waits_then_is_sent_again() -> None:
    item = entered()
    steps = steps_of(item)
    first = steps.next()
    steps.failed(Unavailable("storage is down", status=503))

    wait = steps.next()
    assert isinstance(wait, float) and wait > 0
    again = steps.next()  # no extension due yet: a third of the lock has not passed
    assert again == first
    steps.answered(RECORD)
    assert steps.next() is None and item.record == RECORD


def test_an_outcome_settle_refuses_is_released_and_raised_with_a_failed_release_noted() -> None:
    steps = steps_of(entered())
    steps.next()
    refused = InvalidInput("data: too deep", field="data")
    steps.failed(refused)

    release = steps.next()
    assert isinstance(release, Release) and release.call.path == "/api/v1/state/release"
    steps.failed(SettleError("no answer"))
    with pytest.raises(InvalidInput) as raised:
        steps.next()
    assert raised.value is refused
    assert raised.value.__notes__ == ["settle-client: releasing the lock failed: no answer"]


def test_an_exception_releases_the_lock_with_its_text_unless_the_lock_was_lost() -> None:
    steps = steps_of(entered(), ValueError("boom"))
    release = steps.next()
    assert isinstance(release, Release) and release.call.body["error"] == "ValueError: boom"
    steps.answered(None)
    assert steps.next() is None

    item = entered()
    item.lose(LockLost("lost", status=409))
    exc = ValueError("boom")
    steps = steps_of(item, exc)
    assert steps.next() is None
    assert exc.__notes__ == ["lost"]
