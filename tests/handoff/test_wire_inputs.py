"""Every value the wire can carry: the resolver never raises before its poison
handling, never loses a park to a header it cannot store, and sizes what it stores as storage counts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from handoff import service
from handoff.messages.contract import MessageType, parse_int
from handoff.projection.resolver import Outcome
from tests.support.handoff_flows import Flow, event_of, nimbus


@pytest.fixture(autouse=True)
def fresh_services():
    yield
    service.reset()


def _poison_reasons(msg: Any) -> list[str]:
    day = (msg.enqueued_time_utc or datetime.now(UTC)).strftime("%Y%m%d")
    return [p.reason for p in service.store().poison_rows(day) if p.message_id == msg.message_id]


# --- MessageType is read as .NET's Enum.TryParse reads it ---------------------------------


@pytest.mark.parametrize(
    "raw",
    ["²", "①", "1" * 5_000, "١٢", "\uff11\uff12", "12" + "\u0663", "9" * 20, "+-12", "1_2"],
    ids=[
        "superscript",
        "circled",
        "5000-digits",
        "arabic-indic",
        "fullwidth",
        "mixed",
        "int64",
        "signs",
        "underscore",
    ],
)
def test_a_message_type_net_cannot_parse_is_poison_with_its_reason(resolve, flow: Flow, raw: str) -> None:
    msg = nimbus(raw, endpoint=flow.endpoint, event_id=flow.event_id, to=flow.endpoint)
    # The function returns normally: the host completes the message, nothing is redelivered
    resolve(msg)
    assert service.resolver_service().handle(msg) is Outcome.POISONED
    [reason] = _poison_reasons(msg)
    assert "Unknown MessageType" in reason
    assert service.store().get_event(flow.endpoint, flow.event_id) is None


@pytest.mark.parametrize(("raw", "kind"), [("12", 12), (" 12 ", 12), ("+1", 1), ("012", 12)])
def test_ascii_numeric_message_types_are_read_as_net_reads_them(raw: str, kind: int) -> None:
    assert MessageType.parse(raw) is MessageType(kind)


@pytest.mark.parametrize("raw", ["²", "١٢", "1" * 5_000, "\uff11"])
def test_integer_properties_read_ascii_digits_only(raw: str) -> None:
    assert parse_int(raw) is None


@pytest.mark.usefixtures("settle_tables")
def test_a_delivery_count_or_trace_header_the_resolver_cannot_read_does_not_raise(flow: Flow) -> None:
    msg = flow.request(message_id=f"odd-{flow.event_id}", traceparent="00-" + "z" * 5_000, RetryCount="²")
    msg.__dict__["_delivery_count"] = "①"  # as a broken worker binding could hand it over
    assert service.resolver_service().handle(msg) is Outcome.APPLIED


# --- header values outside what Table Storage can store keep the park ----------------------


@pytest.mark.parametrize(
    ("expected_by", "kept"),
    [
        ("0001-01-01T00:00:00Z", None),  # .NET DateTime.MinValue: an unset DateTime
        ("1600-12-31T23:59:59Z", None),
        ("9999-12-31T23:00:00-05:00", "9999-12-31T23:59:59.999"),  # past the end once in UTC
    ],
    ids=["min-value", "before-1601", "9999-negative-offset"],
)
def test_an_expected_by_storage_cannot_hold_is_noted_and_the_park_is_kept(
    call, flow: Flow, expected_by: str, kept: str | None
) -> None:
    resolver = service.resolver_service()
    session = f"session-{flow.event_id}"  # its own, so that find by session reads this event only
    assert resolver.handle(flow.request(session_id=session)) is Outcome.APPLIED
    assert resolver.handle(flow.park(expected_by=expected_by, session_id=session)) is Outcome.APPLIED
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"]) == ("Pending", "Handoff")
    assert "ExpectedBy" in (row["inputNotes"] or "")
    if kept is None:
        assert row["expectedBy"] is None
    else:
        assert row["expectedBy"].startswith(kept)
    [park] = [h for h in row["history"] if h["messageId"] == "park-1"]
    assert "ExpectedBy" in (park["inputNotes"] or "")
    # The agent still gets it, and the operator views and next keep answering
    nxt = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert nxt.status == 200, nxt.body
    assert nxt.json["coordinates"]["eventId"] == flow.event_id
    assert service.sweeper().sweep() is not None
    _operator_views_list_the_park(call, flow, session, row["expectedBy"])


def _operator_views_list_the_park(call, flow: Flow, session: str, expected_by: str | None) -> None:
    """The operator's event view, the endpoint's listing (all, and the PendingHandoff bucket), its overdue
    list (the queue row's ExpectedBy feeds it), the endpoints overview and ``GET v1/find`` (by event id and by
    session id) answer 200 and show the park as it was kept."""
    endpoint = {"endpointId": flow.endpoint}

    def get(name: str, route: dict[str, str] | None = None, params: dict[str, str] | None = None) -> Any:
        answer = call(name, method="GET", route_params=route or {}, params=params or {})
        assert answer.status == 200, (name, params, answer.status, answer.body[:300])
        return answer.json

    view = get("endpoint_event", {**endpoint, "eventId": flow.event_id})
    assert (view["resolutionStatus"], view["expectedBy"]) == ("Pending", expected_by)
    assert {"complete", "fail"} <= set(view["actions"])
    for bucket in ({}, {"status": "PendingHandoff"}):
        listed = get("endpoint_events", endpoint, bucket)["items"]
        assert [(e["eventId"], e["pendingSubStatus"]) for e in listed] == [(flow.event_id, "Handoff")], bucket
    assert get("endpoint_overdue", endpoint)["items"] == []  # no ExpectedBy, or one not passed yet
    [overview] = [e for e in get("endpoints_overview")["items"] if e["endpointId"] == flow.endpoint]
    assert (overview["counts"]["pendingHandoff"], overview["overdueHandoffs"]) == (1, 0), overview
    for query in ({"eventId": flow.event_id}, {"sessionId": session}):
        found = [e for e in get("find_events", None, query)["items"] if e["endpointId"] == flow.endpoint]
        assert [(e["eventId"], e["pendingSubStatus"]) for e in found] == [(flow.event_id, "Handoff")], query


def test_an_external_job_id_longer_than_a_key_keeps_the_park_without_a_note(call, flow: Flow) -> None:
    resolver = service.resolver_service()
    resolver.handle(flow.request())
    job = "J" * 2_000
    assert resolver.handle(flow.park(job=job)) is Outcome.APPLIED
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"]) == ("Pending", "Handoff")
    assert row["externalJobId"] == job  # NimBus stores it (NVARCHAR(500) there; whole here)
    assert row["inputNotes"] is None  # the lookup index keys the id by its digest (ADR-0022)
    found = call(
        "handoff_job", method="GET", route_params={"endpointId": flow.endpoint, "externalJobId": job}
    )
    assert found.status == 400 and found.json["field"] == "externalJobId"  # the route takes 512 characters
    nxt = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert nxt.status == 200 and nxt.json["coordinates"]["eventId"] == flow.event_id
    # Settling it (by coordinates) works as for any park
    done = resolver.handle(flow.response(MessageType.ResolutionResponse, message_id="done-1"))
    assert done is Outcome.APPLIED
    assert event_of(call, flow)["resolutionStatus"] == "Completed"


# --- size stored text by what storage counts -----------------------------------------------


@pytest.mark.parametrize("char", ["a", "é", "中", "\U0001f600"], ids=["ascii", "latin", "cjk", "astral"])
def test_a_large_terminal_response_settles_whatever_its_script(call, flow: Flow, char: str) -> None:
    resolver = service.resolver_service()
    resolver.handle(flow.request())
    resolver.handle(flow.park())
    text = char * (400_000 if char == "a" else 180_000)
    content = {"EventContent": {"EventTypeId": "T", "EventJson": text}, "ErrorContent": None}
    body = json.dumps(content, ensure_ascii=False).encode("utf-8")  # as .NET sends it: UTF-8, unescaped
    done = flow.response(MessageType.ResolutionResponse, message_id="done-1", body=body)
    assert resolver.handle(done) is Outcome.APPLIED
    row = event_of(call, flow)
    assert row["resolutionStatus"] == "Completed"


# --- one row per (endpoint, event); a park is never lost to another session's message -------


def test_a_failure_in_another_session_does_not_take_the_park_away(call, flow: Flow) -> None:
    resolver = service.resolver_service()
    assert resolver.handle(flow.request(session_id="A")) is Outcome.APPLIED
    assert resolver.handle(flow.park(session_id="A")) is Outcome.APPLIED
    # the same EventId fails in session B (NimBus would keep a second row for it)
    failed = flow.response(
        MessageType.ErrorResponse, message_id="err-B", session_id="B", event_json=None, error_text="boom"
    )
    assert resolver.handle(failed) is Outcome.REFUSED
    row = event_of(call, flow)
    assert (row["resolutionStatus"], row["pendingSubStatus"], row["sessionId"]) == ("Pending", "Handoff", "A")
    assert [h["messageId"] for h in row["history"]][-1] == "err-B"  # kept, in order
    [comment] = [a for a in row["audits"] if a["auditType"] == "Comment"]
    assert "session" in comment["data"] and "B" in comment["data"] and "A" in comment["data"]
    # the park is still offered and still settles
    nxt = call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint})
    assert nxt.status == 200 and nxt.json["coordinates"]["eventId"] == flow.event_id
    done = flow.response(MessageType.ResolutionResponse, message_id="done-A", session_id="A")
    assert resolver.handle(done) is Outcome.APPLIED
    assert event_of(call, flow)["resolutionStatus"] == "Completed"


def test_a_message_of_another_session_applies_once_nothing_is_parked(call, flow: Flow) -> None:
    resolver = service.resolver_service()
    assert resolver.handle(flow.request(session_id="A")) is Outcome.APPLIED
    failed = flow.response(
        MessageType.ErrorResponse, message_id="err-B", session_id="B", event_json=None, error_text="boom"
    )
    assert resolver.handle(failed) is Outcome.APPLIED
    assert event_of(call, flow)["resolutionStatus"] == "Failed"


# --- a table deleted by hand is a 503 naming it, and retried, never poison ---


def test_a_missing_events_table_is_a_503_and_the_resolver_retries_instead_of_poisoning(
    call, fresh_tables: str, flow: Flow, no_sleep: list[float]
) -> None:
    from common import runtime
    from handoff.storage.keys import EVENTS_TABLE

    resolver = service.resolver_service()
    assert resolver.handle(flow.request()) is Outcome.APPLIED
    tables = runtime.tables()
    tables._service_client().delete_table(tables.table(EVENTS_TABLE).table_name)
    for name, route in [
        ("handoff_next", {"endpointId": flow.endpoint}),
        ("event_get", {"endpointId": flow.endpoint, "eventId": flow.event_id}),
    ]:
        answer = call(name, method="GET", route_params=route)
        assert answer.status == 503, (name, answer.status, answer.body[:300])
        assert "does not exist" in answer.json["detail"]
    resolver.redelivery = lambda: None
    with pytest.raises(Exception, match="transiently"):
        resolver.handle(flow.park())
