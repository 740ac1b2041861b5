"""An operator's resolution of an unconfirmed settlement, one example per rule: reading earlier resolutions
back from the audit (``resolution_of``, ``control_of``, ``resolution_audit``, ``needs_history``), what
``decide`` answers or refuses (word for word: the refusal is what the operator reads), and the one
transaction ``plan_resolution`` writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from common import transactions as tx
from common.clock import iso
from common.errors import Conflict, NotFound, SettleError
from handoff.receive.leases import UNCLAIMED
from handoff.settlement.unconfirmed_rules import (
    DELIVERED,
    RELEASED,
    RESOLVE_AUDIT,
    ClaimResolution,
    control_of,
    decide,
    needs_history,
    plan_resolution,
    resolution_audit,
    resolution_of,
)
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import AuditRow, ClaimRow

from .claim_rows import CLAIM_KEY, PK, QUEUE_KEY, claim_row, parked

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


def audit(
    resolution: str | None,
    *,
    addressed: str = "park-1",
    control: str = "ctl-1",
    kind: str = RESOLVE_AUDIT,
    denied: bool = False,
    minute: int = 1,
) -> AuditRow:
    data: dict[str, str] = {"addressedMessageId": addressed, "controlMessageId": control}
    if resolution is not None:
        data["resolution"] = resolution
    return AuditRow(
        auditor_name="olivia",
        audit_timestamp=T0 + timedelta(minutes=minute),
        audit_type=kind,
        data=json.dumps(data),
        event_id="ev-1",
        endpoint_id="Billing",
        access_denied=denied,
    )


def test_resolution_of_reads_what_a_resolve_settlement_audit_resolved() -> None:
    assert resolution_of(audit(DELIVERED)) == DELIVERED
    assert resolution_of(audit(RELEASED)) == RELEASED


def test_resolution_of_ignores_other_audits_and_refused_resolutions() -> None:
    assert resolution_of(audit(DELIVERED, kind="Comment")) is None
    assert resolution_of(audit(DELIVERED, denied=True)) is None
    assert resolution_of(audit(None)) is None


def test_control_of_names_the_control_message_resolved() -> None:
    assert control_of(audit(RELEASED, control="ctl-7")) == "ctl-7"


def test_resolution_audit_finds_the_latest_resolution_of_the_addressed_message() -> None:
    first = audit(RELEASED, control="ctl-1", minute=1)
    second = audit(RELEASED, control="ctl-2", minute=2)
    elsewhere = audit(RELEASED, addressed="park-9", minute=3)

    assert resolution_audit([first, second, elsewhere], "park-1", None, None) is second
    assert resolution_audit([first, second, elsewhere], "park-1", RELEASED, "ctl-1") is first
    assert resolution_audit([first, second], "park-1", DELIVERED, None) is None
    assert resolution_audit([first, second], "park-2", None, None) is None


def test_resolution_audit_skips_refused_resolutions_and_other_audits() -> None:
    refused = audit(DELIVERED, denied=True, minute=5)
    comment = audit(DELIVERED, kind="Comment", minute=6)
    done = audit(DELIVERED, minute=1)

    assert resolution_audit([done, refused, comment], "park-1", DELIVERED, None) is done
    assert resolution_audit([refused, comment], "park-1", None, None) is None


def test_needs_history_when_the_claim_is_gone_settled_or_another() -> None:
    unconfirmed = claim_row(
        state=ClaimState.unconfirmed, unconfirmed_key=keys.unconfirmed_row("ev-1", "park-1")
    )
    assert needs_history(None, None)
    assert not needs_history(unconfirmed, None)
    assert not needs_history(unconfirmed, unconfirmed.control_message_id)
    assert needs_history(unconfirmed, "another-control-message")
    assert needs_history(claim_row(state=ClaimState.delivered), None)
    assert needs_history(claim_row(state=ClaimState.sent), None)


def test_a_resolution_answered_from_an_audit_names_the_control_message_of_that_audit() -> None:
    earlier = audit(RELEASED, control="ctl-3")

    assert ClaimResolution(RELEASED, True, None, earlier).control_message_id == "ctl-3"
    assert ClaimResolution(DELIVERED, True, None, None).control_message_id is None
    claim = claim_row(state=ClaimState.delivered)
    assert ClaimResolution(DELIVERED, True, claim, earlier).control_message_id == claim.control_message_id


# -- what an operator's resolution decides and writes, exactly --------------------------------------------


def unconfirmed_claim(**changes: object) -> ClaimRow:
    return claim_row(
        **{
            "state": ClaimState.unconfirmed,
            "unconfirmed_key": keys.unconfirmed_row("ev-1", "park-1"),
            **changes,
        }
    )


def resolve(
    claim: ClaimRow | None, earlier: AuditRow | None, resolution: str, control: str | None = "ctl-1"
) -> ClaimResolution | ClaimRow:
    return decide(
        claim, earlier, event_id="ev-1", addressed="park-1", resolution=resolution, control_message_id=control
    )


def refusal_of(
    claim: ClaimRow | None, earlier: AuditRow | None, resolution: str, control: str | None
) -> SettleError:
    with pytest.raises(SettleError) as refused:
        resolve(claim, earlier, resolution, control)
    return refused.value


def test_decide_resolves_the_unconfirmed_claim_itself() -> None:
    claim = unconfirmed_claim()

    assert resolve(claim, None, DELIVERED) is claim
    assert resolve(claim, None, RELEASED, None) is claim


def test_decide_refuses_a_message_with_no_claim_and_no_resolution() -> None:
    refused = refusal_of(None, None, DELIVERED, None)

    assert isinstance(refused, NotFound)
    assert str(refused) == "No settlement of message 'park-1' of event 'ev-1' is claimed."


def test_decide_refuses_a_claim_of_another_control_message() -> None:
    again = unconfirmed_claim(control_message_id="ctl-2")

    refused = refusal_of(again, None, DELIVERED, "ctl-1")

    assert isinstance(refused, Conflict) and refused.field == "controlMessageId"
    assert str(refused) == (
        "The claim of message 'park-1' holds control message 'ctl-2', not 'ctl-1' "
        "(it was released and settled again?)."
    )


def test_decide_refuses_a_claim_that_is_not_unconfirmed() -> None:
    refused = refusal_of(claim_row(state=ClaimState.sending), None, DELIVERED, None)

    assert isinstance(refused, Conflict) and refused.field == "messageId"
    assert str(refused) == (
        "The settlement of message 'park-1' is sending, not unconfirmed: "
        "only an unconfirmed settlement is resolved by an operator."
    )


def test_decide_refuses_to_release_what_the_reconciler_confirmed_delivered() -> None:
    refused = refusal_of(claim_row(state=ClaimState.delivered), None, RELEASED, None)

    assert isinstance(refused, Conflict) and refused.field == "resolution"
    assert str(refused) == (
        "The settlement of message 'park-1' was confirmed delivered (the endpoint answered it): "
        "it cannot be released."
    )


def test_decide_names_who_resolved_a_claim_otherwise_and_when() -> None:
    delivered = claim_row(state=ClaimState.delivered)
    earlier = audit(DELIVERED).model_copy(update={"comment": "checked at the endpoint"})

    refused = refusal_of(delivered, earlier, RELEASED, None)

    assert isinstance(refused, Conflict) and refused.field == "resolution"
    assert str(refused) == (
        "The settlement of message 'park-1' was already resolved delivered by 'olivia' at "
        f"{iso(earlier.audit_timestamp)} (checked at the endpoint); it cannot be released now."
    )
    silent = refusal_of(delivered, audit(DELIVERED), RELEASED, None)
    assert "(no reason given)" in str(silent)


def test_decide_answers_the_same_resolution_of_the_same_claim_from_its_audit() -> None:
    delivered = claim_row(state=ClaimState.delivered)
    earlier = audit(DELIVERED, control=delivered.control_message_id)

    done = resolve(delivered, earlier, DELIVERED, None)

    assert done == ClaimResolution(DELIVERED, True, delivered, earlier)


def test_decide_answers_a_release_of_a_claim_settled_again_from_the_earlier_release() -> None:
    again = unconfirmed_claim(control_message_id="ctl-2")
    earlier = audit(RELEASED, control="ctl-1")

    done = resolve(again, earlier, RELEASED, "ctl-1")

    assert done == ClaimResolution(RELEASED, True, None, earlier)


def test_decide_lets_the_new_claim_decide_when_the_earlier_claim_was_resolved_otherwise() -> None:
    again = unconfirmed_claim(control_message_id="ctl-2")
    earlier = audit(RELEASED, control="ctl-1")

    assert resolve(again, earlier, DELIVERED, None) is again


def test_plan_resolution_of_delivered_marks_the_claim_unlists_it_and_audits_in_one_transaction() -> None:
    claim = unconfirmed_claim(reconcile_key="rc-key")
    resolved_audit = audit(DELIVERED)

    ops = plan_resolution(PK, parked(), claim, DELIVERED, resolved_audit)

    assert ops[:3] == [
        tx.merge(
            {
                "PartitionKey": PK,
                "RowKey": CLAIM_KEY,
                "State": "delivered",
                "UpdatedAt": resolved_audit.audit_timestamp,
                "ReconcileKey": "",
                "UnconfirmedKey": "",
            },
            claim.etag or "",
        ),
        tx.delete(PK, "rc-key"),
        tx.delete(PK, keys.unconfirmed_row("ev-1", "park-1")),
    ]
    assert len(ops) == 4
    assert_audit_insert(ops[3], resolved_audit)


def test_plan_resolution_of_released_deletes_the_claim_and_frees_its_queue_row() -> None:
    claim = unconfirmed_claim(reconcile_key=None)
    resolved_audit = audit(RELEASED)

    ops = plan_resolution(PK, parked(), claim, RELEASED, resolved_audit)

    assert ops[:3] == [
        tx.delete(PK, CLAIM_KEY, claim.etag),
        tx.merge({"PartitionKey": PK, "RowKey": QUEUE_KEY, "ClaimedUntil": UNCLAIMED}),
        tx.delete(PK, keys.unconfirmed_row("ev-1", "park-1")),
    ]
    assert len(ops) == 5
    # The settlement's audit, rendered from the claim until now, stays: written as a row at the claim's time
    settled = claim.audit()
    assert settled is not None
    assert_audit_insert(ops[3], settled)
    assert AuditRow.from_entity(ops[3][1]).model_dump() == settled.model_dump()
    assert_audit_insert(ops[4], resolved_audit)


def test_plan_resolution_of_a_released_claim_with_its_own_audit_row_leaves_that_row() -> None:
    legacy = unconfirmed_claim(reconcile_key=None, audit_key=keys.audit_row("ev-1", T0, "legacy"))

    ops = plan_resolution(PK, parked(), legacy, RELEASED, audit(RELEASED))

    assert [op[0] for op in ops] == ["delete", "update", "delete", "create"]
    assert_audit_insert(ops[3], audit(RELEASED))


def test_plan_resolution_frees_no_queue_row_of_another_park_or_of_none() -> None:
    claim = unconfirmed_claim(reconcile_key=None, unconfirmed_key=None)
    moved_on = parked().model_copy(update={"last_message_id": "park-2"})

    for row in (moved_on, parked(queue_key=None)):
        ops = plan_resolution(PK, row, claim, RELEASED, audit(RELEASED))
        assert [op[0] for op in ops] == ["delete", "create", "create"]


def test_plan_resolution_of_a_claim_read_without_an_etag_matches_any() -> None:
    claim = unconfirmed_claim(etag=None)

    delivered = plan_resolution(PK, parked(), claim, DELIVERED, audit(DELIVERED))
    released = plan_resolution(PK, parked(), claim, RELEASED, audit(RELEASED))

    assert delivered[0][2]["etag"] == "*" and released[0] == tx.delete(PK, CLAIM_KEY, "*")


def assert_audit_insert(op: tx.Operation, written: AuditRow) -> None:
    assert op[0] == "create"
    entity = op[1]
    assert entity["PartitionKey"] == PK
    prefix = keys.audit_row("ev-1", written.audit_timestamp, "")
    assert str(entity["RowKey"]).startswith(prefix)
    assert len(str(entity["RowKey"])) == len(prefix) + 32  # a random id: two audits never collide
    assert entity == written.to_entity(PK, str(entity["RowKey"]))


def test_decide_answers_delivered_again_for_a_claim_the_reconciler_confirmed() -> None:
    delivered = claim_row(state=ClaimState.delivered)

    assert resolve(delivered, None, DELIVERED, None) == ClaimResolution(DELIVERED, True, delivered, None)
