"""The claim rules (``handoff.settlement.claims``) an agent or operator reads the outcome of, one example
each, checked exactly: a lost lease, a settlement already in flight, a pin and a claim's move applied."""

from __future__ import annotations

from datetime import timedelta

import pytest

from common import transactions as tx
from handoff.messages.contract import MessageType
from handoff.receive.leases import LeaseLost
from handoff.settlement import claims
from handoff.settlement.claims import SettlementInFlight
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState

from .claim_rows import CLAIM_KEY, PK, T0, claim_row, message, order, parked, tracked_claim


def test_retried_or_lost_answers_our_own_retry_from_its_claim() -> None:
    ours = claim_row(request_digest="req-a")

    assert claims.retried_or_lost(order("req-a"), ours) is ours


@pytest.mark.parametrize("existing", [None, claim_row(request_digest="req-b")])
def test_retried_or_lost_refuses_anyone_else_as_lease_lost(existing: object) -> None:
    with pytest.raises(LeaseLost) as lost:
        claims.retried_or_lost(order("req-a"), existing)  # type: ignore[arg-type]

    assert lost.value.field == "leaseToken"
    assert str(lost.value) == (
        "The lease on event 'ev-1' was lost (it expired and another agent holds it now, or it was released); "
        "this settlement was not sent."
    )


def test_replay_refuses_another_request_naming_the_settlement_in_flight() -> None:
    claim = claim_row(request_digest="req-a")

    assert claims.replay(claim, "req-a") is claim
    with pytest.raises(SettlementInFlight) as in_flight:
        claims.replay(claim, "req-b")

    assert in_flight.value.field == "coordinates.messageId"
    assert str(in_flight.value) == (
        "A settlement of event 'ev-1' (HandoffCompletedRequest by 'agent', sending) is already in flight."
    )


def test_plan_pin_writes_the_claim_if_match_its_etag_counting_an_attempt_when_asked() -> None:
    claim = claim_row(attempts=2)
    later = T0 + timedelta(seconds=5)

    assert claims.plan_pin(PK, claim, now=later, count=True) == tx.merge(
        {"PartitionKey": PK, "RowKey": CLAIM_KEY, "UpdatedAt": later, "Attempts": 3}, '"c1"'
    )
    assert claims.plan_pin(PK, claim.model_copy(update={"etag": None}), now=later, count=False) == tx.merge(
        {"PartitionKey": PK, "RowKey": CLAIM_KEY, "UpdatedAt": later}, "*"
    )


def test_pinned_is_the_claim_with_the_new_etag_time_and_count() -> None:
    claim = claim_row(attempts=2)
    later = T0 + timedelta(seconds=5)

    counted = claims.pinned(claim, {"etag": '"c2"'}, now=later, count=True)
    kept = claims.pinned(claim, {"etag": '"c3"'}, now=later, count=False)

    assert (counted.etag, counted.updated_at, counted.attempts) == ('"c2"', later, 3)
    assert (kept.etag, kept.updated_at, kept.attempts) == ('"c3"', later, 2)


def test_a_transition_applied_takes_the_new_etag_from_the_answer() -> None:
    move = claims.plan_transition(PK, claim_row(), ClaimState.sent, now=T0, sent=True)

    assert move.applied([{"etag": '"c9"'}]).etag == '"c9"'
    assert move.applied([]).etag is None
    assert move.applied([{"etag": '"c9"'}]).state is ClaimState.sent
    assert move.ops[0][1]["RowKey"] == keys.claim_row("ev-1", "park-1")


def test_moved_on_when_the_event_is_gone_or_parked_again_by_another_message() -> None:
    claim = claim_row()

    assert claims.moved_on(claim, None)
    assert claims.moved_on(claim, parked().model_copy(update={"last_message_id": "park-2"}))
    assert not claims.moved_on(claim, parked())


def test_moved_on_a_settlement_kind_once_its_hand_off_is_no_longer_parked() -> None:
    assert MessageType.HandoffCompletedRequest in claims.SETTLEMENT_KINDS
    assert {MessageType.HandoffCompletedRequest, MessageType.HandoffFailedRequest} == claims.SETTLEMENT_KINDS
    answered = parked().model_copy(update={"pending_sub_status": None})

    assert claims.moved_on(claim_row(), answered)
    operator = claim_row(message_type=MessageType.ResubmissionRequest)
    assert not claims.moved_on(operator, answered)  # an operator action's event moves on by a newer message


def test_a_claim_plan_holds_the_claim_and_its_transaction() -> None:
    plan = claims.plan_claim(order(), parked(), message("ctl-1"), "{}", pk=PK, now=T0)

    assert isinstance(plan, claims.ClaimPlan)
    assert plan.claim.control_message_id == "ctl-1" and plan.claim.state is ClaimState.sending
    assert plan.ops[0][1]["RowKey"] == CLAIM_KEY and plan.fence is None and plan.pin is None


def test_a_transition_is_the_claims_move_and_the_claim_once_moved() -> None:
    move = claims.plan_transition(PK, claim_row(), ClaimState.unconfirmed, now=T0)

    assert isinstance(move, claims.Transition)
    assert move.moved.state is ClaimState.unconfirmed and move.ops[0][2]["etag"] == '"c1"'


def test_a_fenced_claim_replaces_only_the_queue_mark_by_one_if_match_the_lease_read() -> None:
    plan = claims.plan_claim(order(token="tok"), parked(), message("ctl-1"), "{}", pk=PK, now=T0)
    assert plan.fence is not None

    fenced = plan.fenced('"q7"')

    at = plan.fence
    assert len(fenced) == len(plan.ops)
    assert fenced[:at] == plan.ops[:at] and fenced[at + 1 :] == plan.ops[at + 1 :]
    assert fenced[at] == tx.merge(plan.ops[at][1], '"q7"')


def test_plan_transition_to_sent_records_the_send_and_leaves_the_reconciler() -> None:
    claim = tracked_claim(attempts=1)
    later = T0 + timedelta(seconds=3)

    move = claims.plan_transition(PK, claim, ClaimState.sent, now=later, sent=True, attempt=True)

    assert move.ops[0] == tx.merge(
        {
            "PartitionKey": PK,
            "RowKey": CLAIM_KEY,
            "State": "sent",
            "UpdatedAt": later,
            "ReconcileKey": "",
            "UnconfirmedKey": "",
            "Attempts": 2,
            "LastSentAt": later,
        },
        '"c1"',
    )
    assert move.ops[1:] == [tx.delete(PK, str(claim.reconcile_key))]
    moved = move.moved
    assert (moved.state, moved.etag, moved.attempts, moved.reconcile_key, moved.unconfirmed_key) == (
        ClaimState.sent,
        None,
        2,
        None,
        None,
    )
    assert moved.last_sent_at == later and moved.updated_at == later


def test_plan_transition_to_unconfirmed_lists_the_claim_for_operators_once() -> None:
    claim = claim_row(etag=None)
    due = T0 + timedelta(minutes=5)

    move = claims.plan_transition(PK, claim, ClaimState.unconfirmed, now=T0, due=due)

    unconfirmed = keys.unconfirmed_row("ev-1", "park-1")
    reconcile = keys.reconcile_row(due, "ev-1", "park-1")
    assert move.ops[0][1]["UnconfirmedKey"] == unconfirmed and move.ops[0][1]["ReconcileKey"] == reconcile
    assert (
        move.ops[0][2]["etag"] == "*"
        and "Attempts" not in move.ops[0][1]
        and "LastSentAt" not in move.ops[0][1]
    )
    written = [(op[0], op[1]["RowKey"]) for op in move.ops]
    assert ("create", reconcile) in written and ("create", unconfirmed) in written
    assert move.moved.unconfirmed_key == unconfirmed and move.moved.attempts == claim.attempts
    assert move.moved.last_sent_at == claim.last_sent_at
    listed_again = claims.plan_transition(PK, move.moved, ClaimState.unconfirmed, now=T0, due=due)
    assert ("create", unconfirmed) not in [(op[0], op[1]["RowKey"]) for op in listed_again.ops]


@pytest.mark.parametrize(
    ("state", "due", "listed"),
    [
        (ClaimState.sending, T0 + timedelta(minutes=5), None),  # looked at again later
        (ClaimState.unconfirmed, T0 + timedelta(minutes=5), None),  # listed for operators
        (ClaimState.sent, None, keys.unconfirmed_row("ev-1", "park-1")),  # unlisted once it moves on
    ],
)
def test_a_claims_move_is_one_transaction_in_the_claims_partition(
    state: ClaimState, due: object, listed: str | None
) -> None:
    claim = tracked_claim(unconfirmed_key=listed)

    move = claims.plan_transition(PK, claim, state, now=T0, due=due)  # type: ignore[arg-type]

    assert len(move.ops) >= 3 and {op[1]["PartitionKey"] for op in move.ops} == {PK}


def test_the_request_digest_of_a_request_is_the_same_in_every_version() -> None:
    """Claims written by an earlier deployment answer retries after an upgrade: the digest of a request is
    fixed (the JSON of its parts as written, non-ASCII text kept as is, then SHA-256 of its UTF-8)."""
    digest = claims.request_digest(
        kind="HandoffCompletedRequest",
        endpoint_id="Billing",
        event_id="ev-1",
        addressed_message_id="park-1",
        settled_by="agent",
        principal_id=None,
        result_json='{"name":"Zoë"}',
        error_text=None,
        error_type=None,
    )

    assert digest == "be5c2b2be466ccfe3fdc986c1b339e61620f1bfce3a485a9702be07474d21975"
