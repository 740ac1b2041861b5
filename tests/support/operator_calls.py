"""The operator tests' calls: an event action, a stuck settlement and its resolution, a request as the host
builds it, and a count of the entities storage returns."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import azure.functions as func
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common.clock import utcnow
from handoff import service
from handoff.projection.resolver import RETRY_BUDGET, Outcome
from tests.handoff.broker import Broker, BrokerTransport
from tests.support.handoff_flows import Flow, complete, parked


def act(call, flow: Flow, action: str, body=None, headers=None):
    return call(
        f"event_{action}",
        body,
        route_params={"endpointId": flow.endpoint, "eventId": flow.event_id},
        headers=headers,
    )


def stuck(call: Any, resolve: Any, flow: Flow, broker: Broker, behaviour: str = "lost-before") -> str:
    """A parked hand-off whose settlement is unconfirmed; its control message id."""
    bus = service.transport()
    assert isinstance(bus, BrokerTransport)
    parked(resolve, flow)
    bus.then([behaviour])
    answer = complete(call, flow, settledBy="erp-agent")
    assert answer.status == 202 and answer.json["confirmed"] is False
    service.settlement_service().clock = lambda: utcnow() + timedelta(minutes=3)
    service.reconciler().run()
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None and claim.state.name == "unconfirmed"
    return str(answer.json["controlMessageId"])


def resolve_claim(call: Any, flow: Flow, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return call(
        "event_settlement_resolve",
        body,
        route_params={"endpointId": flow.endpoint, "eventId": flow.event_id},
        headers=headers,
    )


class EntitiesRead(SansIOHTTPPolicy):  # type: ignore[type-arg]
    """Counts the entities storage returns to queries and point reads (what a request can hide: one request
    may return a whole partition)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_response(self, request: Any, response: Any) -> None:
        if request.http_request.method != "GET" or response.http_response.status_code != 200:
            return
        body = json.loads(response.http_response.text() or "{}")
        self.count += len(body["value"]) if isinstance(body.get("value"), list) else 1


def request(headers: dict[str, str]) -> func.HttpRequest:
    return func.HttpRequest("GET", "http://localhost/api/v1/endpoints", headers=headers, body=b"")


def _poison_after_budget(resolve_service, flow: Flow, monkeypatch):
    """A message whose projection kept failing until its retry budget was spent: stored as poison."""
    from tests.support.handoff_flows import _status_error

    resolver = resolve_service
    original = resolver.store.submit

    def throttled(operations):
        if any(str(op[1]["RowKey"]).startswith("ev|") for op in operations):
            raise _status_error(503)  # the projection keeps failing (the poison count goes through)
        return original(operations)

    monkeypatch.setattr(resolver.store, "submit", throttled)
    msg = flow.request(message_id=f"req-{flow.event_id}", ThrottleRetryCount=RETRY_BUDGET - 1)
    assert resolver.handle(msg) is Outcome.POISONED
    monkeypatch.undo()
    return msg


def _day(msg) -> str:
    assert msg.enqueued_time_utc is not None
    return str(msg.enqueued_time_utc.strftime("%Y%m%d"))
