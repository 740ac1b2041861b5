"""The settlement's claim loop, through the real ``SettlementService`` on the in-memory table: what it does
when the claim transaction's answer is lost, when another settlement holds or releases the claim between
its write and its read, when the lease is renewed or the hand-off projected away meanwhile, when an
operator's pinned event moves, and when the queue row keeps changing under it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError, ServiceResponseError

from common import transactions as tx
from common.clock import iso
from common.errors import Conflict
from handoff.messages.contract import MessageType
from handoff.messages.transport import SendRefused
from handoff.receive.leases import UNCLAIMED, LeaseLost
from handoff.settlement.claims import ClaimOrder, SettlementInFlight
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.json_text import text_at
from handoff.storage.keys import Layout
from handoff.storage.records import AuditRow, ClaimRow, EventRow, QueueRow
from handoff.storage.store import classify_event_rows
from tests.support.interleave import interleave

from .claim_rows import CLAIM_KEY, EVENT, PARKED, PK, QUEUE_KEY, T0, message, parked
from .memory_table import MemoryTable
from .settling import (
    Clock,
    Transport,
    claim_in,
    completion,
    hand_off,
    leased,
    settlement,
    settler,
    with_lease,
)

Action = Callable[[], object]


def event_audits(table: MemoryTable) -> list[AuditRow]:
    """The event's audits as every reader shows them (audit rows and the entries rendered from claims)."""
    return classify_event_rows(iter(table.event_rows(PK, EVENT)))[2]


def audit_rows(table: MemoryTable) -> list[str]:
    """The keys of the event's audit rows (``ev|…|a|``) as written."""
    return [str(e["RowKey"]) for e in table.event_rows(PK, EVENT) if str(e["RowKey"]).split("|")[2] == "a"]


def before(table: MemoryTable, call: str, *actions: Action, rk: str | None = None) -> list[str]:
    """Run ``actions[i]`` just before the settler's ``i``-th ``call`` (on ``rk``, when given), as another
    writer would (its own calls pass the gate); returns every call the settler made."""
    calls: list[str] = []
    pending = list(actions)

    def gate(name: str, args: tuple[Any, ...]) -> None:
        calls.append(name)
        if name != call or not pending or (rk is not None and rk not in args):
            return
        table.tables.gate = None
        try:
            pending.pop(0)()
        finally:
            table.tables.gate = gate

    table.tables.gate = gate
    return calls


def is_claim_transaction(args: tuple[Any, ...]) -> bool:
    ops = args[1]
    return bool(ops[0][0] == "create" and ops[0][1]["RowKey"] == CLAIM_KEY)


def answer_lost(table: MemoryTable, *, applied: bool, then: Action | None = None) -> None:
    """The settler's claim transaction is applied (or not), and its answer never arrives."""

    def gate(name: str, args: tuple[Any, ...]) -> None:
        if name != "submit_transaction" or not is_claim_transaction(args):
            return
        table.tables.gate = None
        if applied:
            table.submit(args[1])
        if then is not None:
            then()
        raise ServiceResponseError("the connection dropped before the answer (test)")

    table.tables.gate = gate


# -- the answer of the claim transaction is lost ----------------------------------------------------------


def test_a_claim_written_but_unanswered_is_read_back_and_sent() -> None:
    table, transport = hand_off(), Transport()
    answer_lost(table, applied=True)

    accepted = settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert claim is not None and claim.state is ClaimState.sent and claim.attempts == 1
    assert accepted.confirmed and not accepted.replayed and accepted.state == "sent"
    assert accepted.control_message_id == claim.control_message_id and len(transport.sent) == 1


def test_a_claim_unanswered_and_not_written_fails_with_the_storage_fault() -> None:
    table, transport = hand_off(), Transport()
    answer_lost(table, applied=False)

    with pytest.raises(ServiceResponseError, match="connection dropped"):
        settler(table, transport).settle(completion())

    assert claim_in(table) is None and transport.sent == []


def test_a_claim_unanswered_and_unreadable_fails_with_the_first_fault() -> None:
    table, transport = hand_off(), Transport()

    def no_read(name: str, args: tuple[Any, ...]) -> None:
        raise ServiceRequestError("storage unreachable for the read back (test)")

    def unreadable() -> None:
        table.tables.gate = no_read

    answer_lost(table, applied=True, then=unreadable)

    with pytest.raises(ServiceResponseError, match="connection dropped") as failed:
        settler(table, transport).settle(completion())

    assert failed.value.__suppress_context__ and transport.sent == []
    table.tables.gate = None
    claim = claim_in(table)  # written and left to the reconciler (and to a retry, which meets it)
    assert claim is not None and claim.state is ClaimState.sending and claim.attempts == 0


def another_settlement(table: MemoryTable, transport: Transport, **changes: Any) -> Action:
    def settle() -> None:
        other = settlement(**changes)
        settler(table, transport, Clock()).settle(other)

    return settle


def test_a_lost_answer_over_the_same_request_claimed_elsewhere_is_answered_from_that_claim() -> None:
    table, transport = hand_off(), Transport()
    answer_lost(table, applied=False, then=another_settlement(table, transport))

    accepted = settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert claim is not None and accepted.replayed and accepted.confirmed
    assert accepted.control_message_id == claim.control_message_id and len(transport.sent) == 1


def test_a_lost_answer_over_another_request_claimed_elsewhere_is_in_flight() -> None:
    table, transport = hand_off(), Transport()
    answer_lost(table, applied=False, then=another_settlement(table, transport, settled_by="someone-else"))

    with pytest.raises(SettlementInFlight, match="already in flight"):
        settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert claim is not None and claim.settled_by == "someone-else" and len(transport.sent) == 1


# -- another settlement holds the claim -----------------------------------------------------------------


def test_a_claim_released_between_our_write_and_our_read_is_claimed_again() -> None:
    """Another settlement claims first and its send is refused: it releases its claim after ours met it
    and before we read it. We claim again and send; the other one fails."""
    table = hand_off()
    refused, ours = Transport(fail=SendRefused("nothing was sent (test)")), Transport()
    outcomes: dict[int, Any] = {}

    def writer(n: int) -> None:
        s = completion() if n == 0 else settlement(settled_by="someone-else")
        try:
            outcomes[n] = settler(table, ours if n == 0 else refused, Clock()).settle(s)
        except Exception as exc:
            outcomes[n] = exc

    # the other: reads the event, claims; we: read the event, meet its claim; the other releases; we go on
    turns = interleave(table.tables, 2, writer, [1, 1, 0, 0, 1])

    assert turns.steps[:6] == [
        (1, "get_entity"), (1, "submit_transaction"),  # the other reads the event and claims
        (0, "get_entity"), (0, "submit_transaction"),  # we read the event and meet its claim
        (1, "submit_transaction"),  # its send refused, it releases the claim
        (0, "get_entity"),  # we read the claim: gone
    ]  # fmt: skip
    assert turns.steps[6:8] == [(0, "submit_transaction")] * 2  # claimed again, the send recorded
    assert isinstance(outcomes[1], SendRefused)
    accepted = outcomes[0]
    claim = claim_in(table)
    assert claim is not None and claim.settled_by == "agent" and claim.state is ClaimState.sent
    assert accepted.confirmed and not accepted.replayed and len(ours.sent) == 1


def test_the_same_request_meeting_its_own_claim_is_answered_from_it() -> None:
    table, transport = hand_off(), Transport()
    before(table, "submit_transaction", another_settlement(table, transport))

    accepted = settler(table, transport).settle(completion())

    assert accepted.replayed and accepted.confirmed and len(transport.sent) == 1
    claim = claim_in(table)
    assert claim is not None and accepted.control_message_id == claim.control_message_id


# -- the rows the claim needs change meanwhile ----------------------------------------------------------


def renewal(table: MemoryTable, token: str = "tok") -> Action:
    """The agent renews its lease: the queue row is written again (a new ETag), the token unchanged."""

    def renew() -> None:
        until = iso(T0 + timedelta(minutes=5))
        table.submit([tx.merge({"PartitionKey": PK, "RowKey": QUEUE_KEY, "ClaimedUntil": until})])
        assert table.get(PK, QUEUE_KEY)["LeaseToken"] == token  # type: ignore[index]

    return renew


def test_a_lease_renewed_between_our_read_and_our_claim_is_read_again_and_the_claim_taken() -> None:
    table, transport = leased(), Transport()
    calls = before(table, "submit_transaction", renewal(table))

    accepted = settler(table, transport).settle(with_lease("tok"))

    assert accepted.confirmed and len(transport.sent) == 1
    assert calls.count("submit_transaction") == 3  # refused, taken, then the send recorded
    assert table.get(PK, QUEUE_KEY)["ClaimedUntil"].startswith("9999")  # type: ignore[index]


def test_a_queue_row_that_keeps_changing_under_the_claim_is_in_flight_after_three_tries() -> None:
    table, transport = leased(), Transport()
    calls = before(table, "submit_transaction", *[renewal(table)] * 4)

    with pytest.raises(SettlementInFlight) as refused:
        settler(table, transport).settle(with_lease("tok"))

    assert str(refused.value) == f"A settlement of event {EVENT!r} kept changing; retry."
    assert refused.value.field == "coordinates.messageId" and refused.value.status == 409
    assert calls.count("submit_transaction") == 3 and transport.sent == [] and claim_in(table) is None


def test_a_hand_off_projected_away_before_the_claim_is_no_longer_pending() -> None:
    table, transport = hand_off(), Transport()
    before(table, "submit_transaction", lambda: table.submit([tx.delete(PK, QUEUE_KEY)]))

    with pytest.raises(Conflict) as refused:
        settler(table, transport).settle(completion())

    assert str(refused.value) == f"Event {EVENT!r} is no longer a pending hand-off."
    assert refused.value.field == "coordinates.eventId"
    assert transport.sent == [] and claim_in(table) is None


def operator_order() -> ClaimOrder:
    return ClaimOrder(
        kind=MessageType.ResubmissionRequest,
        endpoint_id="Billing",
        event_id=EVENT,
        addressed_message_id=PARKED,
        by="operator@contoso",
        audit_type="Resubmit",
        digest="resubmit-1",
        agent_id="console",
        principal_name="Operator One",
        principal_id="oid-1",
        audit_comment="replayed after the fix",
        pins_event=True,
    )


def test_an_operator_action_whose_event_moved_before_its_claim_is_refused_to_look_again() -> None:
    table, transport = hand_off(), Transport()
    row = table.read(EventRow, PK, keys.event_row(EVENT))
    assert row is not None
    newer = {"PartitionKey": PK, "RowKey": keys.event_row(EVENT), "LastMessageId": "m-newer"}
    before(table, "submit_transaction", lambda: table.submit([tx.merge(newer)]))

    with pytest.raises(Conflict) as refused:
        settler(table, transport).submit(operator_order(), row, message("ctl-op"), "{}")

    assert str(refused.value) == (
        f"Event {EVENT!r} changed while the Resubmit was being claimed (a newer message was projected); "
        "look at it again."
    )
    assert refused.value.field == "eventId" and transport.sent == [] and claim_in(table) is None


def test_an_operator_action_claims_pins_and_audits_who_asked() -> None:
    table, transport = hand_off(), Transport()
    row = table.read(EventRow, PK, keys.event_row(EVENT))
    assert row is not None

    accepted = settler(table, transport).submit(operator_order(), row, message("ctl-op"), '{"a":1}')

    claim = claim_in(table)
    assert claim is not None and accepted.confirmed and accepted.control_message_id == "ctl-op"
    assert (claim.settled_by, claim.agent_id) == ("operator@contoso", "console")
    assert (claim.principal_name, claim.principal_id) == ("Operator One", "oid-1")
    # The claim is the audit (ADR-0022 change 3): no audit row, the event's audits render it
    assert not claim.audit_key and audit_rows(table) == []
    [audit] = event_audits(table)
    assert audit == claim.audit()
    assert audit.audit_type == "Resubmit" and audit.data == '{"a":1}' and audit.audit_timestamp == T0
    assert audit.comment == "replayed after the fix"
    assert (audit.auditor_name, audit.principal_name, audit.principal_id) == (
        "operator@contoso",
        "Operator One",
        "oid-1",
    )
    assert (audit.event_id, audit.endpoint_id) == (EVENT, "Billing")
    pinned = table.get(PK, keys.event_row(EVENT))
    assert pinned is not None and pinned["OperatorClaimAt"] == T0
    assert table.get(PK, QUEUE_KEY)["ClaimedUntil"] == UNCLAIMED  # type: ignore[index]  # no queue mark


def test_a_settlement_claim_records_the_agent_and_principal_that_asked() -> None:
    table, transport = hand_off(), Transport()
    asked = settlement(agent_id="agent-7", principal_name="Billing App", principal_id="oid-9")

    settler(table, transport).settle(asked)

    claim = claim_in(table)
    assert claim is not None
    assert (claim.agent_id, claim.principal_name, claim.principal_id) == ("agent-7", "Billing App", "oid-9")
    [audit] = event_audits(table)
    assert audit.audit_type == "CompleteHandoff" and audit.auditor_name == "agent"
    assert (audit.principal_name, audit.principal_id) == ("Billing App", "oid-9")
    assert '"agentId":"agent-7"' in (audit.data or "")
    assert audit_rows(table) == []  # rendered from the claim, not written beside it


# -- a refused send whose claim cannot be released ----------------------------------------------------------


def test_a_refused_send_whose_release_fails_is_answered_unconfirmed_from_the_claim_left() -> None:
    table, transport = hand_off(), Transport(fail=SendRefused("nothing was sent (test)"))

    def release_fails(name: str, args: tuple[Any, ...]) -> None:
        if name == "submit_transaction" and args[1][0][0] == "delete":
            raise ServiceRequestError("storage unreachable for the release (test)")

    table.tables.gate = release_fails

    accepted = settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert claim is not None and claim.state is ClaimState.sending  # left for the reconciler
    assert not accepted.replayed and not accepted.confirmed and accepted.state == "sending"
    assert accepted.endpoint_id == "Billing" and accepted.control_message_id == claim.control_message_id
    assert accepted.follow_up is not None and len(transport.sent) == 1


# -- the lease that fences a claim ---------------------------------------------------------------------------


def test_a_leased_settlement_reads_the_queue_row_in_its_events_shard() -> None:
    four = Layout(shards=4)
    pk = four.event_partition("Billing", EVENT)
    assert pk != PK  # four shards: the event's rows live in its shard's partition
    table, transport = MemoryTable(), Transport()
    row = parked(etag=None)
    table.submit([("create", row.to_entity(pk, keys.event_row(EVENT)))])
    until = iso(T0 + timedelta(seconds=30))
    queue = QueueRow(event_id=EVENT, parked_message_id=PARKED, lease_token="tok", claimed_until=until)
    table.submit([("create", queue.to_entity(pk, QUEUE_KEY))])

    accepted = settler(table, transport, layout=four).settle(with_lease("tok"))

    assert accepted.confirmed and len(transport.sent) == 1
    assert table.read(ClaimRow, pk, CLAIM_KEY) is not None


def test_our_own_leased_settlement_retried_once_the_lease_is_gone_is_answered_from_its_claim() -> None:
    table, transport = leased(), Transport()
    first = settler(table, transport).settle(with_lease("tok"))
    table.submit([tx.merge({"PartitionKey": PK, "RowKey": QUEUE_KEY, "LeaseToken": ""})])  # the lease ended

    again = settler(table, transport).settle(with_lease("tok"))

    assert (
        again.replayed and again.control_message_id == first.control_message_id and len(transport.sent) == 1
    )
    with pytest.raises(LeaseLost):  # anyone else's settlement with that token is not
        settler(table, transport).settle(with_lease("tok", settled_by="someone-else"))


def test_two_settlements_of_one_event_at_the_same_instant_are_both_audited() -> None:
    """The hand-off is settled, parked again by another message and settled again, all at ``T0``: each
    claim renders its own audit entry."""
    table, transport = hand_off(), Transport()
    settler(table, transport).settle(completion())
    again = parked(etag=None).model_copy(update={"last_message_id": "park-2"})
    queue = QueueRow(event_id=EVENT, parked_message_id="park-2")
    table.submit([tx.merge(again.to_entity(PK, keys.event_row(EVENT)))])
    table.submit([tx.delete(PK, QUEUE_KEY)])
    table.submit([tx.insert(queue.to_entity(PK, QUEUE_KEY))])

    accepted = settler(table, transport).settle(completion(message_id="park-2"))

    assert accepted.confirmed and not accepted.replayed and len(transport.sent) == 2
    audits = event_audits(table)
    assert len(audits) == 2 and all(a.audit_timestamp == T0 for a in audits)
    assert sorted(text_at(a.data, "parkedMessageId") or "" for a in audits) == [PARKED, "park-2"]


def test_a_claim_read_back_after_a_lost_answer_is_moved_if_match_as_read() -> None:
    """The claim's answer was lost and it was read back; while it is being sent, a re-sender pins it (one
    more attempt). The send's ``sent`` is written If-Match the claim as read back: refused, then recorded
    again over the pin, so the re-sender's attempt is kept."""
    table = hand_off()
    answer_lost(table, applied=True)

    class Pinned(Transport):
        def send(self, topic: str, message: Any) -> None:
            super().send(topic, message)
            claim = claim_in(table)
            assert claim is not None
            pin = {"PartitionKey": PK, "RowKey": CLAIM_KEY, "Attempts": claim.attempts + 1}
            table.submit([tx.merge(pin)])

    transport = Pinned()

    accepted = settler(table, transport).settle(completion())

    claim = claim_in(table)
    assert accepted.confirmed and claim is not None and claim.state is ClaimState.sent
    assert claim.attempts == 2  # the re-sender's attempt and ours
