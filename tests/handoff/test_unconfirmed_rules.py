"""An operator's resolution of an unconfirmed settlement (``handoff.settlement.unconfirmed_rules``), decided
without storage: done already, refused, or to be written, and the one transaction that writes it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from common.errors import Conflict, NotFound
from handoff.receive.leases import UNCLAIMED
from handoff.settlement.unconfirmed_rules import (
    DELIVERED,
    RELEASED,
    ClaimResolution,
    decide,
    needs_history,
    plan_resolution,
)
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import AuditRow, ClaimRow

from .claim_rows import PK, QUEUE_KEY, claim_row, parked, tracked_claim

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


def resolved(resolution: str, control: str = "ctl-1", *, by: str = "olivia") -> AuditRow:
    return AuditRow(
        auditor_name=by,
        audit_timestamp=T0 + timedelta(minutes=1),
        audit_type="ResolveSettlement",
        comment="checked at the endpoint",
        data=json.dumps(
            {"resolution": resolution, "addressedMessageId": "park-1", "controlMessageId": control}
        ),
        event_id="ev-1",
        endpoint_id="Billing",
    )


def unconfirmed() -> ClaimRow:
    # An unconfirmed claim is always looked at again through a reconcile row of its own
    return tracked_claim(state=ClaimState.unconfirmed, unconfirmed_key=keys.unconfirmed_row("ev-1", "park-1"))


def ask(
    claim: ClaimRow | None, earlier: AuditRow | None, resolution: str, control: str | None = "ctl-1"
) -> ClaimResolution | ClaimRow:
    return decide(
        claim, earlier, event_id="ev-1", addressed="park-1", resolution=resolution, control_message_id=control
    )


def test_an_unconfirmed_claim_is_resolved_and_needs_no_history() -> None:
    claim = unconfirmed()

    assert not needs_history(claim, "ctl-1")
    assert ask(claim, None, DELIVERED) is claim


def test_the_same_resolution_again_is_answered_as_done_from_the_audit_of_the_first() -> None:
    first = resolved(RELEASED)

    done = ask(None, first, RELEASED)

    assert isinstance(done, ClaimResolution)
    assert (done.state, done.replayed, done.claim, done.audit) == (RELEASED, True, None, first)
    assert done.control_message_id == "ctl-1"


def test_a_different_resolution_of_a_resolved_claim_names_who_resolved_it() -> None:
    delivered = claim_row(state=ClaimState.delivered)

    with pytest.raises(Conflict, match="already resolved delivered by 'olivia'"):
        ask(delivered, resolved(DELIVERED), RELEASED)


def test_a_claim_the_reconciler_confirmed_is_delivered_and_cannot_be_released() -> None:
    delivered = claim_row(state=ClaimState.delivered)

    done = ask(delivered, None, DELIVERED)
    assert isinstance(done, ClaimResolution) and done.replayed and done.audit is None
    with pytest.raises(Conflict, match="cannot be released"):
        ask(delivered, None, RELEASED)


def test_no_claim_and_no_resolution_is_not_found() -> None:
    with pytest.raises(NotFound):
        ask(None, None, DELIVERED)


def test_a_claim_settled_again_after_a_release_is_not_the_one_resolved() -> None:
    again = unconfirmed().model_copy(update={"control_message_id": "ctl-2"})

    assert needs_history(again, "ctl-1")
    with pytest.raises(Conflict) as refused:
        ask(again, None, DELIVERED)
    assert refused.value.field == "controlMessageId"


def test_only_an_unconfirmed_claim_is_resolved_by_an_operator() -> None:
    with pytest.raises(Conflict, match="not unconfirmed"):
        ask(claim_row(state=ClaimState.sending), None, DELIVERED)


def test_delivered_marks_the_claim_as_read_and_unlists_it_with_the_audit_in_one_transaction() -> None:
    claim = unconfirmed()

    ops = plan_resolution(PK, parked(), claim, DELIVERED, resolved(DELIVERED))

    assert [op[0] for op in ops] == ["update", "delete", "delete", "create"]
    assert ops[0][1]["State"] == "delivered" and ops[0][2]["etag"] == claim.etag
    assert {ops[1][1]["RowKey"], ops[2][1]["RowKey"]} == {claim.reconcile_key, claim.unconfirmed_key}


def test_released_deletes_the_claim_and_frees_the_hand_off_it_settled() -> None:
    claim = unconfirmed()

    ops = plan_resolution(PK, parked(), claim, RELEASED, resolved(RELEASED))
    moved_on = plan_resolution(
        PK, parked().model_copy(update={"last_message_id": "park-2"}), claim, RELEASED, resolved(RELEASED)
    )

    assert ops[0][0] == "delete" and ops[0][2]["etag"] == claim.etag
    assert ops[1][1] == {"PartitionKey": PK, "RowKey": QUEUE_KEY, "ClaimedUntil": UNCLAIMED}
    assert all(op[1]["RowKey"] != QUEUE_KEY for op in moved_on)  # parked again since: not ours to free
