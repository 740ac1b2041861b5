"""The operator's rules (management/rules.py), one example each, without storage: given rows as read, the
rule's answer. Each test is named after the rule it checks."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from common.errors import Conflict, InvalidInput, PayloadTooLarge
from common.principal import Actor, Principal
from handoff.messages.contract import HANDOFF_SUB_STATUS, MessageContent, MessageType, ResolutionStatus
from handoff.messages.transport import MAX_SEND_BYTES
from handoff.storage.claim_state import ClaimState
from handoff.storage.records import ClaimRow, EventRow, HistoryRow, PoisonRow
from management import rules

NOW = datetime(2026, 12, 5, 17, 9, 56, 455000, tzinfo=UTC)
ANON = Actor(by="ops", principal=None)
SIGNED = Actor(by="ada", principal=Principal(name="ada@x", id="oid-1", roles=frozenset()))


def row(status: ResolutionStatus = ResolutionStatus.Failed, **fields: object) -> EventRow:
    values: dict[str, object] = {
        "event_id": "e-1",
        "message_type": MessageType.ErrorResponse,
        "endpoint_id": "Billing",
        "event_type_id": "InvoiceSent",
        "session_id": "s-1",
        "correlation_id": "c-1",
        "originating_message_id": "o-1",
        "enqueued_time_utc": NOW,
        "updated_at": NOW,
        "resolution_status": status,
        "last_message_id": "m-2",
    }
    values.update(fields)
    return EventRow.model_validate(values)


def parked() -> EventRow:
    return row(ResolutionStatus.Pending, pending_sub_status=HANDOFF_SUB_STATUS)


def claim(state: ClaimState) -> ClaimRow:
    return ClaimRow(
        event_id="e-1",
        parked_message_id="m-2",
        state=state,
        claimed_at=NOW,
        control_message_id="ctl-1",
        message_type=MessageType.ResubmissionRequest,
        settled_by="ops",
        audit_key="a|1",
    )


def content(event_json: str, event_type_id: str | None = None) -> str:
    part = {"EventTypeId": event_type_id, "EventJson": event_json}
    return MessageContent.model_validate({"EventContent": part}).model_dump_json()


def history(sequence: int, kind: MessageType, body: str | None) -> HistoryRow:
    return HistoryRow(
        event_id="e-1",
        message_type=kind,
        endpoint_id="Billing",
        event_type_id="InvoiceSent",
        enqueued_time_utc=NOW,
        message_id=f"m-{sequence}",
        sequence=sequence,
        message_content=body,
    )


def poison(**fields: object) -> PoisonRow:
    values: dict[str, object] = {
        "reason": "bad",
        "enqueued_time_utc": NOW,
        "recorded_at": NOW,
        "application_properties": "{}",
    }
    values.update(fields)
    return PoisonRow.model_validate(values)


# -- what an action may act on ---------------------------------------------------------------------


def test_resubmit_action() -> None:
    assert rules.resubmit_action(None) == rules.RESUBMIT
    assert rules.resubmit_action("{}") == rules.RESUBMIT_WITH_CHANGES


def test_settle_audit_type() -> None:
    assert rules.settle_audit_type(MessageType.HandoffCompletedRequest) == "CompleteHandoff"
    assert rules.settle_audit_type(MessageType.HandoffFailedRequest) == "FailHandoff"


def test_allows() -> None:
    assert rules.allows(row(ResolutionStatus.Completed), rules.RESUBMITTABLE)
    assert not rules.allows(row(ResolutionStatus.Completed), rules.SKIPPABLE)
    assert rules.allows(row(ResolutionStatus.Deferred), rules.SKIPPABLE)
    assert not rules.allows(row(ResolutionStatus.Deferred), rules.RESUBMITTABLE)
    assert not rules.allows(row(ResolutionStatus.Pending), rules.RESUBMITTABLE)
    # A parked hand-off allows both (FR-042).
    assert rules.allows(parked(), rules.RESUBMITTABLE) and rules.allows(parked(), rules.SKIPPABLE)


def test_allowed_actions() -> None:
    assert rules.allowed_actions(parked()) == ["complete", "fail", "resubmit", "skip"]
    assert rules.allowed_actions(row(ResolutionStatus.Failed)) == ["resubmit", "skip"]
    assert rules.allowed_actions(row(ResolutionStatus.Completed)) == ["resubmit"]
    assert rules.allowed_actions(row(ResolutionStatus.Deferred)) == ["skip"]
    assert rules.allowed_actions(row(ResolutionStatus.Pending)) == []


def test_offered_actions() -> None:
    failed = row(ResolutionStatus.Failed)
    assert rules.offered_actions(failed, None) == ["resubmit", "skip"]
    assert rules.offered_actions(failed, claim(ClaimState.superseded)) == ["resubmit", "skip"]
    assert rules.offered_actions(failed, claim(ClaimState.unconfirmed)) == ["mark-delivered", "release"]
    assert rules.offered_actions(failed, claim(ClaimState.sending)) == []


def test_not_allowed() -> None:
    refusal = rules.not_allowed(parked(), rules.SKIP, rules.SKIPPABLE)
    assert isinstance(refusal, Conflict) and refusal.field == "eventId"
    assert "it is Pending + Handoff" in str(refusal)
    assert "(Skip needs DeadLettered, Deferred, Failed, Unsupported)" in str(refusal)


def test_stale_address() -> None:
    assert rules.stale_address(row(), "m-2", rules.SKIP) is None
    refusal = rules.stale_address(row(), "m-1", rules.SKIP)
    assert isinstance(refusal, Conflict) and refusal.field == "messageId"
    assert "(that is 'm-2')" in str(refusal)


# -- the payload a resubmit sends ------------------------------------------------------------------


def test_payload_of() -> None:
    sources = [
        history(1, MessageType.EventRequest, content('{"v": 1}')),
        history(2, MessageType.ResubmissionRequest, content('{"v": 2}', "Edited")),
        history(3, MessageType.ErrorResponse, content('{"v": 3}')),  # a response is not a source
    ]
    assert rules.payload_of(sources, row()) == ("Edited", '{"v": 2}')
    # No source in the history: the row's own message; nothing anywhere: the row's type, no payload.
    assert rules.payload_of([], row(message_content=content('{"v": 9}'))) == ("InvoiceSent", '{"v": 9}')
    assert rules.payload_of([], row()) == ("InvoiceSent", None)


def test_event_part() -> None:
    part = rules.event_part(content("{}", "T"))
    assert part is not None and (part.EventTypeId, part.EventJson) == ("T", "{}")
    assert rules.event_part(None) is None
    assert rules.event_part("not a message") is None


def test_resubmitted_payload() -> None:
    assert rules.resubmitted_payload("e-1", '{"edited": 1}', '{"original": 1}') == '{"edited": 1}'
    assert rules.resubmitted_payload("e-1", None, '{"original": 1}') == '{"original": 1}'
    with pytest.raises(Conflict) as refused:
        rules.resubmitted_payload("e-1", None, None)
    assert refused.value.field == "eventJson"


def test_nesting() -> None:
    assert rules.nesting(1) == 0
    assert rules.nesting({"a": [1, {"b": []}]}) == 4


def test_check_edited_event_json() -> None:
    rules.check_edited_event_json(None)
    rules.check_edited_event_json("[" * rules.MAX_EVENT_JSON_DEPTH + "]" * rules.MAX_EVENT_JSON_DEPTH)
    too_deep = "[" * (rules.MAX_EVENT_JSON_DEPTH + 1) + "]" * (rules.MAX_EVENT_JSON_DEPTH + 1)
    for bad in ("{not json", too_deep):
        with pytest.raises(InvalidInput) as refused:
            rules.check_edited_event_json(bad)
        assert refused.value.field == "eventJson"


# -- what an action sends and audits ---------------------------------------------------------------


def test_action_digest() -> None:
    base = rules.action_digest(MessageType.SkipRequest, row(), ANON, None, "why")
    assert base == rules.action_digest(MessageType.SkipRequest, row(), ANON, None, "why", "m-2")
    assert base != rules.action_digest(MessageType.SkipRequest, row(), ANON, None, "another reason")
    assert base != rules.action_digest(MessageType.SkipRequest, row(), SIGNED, None, "why")
    assert base != rules.action_digest(MessageType.ResubmissionRequest, row(), ANON, None, "why")
    assert base != rules.action_digest(MessageType.SkipRequest, row(), ANON, None, "why", "m-1")


def test_control_coordinates() -> None:
    skip = rules.control_coordinates(MessageType.SkipRequest, row())
    assert (skip.message_id, skip.correlation_id, skip.session_id) == ("m-2", "m-2", "s-1")
    resubmit = rules.control_coordinates(MessageType.ResubmissionRequest, row())
    assert (resubmit.correlation_id, resubmit.originating_message_id) == ("c-1", "o-1")
    with pytest.raises(Conflict):
        rules.control_coordinates(MessageType.SkipRequest, row(last_message_id=None))


def test_check_send_size() -> None:
    rules.check_send_size(MessageType.ResubmissionRequest, MAX_SEND_BYTES)
    with pytest.raises(PayloadTooLarge):
        rules.check_send_size(MessageType.ResubmissionRequest, MAX_SEND_BYTES + 1)


def test_action_audit_data() -> None:
    edited = json.loads(rules.action_audit_data(rules.RESUBMIT_WITH_CHANGES, "ctl", "m-2", "{}", "r", SIGNED))
    assert edited == {
        "controlMessageId": "ctl",
        "addressedMessageId": "m-2",
        "eventJson": "{}",
        "reason": "r",
        "principalName": "ada@x",
        "principalId": "oid-1",
    }
    as_is = json.loads(rules.action_audit_data(rules.RESUBMIT, "ctl", "m-2", "{}", None, ANON))
    assert as_is["eventJson"] is None and as_is["principalName"] is None


def test_access_denied_data() -> None:
    assert json.loads(rules.access_denied_data(SIGNED)) == {"principalName": "ada@x", "principalId": "oid-1"}


def test_resolution_audit_data() -> None:
    unconfirmed = claim(ClaimState.unconfirmed)
    held = json.loads(rules.resolution_audit_data("released", "m-2", unconfirmed, "x", ANON))
    assert held["controlMessageId"] == "ctl-1"  # the claim's, not the one named
    assert (held["messageType"], held["settledBy"]) == ("ResubmissionRequest", "ops")
    none = json.loads(rules.resolution_audit_data("delivered", "m-2", None, "named", ANON))
    assert (none["controlMessageId"], none["messageType"], none["claimedAt"]) == ("named", None, None)


# -- bulk and listings -----------------------------------------------------------------------------


def test_bulk_selection() -> None:
    assert rules.bulk_selection(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_at_least() -> None:
    assert not rules.at_least(rules.COUNT_CAP - 1)
    assert rules.at_least(rules.COUNT_CAP)


def test_counted_status() -> None:
    def counted(
        status: str | None,
        first_page: bool = True,
        types: list[str] | None = None,
        oldest: datetime | None = None,
    ) -> str | None:
        return rules.counted_status(
            status, first_page=first_page, event_type_ids=types or [], oldest=oldest, newest=None
        )

    assert counted("Failed") == "Failed"
    assert counted("Failed", first_page=False) is None  # later pages follow the first one's count
    assert counted(None) is None
    assert counted("Failed", types=["T"]) is None  # narrowed: the status's count is not the listing's
    assert counted("Failed", oldest=NOW) is None


# -- poison ----------------------------------------------------------------------------------------


def test_check_day() -> None:
    assert rules.check_day("20261205") == "20261205"
    for bad in ("2026125", "20261332", "\uff12\uff10\uff12\uff16\uff11\uff12\uff10\uff15", "2026-12-"):
        with pytest.raises(InvalidInput):
            rules.check_day(bad)


def test_replay_kind() -> None:
    assert rules.replay_kind(False) == "ReplayPoison"
    assert rules.replay_kind(True) == "ReplayPoisonWithChanges"


def test_replay_refusal() -> None:
    assert rules.replay_refusal(poison(), "r") is None
    assert rules.replay_refusal(poison(replay_outcome="poisoned"), "r") is None  # after a fix, again
    assert isinstance(rules.replay_refusal(poison(dismissed_at=NOW), "r"), rules.AlreadyDismissed)
    for outcome in rules.PROJECTED:
        assert isinstance(rules.replay_refusal(poison(replay_outcome=outcome), "r"), rules.AlreadyReplayed)


def test_dismissal_refusal() -> None:
    assert rules.dismissal_refusal(poison(), "r") is None
    assert rules.dismissal_refusal(poison(replay_outcome="poisoned"), "r") is None
    assert isinstance(rules.dismissal_refusal(poison(dismissed_at=NOW), "r"), rules.AlreadyDismissed)
    assert isinstance(rules.dismissal_refusal(poison(replay_outcome="applied"), "r"), rules.AlreadyReplayed)


def test_when() -> None:
    assert rules.when(NOW) == "2026-12-05T17:09:56.455Z"
    assert rules.when(None) == "an unknown time"
