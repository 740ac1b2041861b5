"""Operator and agent inputs: deep JSON is a 400, a principal is recorded only
where App Service authentication vouches for it, large principals work, and a replay is authorised before
anything about the poison row is told."""

from __future__ import annotations

import base64
import json

import pytest

from common.principal import Unauthenticated, actor_of, allowed
from handoff import service
from handoff.projection.resolver import Outcome
from tests.support.handoff_flows import Flow, event_of, nimbus

from .conftest import failed_event, principal_headers


@pytest.fixture(autouse=True)
def fresh_services():
    yield
    service.reset()


def test_a_resubmit_payload_nested_too_deep_is_a_400_naming_it(call, resolve, flow: Flow, transport) -> None:
    failed_event(resolve, flow)
    deep = "[" * 3_000 + "]" * 3_000
    answer = call(
        "event_resubmit",
        {"eventJson": deep},
        route_params={"endpointId": flow.endpoint, "eventId": flow.event_id},
    )
    assert answer.status == 400, answer.body
    assert answer.json["field"] == "eventJson"
    assert transport.sent == []


# --- the agent settlement audit records a principal only where it is vouched for ------------


def _parked(flow: Flow) -> None:
    resolver = service.resolver_service()
    resolver.handle(flow.request())
    assert resolver.handle(flow.park()) is Outcome.APPLIED


def _complete(call, flow: Flow, headers: dict[str, str]):
    body = {
        "endpointId": flow.endpoint,
        "coordinates": {"eventId": flow.event_id, "messageId": "park-1"},
        "result": {"ok": True},
    }
    return call("handoff_complete", body, headers=headers)


@pytest.mark.parametrize("setting", [None, "disabled", "optional"])
def test_a_forged_principal_on_a_settlement_is_recorded_as_the_caller_s_claim(
    call, flow: Flow, transport, monkeypatch, setting: str | None
) -> None:
    _parked(flow)
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    if setting is None:
        monkeypatch.delenv("SETTLE_OPERATOR_AUTH", raising=False)
    else:
        monkeypatch.setenv("SETTLE_OPERATOR_AUTH", setting)
    forged = {"x-ms-client-principal-name": "ceo@contoso.com", "x-ms-client-principal-id": "ceo-id"}
    answer = _complete(call, flow, forged)
    assert answer.status == 202, answer.body
    monkeypatch.delenv("WEBSITE_INSTANCE_ID")
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH", raising=False)
    [audit] = [a for a in event_of(call, flow)["audits"] if a["auditType"] == "CompleteHandoff"]
    assert audit["principalName"] != "ceo@contoso.com"
    assert "claim" in (audit["principalName"] or "") and "not authenticated" in audit["principalName"]
    assert json.loads(audit["data"])["principalName"] == audit["principalName"]


def test_a_principal_app_service_vouches_for_is_recorded_on_the_settlement(
    call, flow: Flow, transport, monkeypatch
) -> None:
    _parked(flow)
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    headers = {"x-ms-client-principal-name": "agent@contoso.com", "x-ms-client-principal-id": "agent-id"}
    assert _complete(call, flow, headers).status == 202
    monkeypatch.delenv("WEBSITE_INSTANCE_ID")
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH")
    [audit] = [a for a in event_of(call, flow)["audits"] if a["auditType"] == "CompleteHandoff"]
    assert (audit["principalName"], audit["principalId"]) == ("agent@contoso.com", "agent-id")


def test_optional_operator_auth_on_app_service_is_refused_not_anonymous(monkeypatch) -> None:
    from tests.support.operator_calls import request

    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "optional")
    with pytest.raises(Unauthenticated, match="optional"):
        actor_of(request({}), by="anyone")
    with pytest.raises(Unauthenticated):
        actor_of(request(principal_headers("eve", "Settle.Operator")))


# --- a principal with many group claims -------------------------------------------------------------


def large_principal(*roles: str) -> dict[str, str]:
    """The headers App Service passes for a user with 200 group claims: the principal document is over
    16 KiB once base64-encoded (17,816 characters were measured)."""
    groups = [{"typ": "groups", "val": f"{i:08d}-0000-0000-0000-000000000000"} for i in range(200)]
    document = {
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": "roles",
        "claims": [{"typ": "name", "val": "olivia"}, *groups, *({"typ": "roles", "val": r} for r in roles)],
    }
    encoded = base64.b64encode(json.dumps(document).encode()).decode()
    assert len(encoded) > 16_384
    return {
        "x-ms-client-principal": encoded,
        "x-ms-client-principal-name": "olivia",
        "x-ms-client-principal-id": "olivia-id",
    }


def test_an_operator_with_a_principal_header_over_16_kib_may_operate(monkeypatch) -> None:
    from tests.support.operator_calls import request

    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    actor = actor_of(request(large_principal("Settle.Operator")))
    assert allowed(actor) and actor.by == "olivia"


def test_an_operator_with_a_principal_header_over_16_kib_reads_and_acts_through_the_routes(
    call, resolve, flow: Flow, transport, monkeypatch
) -> None:
    """A large principal through the HTTP functions (not only actor_of): on App Service, with
    authentication required, the operator's reads answer 200 and an action is sent and audited under her
    name, not refused 403."""
    failed_event(resolve, flow)
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "abc123")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    olivia = large_principal("Settle.Operator")
    event = {"endpointId": flow.endpoint, "eventId": flow.event_id}
    reads = [
        ("endpoints_overview", {}, {}),
        ("endpoint_events", {"endpointId": flow.endpoint}, {"status": "Failed"}),
        ("endpoint_event", event, {}),
        ("find_events", {}, {"eventId": flow.event_id}),
    ]
    for name, route, params in reads:
        answer = call(name, method="GET", route_params=route, params=params, headers=olivia)
        assert answer.status == 200, (name, answer.status, answer.body[:300])
    answer = call("event_resubmit", {"reason": "ERP is back"}, route_params=event, headers=olivia)
    assert answer.status == 202, answer.body
    assert len(transport.sent) == 1
    # the size is not what decides: the same large document without the role is refused, nothing sent
    nobody = large_principal()
    assert call("endpoints_overview", method="GET", headers=nobody).status == 403
    refused = call("event_skip", {"reason": "not mine"}, route_params=event, headers=nobody)
    assert refused.status == 403, refused.body
    assert len(transport.sent) == 1
    monkeypatch.delenv("WEBSITE_INSTANCE_ID")
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH")
    audits = [
        (a["auditType"], a["auditorName"], a["principalId"], a["accessDenied"])
        for a in event_of(call, flow)["audits"]
    ]
    assert audits == [("Resubmit", "olivia", "olivia-id", False), ("Skip", "olivia", "olivia-id", True)]


# --- authorisation before existence ----------------------------------------------------------------


@pytest.mark.parametrize("action", ["poison_replay", "poison_dismiss"])
def test_a_replay_refused_for_lack_of_the_role_does_not_tell_whether_the_row_exists(
    call, resolve, flow: Flow, action: str
) -> None:
    msg = nimbus("Bogus", endpoint=flow.endpoint, event_id=flow.event_id)
    resolve(msg)
    assert msg.enqueued_time_utc is not None
    day = msg.enqueued_time_utc.strftime("%Y%m%d")
    items = call("poison_list", method="GET", params={"day": day, "pageSize": "200"}).json["items"]
    [entry] = [p for p in items if p["messageId"] == msg.message_id]
    mallory = principal_headers("mallory")
    body = {"reason": "not mine to clear"} if action == "poison_dismiss" else None
    there = call(action, body, route_params={"day": day, "id": entry["id"]}, headers=mallory)
    absent = call(action, body, route_params={"day": day, "id": "nope"}, headers=mallory)
    assert (there.status, absent.status) == (403, 403)
    assert there.json["type"] == absent.json["type"] == "urn:settle:problem:access-denied"
