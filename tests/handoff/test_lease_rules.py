"""The rules of a leased receive (``handoff.receive.leases``), one example each: when a lease holds a
hand-off, and the one conditional write that takes, renews or gives back a lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from common import transactions as tx
from common.clock import iso
from common.transactions import Refusal
from handoff.receive import leases
from handoff.storage.records import QueueRow

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
PK = "billing"


def queued(**changes: object) -> QueueRow:
    entry = QueueRow(event_id="ev-1", parked_message_id="park-1", lease_token="tok", claimed_until=iso(T0))
    entry = entry.model_copy(update={"row_key": "q|ev-1", "etag": '"q1"', **changes})
    return entry


def test_held_while_the_token_holds_an_unsettled_lease() -> None:
    assert leases.held(queued(), "tok")
    assert not leases.held(queued(), "another")
    assert not leases.held(None, "tok")
    assert not leases.held(queued(claimed_until=leases.UNCLAIMED), "tok")  # given back
    assert not leases.held(queued(claimed_until=leases.CLAIMED), "tok")  # settled
    assert not leases.held(queued(claimed_until="9999-12-31T23:59:59Z"), "tok")  # a mark however written
    assert leases.held(queued(claimed_until="2999-01-01T00:00:00Z"), "tok")


def test_plan_lease_takes_the_lease_if_match_the_queue_row_as_read() -> None:
    until = T0 + timedelta(seconds=30)

    op = leases.plan_lease(PK, queued(), "tok-2", until, "agent-7", T0)

    assert op == tx.merge(
        {
            "PartitionKey": PK,
            "RowKey": "q|ev-1",
            "ClaimedUntil": iso(until),
            "LeaseToken": "tok-2",
            "LeasedBy": "agent-7",
            "LeasedAt": T0,
        },
        '"q1"',
    )
    assert leases.plan_lease(PK, queued(), "tok-2", until, None, T0)[1]["LeasedBy"] == ""


def test_plan_give_back_unclaims_the_hand_off_if_match_the_queue_row_as_read() -> None:
    op = leases.plan_give_back(PK, queued())

    assert op == tx.merge({"PartitionKey": PK, "RowKey": "q|ev-1", "ClaimedUntil": leases.UNCLAIMED}, '"q1"')


def test_a_lease_write_is_lost_only_when_the_queue_row_changed_or_left() -> None:
    assert leases.lost(Refusal(index=0, status=412, code=""))
    assert leases.lost(Refusal(index=0, status=404, code="ResourceNotFound"))
    assert not leases.lost(Refusal(index=0, status=409, code=""))
    assert not leases.lost(None)


def test_unclaimed_sorts_before_every_time_and_claimed_after() -> None:
    assert leases.UNCLAIMED < iso(datetime(1, 1, 1, tzinfo=UTC)) < leases.CLAIMED
    assert iso(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)) < leases.CLAIMED


def test_a_lease_is_written_only_from_a_queue_row_as_read() -> None:
    import pytest

    for unread in (queued(etag=None), queued(row_key=None)):
        with pytest.raises(AssertionError):
            leases.plan_lease(PK, unread, "tok", T0, None, T0)
        with pytest.raises(AssertionError):
            leases.plan_give_back(PK, unread)
