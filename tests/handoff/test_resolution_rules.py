"""The rules that read an operator's earlier resolutions back from the audit, one example each:
``resolution_of``, ``control_of``, ``resolution_audit`` and ``needs_history``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from handoff import keys
from handoff.outbox import ClaimState
from handoff.records import AuditRow
from handoff.resolution import (
    DELIVERED,
    RELEASED,
    RESOLVE_AUDIT,
    ClaimResolution,
    control_of,
    needs_history,
    resolution_audit,
    resolution_of,
)

from .claim_rows import claim_row

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
