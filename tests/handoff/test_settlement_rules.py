"""The settlement's own rules, through the real ``SettlementService.settle`` on the in-memory table (no
storage, no broker): the coordinates must address the park, the ones left out come from the row, a claim
is sent only within the send deadline, and a send's outcome decides the claim's state."""

from __future__ import annotations

from datetime import timedelta

import pytest

from common.errors import Conflict, NotFound, PayloadTooLarge
from handoff.messages.contract import Coordinates, MessageType
from handoff.messages.transport import MAX_SEND_BYTES, SendRefused
from handoff.receive.leases import CLAIMED, LeaseLost
from handoff.settlement.claims import SettlementInFlight
from handoff.settlement.settler import Settlement
from handoff.settlement.timing import CONFIRM_AFTER, SEND_DEADLINE
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import QueueRow

from .claim_rows import EVENT, PARKED, PK, QUEUE_KEY, T0, parked
from .memory_table import MemoryTable
from .settling import Clock, Transport, claim_in, completion, hand_off, leased, settler, with_lease

# -- the coordinates ---------------------------------------------------------------------------------


def test_a_settlement_of_the_parked_message_is_sent_and_confirmed() -> None:
    table, transport = hand_off(), Transport()

    accepted = settler(table, transport).settle(completion())

    assert accepted.confirmed and accepted.state == ClaimState.sent.name and not accepted.replayed
    assert len(transport.sent) == 1 and transport.sent[0][0] == "Billing"
    claim = claim_in(table)
    assert claim is not None and claim.state is ClaimState.sent and claim.attempts == 1
    assert claim.last_sent_at == T0 and accepted.control_message_id == claim.control_message_id
    assert accepted.replayed is False and accepted.confirmed is True


def test_coordinates_that_name_another_session_are_refused() -> None:
    table, transport = hand_off(parked(etag=None).model_copy(update={"session_id": "s-1"})), Transport()

    with pytest.raises(Conflict) as refused:
        settler(table, transport).settle(completion(session_id="s-2"))

    assert refused.value.field == "coordinates.sessionId"
    assert str(refused.value) == "coordinates.sessionId does not match the parked event."
    assert transport.sent == [] and claim_in(table) is None


def test_an_empty_session_addresses_a_park_without_a_session() -> None:
    table, transport = hand_off(), Transport()

    assert settler(table, transport).settle(completion(session_id="")).confirmed


def test_coordinates_that_name_another_message_are_refused() -> None:
    table, transport = hand_off(), Transport()

    with pytest.raises(Conflict) as refused:
        settler(table, transport).settle(completion(message_id="an-older-park"))

    assert refused.value.field == "coordinates.messageId"
    assert str(refused.value) == (
        "coordinates.messageId does not address the parked message (a newer park replaced it?)."
    )
    assert transport.sent == [] and claim_in(table) is None


def test_the_request_the_adapter_parked_addresses_the_hand_off_too() -> None:
    row = parked(etag=None).model_copy(update={"parent_message_id": "m-request"})
    table, transport = hand_off(row), Transport()

    accepted = settler(table, transport).settle(completion(message_id="m-request"))

    assert accepted.confirmed and accepted.parked_message_id == PARKED  # the claim is keyed by the park


def test_coordinates_left_out_are_taken_from_the_row() -> None:
    row = parked(etag=None).model_copy(
        update={
            "session_id": "s-1",
            "event_type_id": "Billing.InvoiceCreated",
            "correlation_id": "corr-1",
            "originating_message_id": "m-origin",
        }
    )
    table, transport = hand_off(row), Transport()

    settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert claim is not None
    sent = claim.outbox_message()
    assert sent.session_id == "s-1" and sent.correlation_id == "corr-1"
    assert "Billing.InvoiceCreated" in sent.properties.values()
    assert "m-origin" in sent.properties.values()


def test_coordinates_the_caller_gives_are_kept() -> None:
    row = parked(etag=None).model_copy(update={"session_id": "s-1", "correlation_id": "corr-row"})
    table, transport = hand_off(row), Transport()

    settler(table, transport).settle(
        completion(session_id="s-1", correlation_id="corr-caller", event_type_id="Billing.Given")
    )

    claim = claim_in(table)
    assert claim is not None
    sent = claim.outbox_message()
    assert sent.correlation_id == "corr-caller" and "Billing.Given" in sent.properties.values()


def test_an_event_that_is_not_parked_is_refused() -> None:
    done = parked(etag=None).model_copy(update={"pending_sub_status": None})
    table, transport = hand_off(done), Transport()

    with pytest.raises(Conflict, match="not a pending hand-off"):
        settler(table, transport).settle(completion())
    assert transport.sent == []


def test_an_unknown_event_is_not_found() -> None:
    with pytest.raises(NotFound):
        settler(MemoryTable(), Transport()).settle(completion())


def test_a_result_larger_than_a_message_is_refused_before_any_write() -> None:
    table, transport = hand_off(), Transport()
    big = Settlement(
        kind=MessageType.HandoffCompletedRequest,
        endpoint_id="Billing",
        coordinates=Coordinates(event_id=EVENT, message_id=PARKED),
        settled_by="agent",
        result="x" * (MAX_SEND_BYTES + 1),
    )

    with pytest.raises(PayloadTooLarge):
        settler(table, transport).settle(big)
    assert claim_in(table) is None


# -- the claim -----------------------------------------------------------------------------------------


def test_the_same_settlement_again_is_answered_from_its_claim_without_a_second_send() -> None:
    table, transport = hand_off(), Transport()
    first = settler(table, transport).settle(completion())

    again = settler(table, transport).settle(completion())

    assert again.replayed and again.control_message_id == first.control_message_id
    assert len(transport.sent) == 1


def test_another_settlement_of_a_claimed_hand_off_is_in_flight() -> None:
    table, transport = hand_off(), Transport()
    settler(table, transport).settle(completion())

    other = Settlement(
        kind=MessageType.HandoffFailedRequest,
        endpoint_id="Billing",
        coordinates=Coordinates(event_id=EVENT, message_id=PARKED),
        settled_by="someone-else",
        error_text="no",
    )
    with pytest.raises(SettlementInFlight):
        settler(table, transport).settle(other)
    assert len(transport.sent) == 1


# -- the send deadline and the send's outcome ------------------------------------------------------------


def test_a_claim_older_than_the_send_deadline_is_not_sent_but_left_to_the_reconciler() -> None:
    table, transport = hand_off(), Transport()
    clock = Clock(later=SEND_DEADLINE + timedelta(milliseconds=1))

    accepted = settler(table, transport, clock).settle(completion())

    assert transport.sent == []
    assert not accepted.confirmed and accepted.state == ClaimState.sending.name
    claim = claim_in(table)
    assert claim is not None and claim.state is ClaimState.sending and claim.attempts == 0
    assert claim.last_sent_at is None and accepted.replayed is False and accepted.confirmed is False
    assert claim.claimed_at == T0 and claim.updated_at == T0  # as taken: nothing recorded it since
    assert first_look(table) == T0 + CONFIRM_AFTER and not claim.reconcile_key  # due after CONFIRM_AFTER


def test_a_claim_exactly_at_the_send_deadline_is_still_sent() -> None:
    table, transport = hand_off(), Transport()

    accepted = settler(table, transport, Clock(later=SEND_DEADLINE)).settle(completion())

    assert len(transport.sent) == 1 and accepted.confirmed


def test_a_refused_send_releases_the_claim_and_fails() -> None:
    table, transport = hand_off(), Transport(fail=SendRefused("nothing was sent (test)"))

    with pytest.raises(SendRefused):
        settler(table, transport).settle(completion())

    assert claim_in(table) is None  # a retry starts clean
    assert settler(table, Transport()).settle(completion()).confirmed


def test_a_send_with_an_unknown_outcome_keeps_the_claim_sending_for_the_reconciler() -> None:
    table, transport = hand_off(), Transport(fail=TimeoutError("the answer was lost (test)"))

    accepted = settler(table, transport).settle(completion())

    assert not accepted.confirmed and accepted.state == ClaimState.sending.name and not accepted.replayed
    claim = claim_in(table)
    assert claim is not None and claim.state is ClaimState.sending and claim.attempts == 1
    assert claim.last_sent_at is None and len(transport.sent) == 1
    # Due for the reconciler through its queue mark, which the failed send left as it was
    assert first_look(table) == claim.claimed_at + CONFIRM_AFTER and not claim.reconcile_key
    assert table.get(PK, keys.reconcile_row(T0 + CONFIRM_AFTER, EVENT, PARKED)) is None


def first_look(table: MemoryTable) -> object:
    """When the reconciler first looks at the hand-off's claim: its queue mark (ADR-0022 change 9)."""
    queued = table.get(PK, QUEUE_KEY)
    assert queued is not None and queued["ClaimedUntil"] == CLAIMED
    return queued["ReconcileAt"]


# -- a leased settlement -----------------------------------------------------------------------------------


def test_a_settlement_with_the_lease_that_holds_the_hand_off_is_sent() -> None:
    table, transport = leased(), Transport()

    accepted = settler(table, transport).settle(with_lease("tok"))

    assert accepted.confirmed and len(transport.sent) == 1
    queue = table.read(QueueRow, PK, QUEUE_KEY)
    assert queue is not None and queue.claimed_until.startswith("9999")


def test_a_settlement_with_a_lease_that_no_longer_holds_is_lease_lost() -> None:
    table, transport = leased("another-agents"), Transport()

    with pytest.raises(LeaseLost) as lost:
        settler(table, transport).settle(with_lease("tok"))

    assert lost.value.field == "leaseToken" and transport.sent == [] and claim_in(table) is None


def test_our_own_leased_settlement_retried_after_the_lease_ended_is_answered_from_its_claim() -> None:
    table, transport = leased(), Transport()
    first = settler(table, transport).settle(with_lease("tok"))

    again = settler(table, transport).settle(with_lease("tok"))

    assert again.replayed and again.control_message_id == first.control_message_id
    assert len(transport.sent) == 1


def test_a_leased_settlement_of_a_hand_off_no_longer_queued_is_refused() -> None:
    table, transport = leased(), Transport()
    table.submit([("delete", {"PartitionKey": PK, "RowKey": QUEUE_KEY})])

    with pytest.raises(Conflict) as refused:
        settler(table, transport).settle(with_lease("tok"))

    assert str(refused.value) == f"Event {EVENT!r} is no longer a pending hand-off."
    assert refused.value.field == "coordinates.eventId" and transport.sent == []
