"""The API under the console: poison dismissed and edit-and-replayed, bulk resubmit / skip
(one claim, one message and one audit per event, per-event results, safe to retry), audit search."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common.clock import iso
from handoff import service
from handoff.storage import keys
from handoff.storage.store import classify_event_rows
from tests.support.handoff_flows import Flow, nimbus
from tests.support.operator_calls import resolve_claim, stuck

from .conftest import failed_event, principal_headers


def _day(msg) -> str:
    return str(msg.enqueued_time_utc.strftime("%Y%m%d"))


def _poison_entry(call, msg) -> dict[str, Any]:
    items = call("poison_list", method="GET", params={"day": _day(msg), "pageSize": "200"}).json["items"]
    [entry] = [p for p in items if p["messageId"] == msg.message_id]
    return dict(entry)


def _audits(call, **params: str) -> list[dict[str, Any]]:
    answer = call("audits_search", method="GET", params={"pageSize": "200", **params})
    assert answer.status == 200, answer.body
    return list(answer.json["items"])


def test_poison_no_fix_will_project_is_dismissed_with_a_reason_uncounted_and_audited(call, resolve, flow):
    msg = nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id)
    resolve(msg)
    assert service.overview().counts(flow.endpoint)["Poison"] == 1
    entry = _poison_entry(call, msg)
    route = {"day": _day(msg), "id": entry["id"]}
    # A reason is required: 400 naming it
    missing = call("poison_dismiss", {}, route_params=route)
    assert missing.status == 400 and missing.json["field"] == "reason"
    denied = call("poison_dismiss", {"reason": "x"}, route_params=route, headers=principal_headers("mallory"))
    assert denied.status == 403
    done = call(
        "poison_dismiss", {"reason": "a typo of the old ERP, never resent", "by": "alice"}, route_params=route
    )
    assert done.status == 200, done.body
    assert done.json["dismissedBy"] == "alice" and done.json["dismissReason"].startswith("a typo")
    # The badge returns to 0, the row keeps the record, a second dismissal / a replay is 409
    assert service.overview().counts(flow.endpoint)["Poison"] == 0
    assert _poison_entry(call, msg)["dismissedAt"] is not None
    again = call("poison_dismiss", {"reason": "again"}, route_params=route)
    assert again.status == 409 and again.json["type"] == "urn:settle:problem:already-dismissed"
    assert call("poison_replay", route_params=route).status == 409
    assert service.overview().counts(flow.endpoint)["Poison"] == 0  # uncounted once
    audits = _audits(call, endpointId=flow.endpoint, auditType="DismissPoison")
    assert [(a["auditorName"], a["comment"], a["accessDenied"]) for a in audits] == [
        ("mallory", "Access denied", True),
        ("alice", "a typo of the old ERP, never resent", False),
    ]


def test_poison_is_edited_and_replayed_through_the_resolver(call, resolve, flow):
    # A misspelt type (the helper then addresses it as a response: To = Resolver, From = the endpoint)
    msg = nimbus("EventRequested", endpoint=flow.endpoint, event_id=flow.event_id)
    resolve(msg)
    entry = _poison_entry(call, msg)
    props = dict(entry["applicationProperties"])
    props.update(MessageType="EventRequest", To=flow.endpoint, From="Storefront")
    body = json.loads(entry["messageContent"])
    body["EventContent"]["EventJson"] = '{"invoice": 43}'
    answer = call(
        "poison_replay",
        {"applicationProperties": props, "messageContent": json.dumps(body), "by": "bob"},
        route_params={"day": _day(msg), "id": entry["id"]},
    )
    assert answer.status == 200, answer.body
    assert answer.json["outcome"] == "applied"
    event = call(
        "endpoint_event", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    ).json
    assert event["resolutionStatus"] == "Pending" and event["messageType"] == "EventRequest"
    assert '"invoice": 43' in event["history"][-1]["messageContent"]["EventContent"]["EventJson"]
    assert service.overview().counts(flow.endpoint)["Poison"] == 0
    [audit] = _audits(call, endpointId=flow.endpoint, auditType="ReplayPoisonWithChanges")
    assert audit["auditorName"] == "bob" and audit["comment"] == "applied"
    assert json.loads(audit["data"])["applicationProperties"]["MessageType"] == "EventRequest"


def _failed(resolve, endpoint: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        event = Flow(endpoint=endpoint, event_id=f"bulk-{i}-{uuid.uuid4().hex[:6]}")
        failed_event(resolve, event)
        ids.append(event.event_id)
    return ids


def _control_messages(endpoint: str, event_id: str) -> tuple[int, int]:
    """(claims, audits) of one event: what a bulk action may leave exactly once (the audits as the event
    view shows them: audit rows and the entries rendered from claims, ADR-0022 change 3)."""
    table = service.store().table(keys.EVENTS_TABLE)
    low, high = keys.event_range(event_id)
    pk = service.layout().now().event_partition(endpoint, event_id)
    query = f"PartitionKey eq '{pk}' and RowKey ge '{low}' and RowKey lt '{high}'"
    rows = list(table.query_entities(query))
    claims = sum(str(entity["RowKey"]).split("|")[2] == "c" for entity in rows)
    return claims, len(classify_event_rows(iter(rows))[2])


def test_bulk_resubmit_is_the_single_action_per_event_with_per_event_results(call, resolve, flow, transport):
    ids = _failed(resolve, flow.endpoint, 4)
    done = Flow(endpoint=flow.endpoint, event_id="bulk-pending-" + uuid.uuid4().hex[:6])
    resolve(done.request())  # Pending: nothing to resubmit (NimBus's rules)
    selection = [*ids, done.event_id, "no-such-event", ids[0]]
    answer = call(
        "endpoint_bulk",
        {"action": "resubmit", "eventIds": selection, "reason": "ERP is back", "by": "alice"},
        route_params={"endpointId": flow.endpoint},
    )
    assert answer.status == 200, answer.body
    by_event = {i["eventId"]: i for i in answer.json["items"]}
    assert len(answer.json["items"]) == 6  # a repeated id is acted on once
    assert all(by_event[e]["status"] == 202 for e in ids)
    assert by_event[done.event_id]["status"] == 409 and by_event[done.event_id]["problem"] == "conflict"
    assert by_event["no-such-event"]["status"] == 404
    assert (answer.json["accepted"], answer.json["refused"]) == (4, 2)
    sent = [m for _, m in transport.sent]
    assert sorted(
        str(
            m.application_properties[b"EventId"]
            if b"EventId" in m.application_properties
            else m.application_properties["EventId"]
        )
        for m in sent
    ) == sorted(ids)
    for event_id in ids:
        assert _control_messages(flow.endpoint, event_id) == (1, 1)
        audit = by_event[event_id]["accepted"]["audit"]
        assert audit["auditType"] == "Resubmit" and audit["comment"] == "ERP is back"
    # Safe to repeat as a whole: every event answers from its claim, nothing more is sent or audited
    again = call(
        "endpoint_bulk",
        {"action": "resubmit", "eventIds": ids, "reason": "ERP is back", "by": "alice"},
        route_params={"endpointId": flow.endpoint},
    )
    assert again.status == 200
    assert all(i["status"] == 202 and i["accepted"]["replayed"] for i in again.json["items"])
    assert len(transport.sent) == 4
    assert all(_control_messages(flow.endpoint, e) == (1, 1) for e in ids)
    # A principal without the operator role: 403, one AccessDenied audit per event, nothing sent
    denied = call(
        "endpoint_bulk",
        {"action": "skip", "eventIds": ids[:2]},
        route_params={"endpointId": flow.endpoint},
        headers=principal_headers("mallory"),
    )
    assert denied.status == 403
    assert len(transport.sent) == 4
    assert all(_control_messages(flow.endpoint, e) == (1, 2) for e in ids[:2])
    # The audit search finds them by endpoint, type and operator (one copy per audit, however retried)
    found = _audits(call, endpointId=flow.endpoint, auditType="Resubmit", by="alice")
    assert sorted(a["eventId"] for a in found) == sorted(ids)
    refused = _audits(call, endpointId=flow.endpoint, by="mallory")
    assert sorted((a["eventId"], a["auditType"], a["accessDenied"]) for a in refused) == sorted(
        (e, "Skip", True) for e in ids[:2]
    )


def test_a_bulk_request_names_the_bad_field(call, flow):
    route = {"endpointId": flow.endpoint}
    assert (
        call("endpoint_bulk", {"action": "delete", "eventIds": ["a"]}, route_params=route).json["field"]
        == "action"
    )
    too_many = call(
        "endpoint_bulk", {"action": "skip", "eventIds": [str(i) for i in range(51)]}, route_params=route
    )
    assert too_many.status == 400 and too_many.json["field"] == "eventIds"


def test_audit_search_checks_its_window_and_token(call):
    bad = call(
        "audits_search", method="GET", params={"from": "2026-12-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"}
    )
    assert bad.status == 400 and bad.json["field"] == "from"
    wide = call(
        "audits_search", method="GET", params={"from": "2026-01-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}
    )
    assert wide.status == 400 and wide.json["field"] == "from"
    assert call("audits_search", method="GET", params={"continuationToken": "xx"}).status == 400


@pytest.mark.parametrize(
    "window",
    [
        {"to": "9999-12-31T23:59:59.999999Z"},  # the last instant a time can name: no day after it
        {"from": "9999-12-30T00:00:00Z", "to": "9999-12-31T23:00:00-05:00"},  # past the last instant
        {"from": "1601-01-01T00:00:00Z", "to": "1601-01-01T00:00:00Z"},  # the first instant storage holds
        {"to": "1601-01-01T00:00:00Z"},  # the default day before it is before storage's first
    ],
)
def test_audit_search_at_the_ends_of_time_answers_an_empty_page(call, window):
    # Given a window at either end of what a time can name (the fuzzer's find: the day after the last one
    # overflowed into a 500)
    answer = call("audits_search", method="GET", params=window)
    # Then it is searched like any other: nothing there, no token
    assert answer.status == 200, answer.json
    assert answer.json["items"] == [] and answer.json.get("continuationToken") is None


def test_an_event_is_found_by_id_or_prefix_and_a_session_across_endpoints(call, resolve):
    tag = uuid.uuid4().hex[:8]
    billing, shipping = f"FindB-{tag}", f"FindS-{tag}"
    session = f"customer-{tag}"
    one = Flow(endpoint=billing, event_id=f"inv-{tag}-1")
    two = Flow(endpoint=shipping, event_id=f"inv-{tag}-2")
    other = Flow(endpoint=billing, event_id=f"oth-{tag}")
    resolve(nimbus("EventRequest", endpoint=billing, event_id=one.event_id, session_id=session))
    resolve(nimbus("EventRequest", endpoint=shipping, event_id=two.event_id, session_id=session))
    failed_event(resolve, other)  # another session (the helper's default)
    exact = call("find_events", method="GET", params={"eventId": one.event_id}).json["items"]
    assert [(e["endpointId"], e["eventId"]) for e in exact] == [(billing, one.event_id)]
    prefix = call("find_events", method="GET", params={"eventId": f"inv-{tag}"}).json["items"]
    assert sorted((e["endpointId"], e["eventId"]) for e in prefix) == [
        (billing, one.event_id),
        (shipping, two.event_id),
    ]
    sessions = call("find_events", method="GET", params={"sessionId": session}).json["items"]
    assert [(e["endpointId"], e["eventId"], e["sessionId"]) for e in sessions] == [
        (billing, one.event_id, session),
        (shipping, two.event_id, session),
    ]
    assert call("find_events", method="GET", params={"eventId": "ab"}).json["field"] == "eventId"
    assert call("find_events", method="GET", params={}).status == 400
    failed = call("failed_events", method="GET", params={"pageSize": "200"}).json["items"]
    mine = [e for e in failed if e["endpointId"] in (billing, shipping)]
    assert [(e["eventId"], e["resolutionStatus"], e["reason"]) for e in mine] == [
        (other.event_id, "Failed", "ERP timeout")
    ]


def test_the_events_of_a_session_are_indexed_once_in_the_lookup_index_and_not_in_the_event_partition(
    resolve, flow
):
    resolve(nimbus("EventRequest", endpoint=flow.endpoint, event_id=flow.event_id, session_id="s-1"))
    resolve(
        nimbus(
            "ErrorResponse",
            endpoint=flow.endpoint,
            event_id=flow.event_id,
            session_id="s-1",
            message_id="err-x",
            parent="req-1",
            error_text="boom",
        )
    )
    low, high = keys.exact_kind_range("sessionId")
    ids = service.store().table(keys.IDS_TABLE)
    query = f"PartitionKey eq '{keys.exact_id_partition('s-1')}' and RowKey ge '{low}' and RowKey lt '{high}'"
    named = [(e["EndpointId"], e["EventId"]) for e in ids.query_entities(query)]
    assert named.count((flow.endpoint, flow.event_id)) == 1  # one row, not one per message
    events = service.store().table(keys.EVENTS_TABLE)
    pk = service.layout().now().event_partition(flow.endpoint, flow.event_id)
    legacy = f"PartitionKey eq '{pk}' and RowKey ge 'ss|' and RowKey lt 'ss}}'"
    assert list(events.query_entities(legacy)) == []  # ADR-0022: no session index in the event partition


# -- the audit search holds every operator audit: resolutions and refusals too ------------------------------


def _copies(endpoint: str, audit_type: str) -> list[dict[str, Any]]:
    """The hoaudit rows of one endpoint and type, read directly (however many the search would page)."""
    from management.audits import AUDIT_TABLE

    table = service.store().table(AUDIT_TABLE)
    query = f"EndpointId eq '{endpoint}' and AuditType eq '{audit_type}'"
    return list(table.query_entities(query))


@pytest.mark.parametrize("resolution", ["delivered", "released"])
def test_a_settlement_resolution_is_found_once_however_often_it_is_retried(
    call, resolve, flow, broker, resolution
):
    control = stuck(call, resolve, flow, broker)
    body = {"messageId": "park-1", "controlMessageId": control, "resolution": resolution, "reason": "checked"}
    headers = principal_headers("olivia@contoso.com", "Settle.Operator")
    assert resolve_claim(call, flow, body, headers).status == 200
    found = _audits(call, endpointId=flow.endpoint, auditType="ResolveSettlement")
    assert [(a["auditorName"], a["comment"], a["eventId"]) for a in found] == [
        ("olivia@contoso.com", "checked", flow.event_id)
    ]
    assert json.loads(found[0]["data"])["resolution"] == resolution
    by_olivia = _audits(call, by="olivia@contoso.com", auditType="ResolveSettlement")  # every endpoint
    assert [a for a in by_olivia if a["eventId"] == flow.event_id] == found
    # A retry is answered as done and lands on the same copy
    again = resolve_claim(call, flow, body, headers)
    assert again.status == 200 and again.json["replayed"] is True
    assert _audits(call, endpointId=flow.endpoint, auditType="ResolveSettlement") == found
    # A copy lost to a crash between the resolution and its copy is written again by the retry, once
    from management.audits import AUDIT_TABLE

    [copy] = _copies(flow.endpoint, "ResolveSettlement")
    service.store().table(AUDIT_TABLE).delete_entity(copy["PartitionKey"], copy["RowKey"])
    assert resolve_claim(call, flow, body, headers).json["replayed"] is True
    assert resolve_claim(call, flow, body, headers).json["replayed"] is True
    assert _audits(call, endpointId=flow.endpoint, auditType="ResolveSettlement") == found
    assert [c["RowKey"] for c in _copies(flow.endpoint, "ResolveSettlement")] == [copy["RowKey"]]


def test_refused_event_actions_are_found_by_who_was_denied(call, resolve, flow, broker):
    failed_event(resolve, flow)
    route = {"endpointId": flow.endpoint, "eventId": flow.event_id}
    mallory = principal_headers("mallory")
    assert call("event_resubmit", {"reason": "x"}, route_params=route, headers=mallory).status == 403
    assert call("event_skip", {}, route_params=route, headers=mallory).status == 403
    assert call("event_resubmit", {}, route_params=route, headers=mallory).status == 403
    found = _audits(call, endpointId=flow.endpoint, by="mallory")
    assert [(a["auditType"], a["comment"], a["accessDenied"], a["eventId"]) for a in found] == [
        ("Resubmit", "Access denied", True, flow.event_id),
        ("Skip", "Access denied", True, flow.event_id),
        ("Resubmit", "Access denied", True, flow.event_id),  # each refusal is its own audit
    ]
    # As many copies as the event has AccessDenied audits
    event = call("endpoint_event", method="GET", route_params=route).json
    assert sum(a["accessDenied"] for a in event["audits"]) == 3
    # A refused resolution of a stuck settlement too
    other = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-stuck")
    control = stuck(call, resolve, other, broker)
    body = {"messageId": "park-1", "controlMessageId": control, "resolution": "released", "reason": "x"}
    assert resolve_claim(call, other, body, mallory).status == 403
    [refused] = _audits(call, endpointId=flow.endpoint, by="mallory", auditType="ResolveSettlement")
    assert (refused["eventId"], refused["accessDenied"]) == (other.event_id, True)


# -- the audit search selects by time and pages without losing or repeating an audit ----------------------

_DAY = datetime(2026, 11, 20, tzinfo=UTC)
# Refusals recorded at known times (the clock of the operator actions): two at the end of one UTC day, three
# in the first two milliseconds of the next (two in the same millisecond), one at noon.
_TIMES = [
    _DAY + timedelta(hours=23, minutes=59, seconds=59, microseconds=998_500),
    _DAY + timedelta(hours=23, minutes=59, seconds=59, microseconds=999_900),
    _DAY + timedelta(days=1),
    _DAY + timedelta(days=1, microseconds=700),
    _DAY + timedelta(days=1, microseconds=1_000),
    _DAY + timedelta(days=1, hours=12, microseconds=250_300),
]


def _ms(value: datetime) -> str:
    """A time as the API writes it (UTC, to the millisecond, Z), which is what an operator types back."""
    return iso(value)


def _window(call, endpoint: str, low: datetime | str, high: datetime | str, **params: str) -> list[str]:
    items = _audits(
        call,
        endpointId=endpoint,
        **{
            "from": low if isinstance(low, str) else _ms(low),
            "to": high if isinstance(high, str) else _ms(high),
        },
        **params,
    )
    return [a["auditorName"] for a in items]


@pytest.fixture
def audits_at_known_times(call, resolve, flow, monkeypatch) -> list[str]:
    """One refused resubmit per time of ``_TIMES``, by ``probe-{i}``: their auditor names, in time order."""
    from management import services
    from management.actions import OperatorActions

    failed_event(resolve, flow)
    now = iter(_TIMES)
    monkeypatch.setattr(
        services,
        "operator_actions",
        lambda: OperatorActions(service.settlement_service(), clock=lambda: next(now)),
    )
    route = {"endpointId": flow.endpoint, "eventId": flow.event_id}
    names = [f"probe-{i}" for i in range(len(_TIMES))]
    for name in names:
        refused = call("event_resubmit", {}, route_params=route, headers=principal_headers(name))
        assert refused.status == 403
    shown = _audits(
        call, endpointId=flow.endpoint, **{"from": _ms(_DAY), "to": _ms(_DAY + timedelta(days=2))}
    )
    assert [(a["auditorName"], a["auditTimestamp"]) for a in shown] == [
        (name, _ms(at)) for name, at in zip(names, _TIMES, strict=True)
    ]
    return names


def test_audit_search_from_and_to_include_and_exclude_by_the_time_shown(call, flow, audits_at_known_times):
    p = audits_at_known_times
    t = _TIMES
    one_ms = timedelta(milliseconds=1)
    # Both ends included, to the millisecond an audit's time is shown with (an operator types it back)
    assert _window(call, flow.endpoint, t[1], t[1]) == [p[1]]
    assert _window(call, flow.endpoint, t[2], t[3]) == [p[2], p[3]]  # two audits in one millisecond
    assert _window(call, flow.endpoint, t[0], t[4]) == p[:5]  # across the UTC day
    assert _window(call, flow.endpoint, t[1], t[2]) == [p[1], p[2], p[3]]
    # A millisecond either side leaves an audit out
    assert _window(call, flow.endpoint, t[0] + one_ms, t[4] - one_ms) == [p[1], p[2], p[3]]
    assert _window(call, flow.endpoint, t[4] + one_ms, t[5] - one_ms) == []
    assert _window(call, flow.endpoint, _DAY, t[0] - one_ms) == []
    assert _window(call, flow.endpoint, t[5] + one_ms, _DAY + timedelta(days=2)) == []
    # The same instants written with an offset select the same audits
    assert _window(call, flow.endpoint, "2026-11-21T00:59:59.999+01:00", "2026-11-20T19:00:00.000-05:00") == [
        p[1],
        p[2],
        p[3],
    ]
    # Other filters narrow a window, never widen it
    assert _window(call, flow.endpoint, _DAY, _DAY + timedelta(days=2), by=p[5]) == [p[5]]
    assert _window(call, flow.endpoint, t[0], t[1], by=p[5]) == []
    assert _window(call, flow.endpoint, _DAY, _DAY + timedelta(days=2), auditType="Skip") == []


@pytest.mark.parametrize("page_size", [1, 2, 3, 4])
def test_audit_search_pages_follow_the_token_without_a_gap_or_a_repeat(
    call, flow, audits_at_known_times, page_size
):
    window = {"endpointId": flow.endpoint, "from": _ms(_DAY), "to": _ms(_DAY + timedelta(days=2))}
    pages: list[list[str]] = []
    token = None
    while True:
        params = {**window, "pageSize": str(page_size)} | ({"continuationToken": token} if token else {})
        answer = call("audits_search", method="GET", params=params)
        assert answer.status == 200, answer.body
        pages.append([a["auditorName"] for a in answer.json["items"]])
        token = answer.json["continuationToken"]
        if token is None:
            break
        assert len(pages) <= len(_TIMES)
    assert [name for page in pages for name in page] == audits_at_known_times
    assert all(len(page) == page_size for page in pages[:-1]) and 0 < len(pages[-1]) <= page_size
    assert len(pages) == -(-len(_TIMES) // page_size)
    # A token is only good for its own window
    first = call("audits_search", method="GET", params={**window, "pageSize": "2"}).json["continuationToken"]
    moved = {**window, "from": _ms(_TIMES[2]), "continuationToken": first}
    assert call("audits_search", method="GET", params=moved).status == 400
