"""Every stuck settlement has a human way out: an unconfirmed claim is listed, counted on the overview,
and resolved by an operator (mark delivered / release), audited with who and why; overdue hand-offs
are listed and counted; the event view offers only actions that can succeed.

The unconfirmed claim is made the way it arises in service: topics without duplicate detection, a send
whose outcome is unknown, the reconciler past its confirmation wait (the test's clock).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest

from common.clock import utcnow
from handoff import service
from tests.support.handoff_flows import Flow, complete, event_of, parked
from tests.support.operator_calls import resolve_claim, stuck

from .conftest import principal_headers


def overview_of(call: Any, endpoint: str) -> dict[str, Any]:
    answer = call("endpoints_overview", method="GET")
    assert answer.status == 200, answer.body
    [item] = [i for i in answer.json["items"] if i["endpointId"] == endpoint]
    return dict(item)


def detail(call: Any, flow: Flow) -> dict[str, Any]:
    answer = call(
        "endpoint_event", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    )
    assert answer.status == 200, answer.body
    return dict(answer.json)


def test_an_unconfirmed_settlement_is_listed_counted_and_offers_only_its_resolutions(
    call, resolve, flow, broker
):
    control = stuck(call, resolve, flow, broker)
    listed = call("endpoint_unconfirmed", method="GET", route_params={"endpointId": flow.endpoint})
    assert listed.status == 200, listed.body
    [item] = listed.json["items"]
    assert (item["eventId"], item["controlMessageId"], item["settledBy"]) == (
        flow.event_id,
        control,
        "erp-agent",
    )
    assert overview_of(call, flow.endpoint)["unconfirmed"] == 1
    shown = detail(call, flow)
    assert shown["actions"] == ["mark-delivered", "release"]
    assert shown["settlement"]["state"] == "unconfirmed"
    assert shown["settlement"]["controlMessageId"] == control
    # Everything else could only be 409 now
    for action in ("complete", "fail", "resubmit", "skip"):
        body = {"errorText": "x"} if action == "fail" else {}
        answer = call(
            f"event_{action}", body, route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
        )
        assert answer.status == 409, (action, answer.body)


def test_marking_it_delivered_is_audited_with_who_and_why_and_a_retry_is_safe(call, resolve, flow, broker):
    control = stuck(call, resolve, flow, broker, behaviour="deliver-then-raise")
    headers = principal_headers("olivia@contoso.com", "Settle.Operator")
    body = {
        "messageId": "park-1",
        "controlMessageId": control,
        "resolution": "delivered",
        "reason": "ERP shows the import",
    }
    answer = resolve_claim(call, flow, body, headers)
    assert answer.status == 200, answer.body
    assert answer.json["state"] == "delivered" and answer.json["replayed"] is False
    again = resolve_claim(call, flow, body, headers)
    assert again.status == 200 and again.json["replayed"] is True
    resolutions = [a for a in event_of(call, flow)["audits"] if a["auditType"] == "ResolveSettlement"]
    assert len(resolutions) == 1
    [audit] = resolutions
    assert audit["auditorName"] == "olivia@contoso.com" and audit["comment"] == "ERP shows the import"
    assert json.loads(audit["data"])["resolution"] == "delivered"
    assert json.loads(audit["data"])["controlMessageId"] == control
    # times in answers have one format: UTC, to the millisecond, with a Z (README)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", json.loads(audit["data"])["claimedAt"])
    assert overview_of(call, flow.endpoint)["unconfirmed"] == 0
    listed = call("endpoint_unconfirmed", method="GET", route_params={"endpointId": flow.endpoint})
    assert listed.json["items"] == []
    # Still one settlement of that hand-off: a second one is refused
    assert complete(call, flow, settledBy="someone-else").status == 409
    assert len(broker.delivered) == 1


def test_releasing_it_frees_the_hand_off_for_one_new_settlement(call, resolve, flow, broker):
    control = stuck(call, resolve, flow, broker)  # the send never reached the broker
    body = {
        "messageId": "park-1",
        "controlMessageId": control,
        "resolution": "released",
        "reason": "not in ERP",
    }
    answer = resolve_claim(call, flow, body | {"by": "olivia"})
    assert answer.status == 200, answer.body
    assert answer.json["state"] == "released"
    assert resolve_claim(call, flow, body | {"by": "olivia"}).json["replayed"] is True
    assert service.store().get_claim(flow.endpoint, flow.event_id, "park-1") is None
    # Offered to agents again, and settled once more
    assert call("handoff_next", method="GET", route_params={"endpointId": flow.endpoint}).status == 200
    again = complete(call, flow, settledBy="erp-agent", result={"retry": True})
    assert again.status == 202 and again.json["confirmed"] is True
    assert again.json["controlMessageId"] != control
    assert len(broker.delivered) == 1
    types = [a["auditType"] for a in event_of(call, flow)["audits"]]
    assert types.count("ResolveSettlement") == 1 and types.count("CompleteHandoff") == 2


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"messageId": "park-1", "resolution": "released"}, 400, "reason"),
        ({"messageId": "park-1", "resolution": "lost", "reason": "x"}, 400, "resolution"),
        ({"resolution": "released", "reason": "x"}, 400, "messageId"),
    ],
)
def test_bad_resolutions_name_the_field(call, resolve, flow, broker, body, status, field):
    stuck(call, resolve, flow, broker)
    answer = resolve_claim(call, flow, body)
    assert answer.status == status and answer.json["field"] == field


def test_a_settlement_that_is_not_unconfirmed_cannot_be_resolved(call, resolve, flow, broker):
    parked(resolve, flow)
    sent = complete(call, flow)
    assert sent.json["confirmed"] is True
    body = {"messageId": "park-1", "resolution": "released", "reason": "x"}
    answer = resolve_claim(call, flow, body)
    assert answer.status == 409 and "sent" in answer.json["detail"]
    assert resolve_claim(call, flow, body | {"messageId": "park-9"}).status == 404


def test_overdue_hand_offs_are_listed_and_counted(call, resolve, flow, broker):
    overdue = (utcnow() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    parked(resolve, flow, expected_by=overdue)
    fresh = Flow(endpoint=flow.endpoint, event_id=flow.event_id + "-later")
    parked(resolve, fresh, expected_by=(utcnow() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    listed = call("endpoint_overdue", method="GET", route_params={"endpointId": flow.endpoint})
    assert listed.status == 200, listed.body
    assert [i["eventId"] for i in listed.json["items"]] == [flow.event_id]
    assert overview_of(call, flow.endpoint)["overdueHandoffs"] == 1
