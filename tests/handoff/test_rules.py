"""The pure rules, without storage: status map, Spec 030 guard, message parsing, key encoding."""

from __future__ import annotations

import pytest

from common.errors import KeyTooLong
from handoff.messages.contract import MessageContent, MessageType, ResolutionStatus, parse_expected_by
from handoff.projection.guard import CurrentRow, allows
from handoff.projection.status_map import STATUS_MAP, pending_sub_status, status_for
from handoff.storage import keys

S = ResolutionStatus
T = MessageType


def row(
    status: ResolutionStatus, kind: MessageType, parent: str | None = "self", last: str | None = "x"
) -> CurrentRow:
    return CurrentRow(
        resolution_status=status, message_type=kind, parent_message_id=parent, last_message_id=last
    )


def test_the_status_map_is_nimbus_s():
    assert {k.name: v.name for k, v in STATUS_MAP.items()} == {
        "EventRequest": "Pending",
        "ResubmissionRequest": "Pending",
        "RetryRequest": "Pending",
        "SkipRequest": "Pending",
        "ContinuationRequest": "Pending",
        "PendingHandoffResponse": "Pending",
        "HandoffCompletedRequest": "Pending",
        "HandoffFailedRequest": "Pending",
        "ErrorResponse": "Failed",
        "ResolutionResponse": "Completed",
        "DeferralResponse": "Deferred",
        "SkipResponse": "Skipped",
        "UnsupportedResponse": "Unsupported",
    }


@pytest.mark.parametrize("kind", [T.ResolutionResponse, T.DeferralResponse, T.EventRequest, T.ErrorResponse])
def test_a_dead_letter_description_wins_over_the_type(kind):
    assert status_for(kind, dead_letter_error_description="x") is S.DeadLettered


def test_only_a_pending_handoff_response_sets_the_handoff_sub_status():
    assert [k.name for k in T if pending_sub_status(k)] == ["PendingHandoffResponse"]


# Spec 030 §6: legitimate transitions apply ...
LEGITIMATE = [
    ("first EventRequest", S.Pending, T.EventRequest, "req-1", None),
    ("redelivery of the same request", S.Pending, T.EventRequest, "req-1", row(S.Pending, T.EventRequest)),
    (
        "deferred drain republish",
        S.Pending,
        T.EventRequest,
        "req-2",
        row(S.Deferred, T.DeferralResponse, "req-1"),
    ),
    (
        "re-deferral over Deferred",
        S.Deferred,
        T.DeferralResponse,
        "def-2",
        row(S.Deferred, T.DeferralResponse, "req-1"),
    ),
    (
        "re-deferral over Pending(request)",
        S.Deferred,
        T.DeferralResponse,
        "def-1",
        row(S.Pending, T.EventRequest),
    ),
    (
        "resubmit over Failed",
        S.Pending,
        T.ResubmissionRequest,
        "rs-1",
        row(S.Failed, T.ErrorResponse, "req-1"),
    ),
    (
        "resubmit over DeadLettered",
        S.Pending,
        T.ResubmissionRequest,
        "rs-1",
        row(S.DeadLettered, T.ErrorResponse, "req-1"),
    ),
    (
        "resubmit over Unsupported",
        S.Pending,
        T.ResubmissionRequest,
        "rs-1",
        row(S.Unsupported, T.UnsupportedResponse, "req-1"),
    ),
    (
        "resubmit over Completed",
        S.Pending,
        T.ResubmissionRequest,
        "rs-1",
        row(S.Completed, T.ResolutionResponse, "req-1"),
    ),
    ("skip request over Failed", S.Pending, T.SkipRequest, "sk-1", row(S.Failed, T.ErrorResponse, "req-1")),
    (
        "skip response (terminal, unguarded)",
        S.Skipped,
        T.SkipResponse,
        "skr",
        row(S.Completed, T.ResolutionResponse, "skr"),
    ),
    (
        "park over Pending(request)",
        S.Pending,
        T.PendingHandoffResponse,
        "p-1",
        row(S.Pending, T.EventRequest),
    ),
    (
        "park over Pending(control)",
        S.Pending,
        T.PendingHandoffResponse,
        "p-1",
        row(S.Pending, T.ResubmissionRequest, "err-1"),
    ),
    (
        "park over Deferred",
        S.Pending,
        T.PendingHandoffResponse,
        "p-1",
        row(S.Deferred, T.DeferralResponse, "req-1"),
    ),
    ("park over Failed", S.Pending, T.PendingHandoffResponse, "p-1", row(S.Failed, T.ErrorResponse, "req-1")),
    (
        "settlement over Pending+Handoff",
        S.Pending,
        T.HandoffCompletedRequest,
        "s-1",
        row(S.Pending, T.PendingHandoffResponse, "req-1"),
    ),
    (
        "failed settlement over Pending+Handoff",
        S.Pending,
        T.HandoffFailedRequest,
        "s-1",
        row(S.Pending, T.PendingHandoffResponse, "req-1"),
    ),
    ("inbox duplicate SkipResponse", S.Skipped, T.SkipResponse, "d", row(S.Completed, T.ResolutionResponse)),
    ("terminal over terminal", S.Completed, T.ResolutionResponse, "r", row(S.Failed, T.ErrorResponse)),
]
# ... and stale copies are refused.
STALE = [
    (
        "late request over Completed",
        S.Pending,
        T.EventRequest,
        "req-1",
        row(S.Completed, T.ResolutionResponse, "req-1"),
    ),
    (
        "late request copy over Completed",
        S.Pending,
        T.EventRequest,
        "req-9",
        row(S.Completed, T.ResolutionResponse, "req-1"),
    ),
    (
        "late request over a park",
        S.Pending,
        T.EventRequest,
        "req-9",
        row(S.Pending, T.PendingHandoffResponse, "req-1"),
    ),
    (
        "late request over a settlement",
        S.Pending,
        T.EventRequest,
        "req-9",
        row(S.Pending, T.HandoffCompletedRequest, "p-1"),
    ),
    ("late request over Failed", S.Pending, T.EventRequest, "req-9", row(S.Failed, T.ErrorResponse, "req-1")),
    (
        "late deferral over Completed",
        S.Deferred,
        T.DeferralResponse,
        "def-1",
        row(S.Completed, T.ResolutionResponse, "req-1"),
    ),
    (
        "late park over Completed",
        S.Pending,
        T.PendingHandoffResponse,
        "p-1",
        row(S.Completed, T.ResolutionResponse, "s-1"),
    ),
    (
        "late park over Skipped",
        S.Pending,
        T.PendingHandoffResponse,
        "p-1",
        row(S.Skipped, T.SkipResponse, "sk-1"),
    ),
    (
        "control request after its own response",
        S.Pending,
        T.ResubmissionRequest,
        "rs-1",
        row(S.Completed, T.ResolutionResponse, "rs-1"),
    ),
    (
        "settlement after its own response",
        S.Pending,
        T.HandoffCompletedRequest,
        "s-1",
        row(S.Completed, T.ResolutionResponse, "s-1"),
    ),
]


@pytest.mark.parametrize(
    ("name", "status", "kind", "message_id", "current"), LEGITIMATE, ids=[c[0] for c in LEGITIMATE]
)
def test_legitimate_transitions_apply(name, status, kind, message_id, current):
    assert allows(status, kind, message_id, current)


@pytest.mark.parametrize(
    ("name", "status", "kind", "message_id", "current"), STALE, ids=[c[0] for c in STALE]
)
def test_stale_copies_are_refused(name, status, kind, message_id, current):
    assert not allows(status, kind, message_id, current)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("EventRequest", T.EventRequest),
        ("12", T.PendingHandoffResponse),
        (13, T.HandoffCompletedRequest),
        ("eventrequest", None),
        ("Bogus", None),
        ("99", None),
        (None, None),
        (True, None),
    ],
)
def test_message_types_parse_like_dotnet_enum_try_parse(raw, expected):
    assert T.parse(raw) is expected


def test_expected_by_parses_the_round_trip_format_and_drops_a_bad_one():
    parsed = parse_expected_by("2026-06-01T09:00:00.0000000Z")
    assert parsed is not None and parsed.isoformat() == "2026-06-01T09:00:00+00:00"
    assert parse_expected_by("next tuesday") is None


def test_the_body_is_written_pascal_case_with_nulls():
    assert MessageContent().to_wire() == '{"EventContent":null,"ErrorContent":null}'


@pytest.mark.parametrize("value", ["plain", "a/b\\c#d?e", "x|y~z%", "tab\there", "\x7f\x9f", "", "ünïcødé"])
def test_key_encoding_round_trips_and_never_contains_a_forbidden_character(value):
    encoded = keys.encode(value)
    assert keys.decode(encoded) == value
    assert not any(c in encoded for c in "/\\#?|~") and all(ord(c) >= 0x20 for c in encoded)


def test_key_encoding_is_injective_on_look_alikes():
    assert len({keys.encode(v) for v in ["a%2Fb", "a/b", "a%252Fb"]}) == 3


def test_a_key_over_one_kib_is_refused_naming_the_field():
    with pytest.raises(KeyTooLong) as err:
        keys.event_row("e" * 600)
    assert err.value.field == "eventId"
