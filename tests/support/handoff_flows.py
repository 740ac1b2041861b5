"""The hand-off tests' messages and calls: NimBus messages as the resolver subscription delivers them, one
event's messages addressed consistently (:class:`Flow`), a parked hand-off and its settlement over HTTP."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse
from azure.functions.servicebus import ServiceBusMessage

from handoff.messages.contract import MessageType

EVENT_TYPE = "Billing.InvoiceCreated"


T0 = datetime(2026, 11, 30, 9, 0, 0, tzinfo=UTC)


def nimbus(
    message_type: MessageType | str,
    *,
    endpoint: str,
    event_id: str,
    message_id: str | None = None,
    session_id: str | None = "session-1",
    correlation_id: str | None = None,
    parent: str | None = None,
    originating: str | None = None,
    from_: str | None = "default",
    to: str | None = "default",
    event_type: str | None = EVENT_TYPE,
    event_json: str | None = '{"invoice": 42}',
    error_text: str | None = None,
    body: bytes | None = None,
    enqueued: datetime | None = None,
    delivery_count: int = 1,
    drop: tuple[str, ...] = (),
    **props: Any,
) -> ServiceBusMessage:
    """A message as the resolver subscription delivers it (after NimBus's forwarding rules)."""
    kind = (
        MessageType[message_type]
        if isinstance(message_type, str) and message_type in MessageType.__members__
        else message_type
    )
    is_request = isinstance(kind, MessageType) and kind.is_request
    if to == "default":
        to = endpoint if is_request else "Resolver"
    if from_ == "default":
        from_ = "Storefront" if kind is MessageType.EventRequest else ("Manager" if is_request else endpoint)
    application: dict[str, Any] = {
        "MessageType": kind.name if isinstance(kind, MessageType) else kind,
        "EventId": event_id,
        "OriginatingMessageId": originating or "self",
        "ParentMessageId": parent or "self",
        "RetryCount": 0,
        "OriginatingFrom": "self",
    }
    if to is not None:
        application["To"] = to
    if from_ is not None:
        application["From"] = from_
    if event_type is not None:
        application["EventTypeId"] = event_type
    application.update({k: v for k, v in props.items() if v is not None})
    for name in drop:
        application.pop(name, None)
    if body is None:
        content: dict[str, Any] = {"EventContent": None, "ErrorContent": None}
        if event_json is not None:
            content["EventContent"] = {"EventTypeId": event_type, "EventJson": event_json}
        if error_text is not None:
            content["ErrorContent"] = {
                "ErrorText": error_text,
                "ErrorType": "InvalidOperationException",
                "ExceptionStackTrace": None,
                "ExceptionSource": None,
            }
        body = json.dumps(content).encode()
    return ServiceBusMessage(
        body=body,
        message_id=message_id or str(uuid.uuid4()),
        application_properties=application,
        user_properties={},
        session_id=session_id,
        correlation_id=correlation_id,
        enqueued_time_utc=enqueued or datetime.now(UTC),
        delivery_count=delivery_count,
    )


@dataclass
class Flow:
    """One event's messages, addressed consistently (endpoint, event, session)."""

    endpoint: str
    event_id: str
    request_id: str = "req-1"

    def request(self, **kw: Any) -> ServiceBusMessage:
        kw.setdefault("message_id", self.request_id)
        return nimbus(MessageType.EventRequest, endpoint=self.endpoint, event_id=self.event_id, **kw)

    def response(self, kind: MessageType, **kw: Any) -> ServiceBusMessage:
        kw.setdefault("parent", self.request_id)
        kw.setdefault("correlation_id", self.request_id)
        return nimbus(kind, endpoint=self.endpoint, event_id=self.event_id, **kw)

    def park(
        self,
        *,
        message_id: str = "park-1",
        job: str | None = "job-1",
        expected_by: str | None = None,
        **kw: Any,
    ) -> ServiceBusMessage:
        return self.response(
            MessageType.PendingHandoffResponse,
            message_id=message_id,
            HandoffReason="Awaiting DMF import",
            ExternalJobId=job,
            ExpectedBy=expected_by,
            **kw,
        )

    def control(self, kind: MessageType, **kw: Any) -> ServiceBusMessage:
        kw.setdefault("from_", "Manager")
        return nimbus(kind, endpoint=self.endpoint, event_id=self.event_id, **kw)


def event_of(call: Any, flow: Flow) -> dict[str, Any]:
    result = call(
        "event_get", method="GET", route_params={"endpointId": flow.endpoint, "eventId": flow.event_id}
    )
    assert result.status == 200, result.body
    data: dict[str, Any] = result.json
    return data


def later(minutes: float) -> datetime:
    return datetime.now(UTC) + timedelta(minutes=minutes)


def parked(resolve, flow: Flow, **park) -> None:
    resolve(flow.request(correlation_id="corr-1"))
    resolve(flow.park(correlation_id="corr-1", originating="req-1", **park))


def coordinates(flow: Flow, message_id: str = "park-1", **overrides):
    coords = {
        "eventId": flow.event_id,
        "sessionId": "session-1",
        "messageId": message_id,
        "eventTypeId": EVENT_TYPE,
        "correlationId": "corr-1",
        "originatingMessageId": "req-1",
    }
    coords.update(overrides)
    return coords


def complete(call, flow: Flow, **body):
    body.setdefault("endpointId", flow.endpoint)
    body.setdefault("coordinates", coordinates(flow))
    return call("handoff_complete", body)


def fail(call, flow: Flow, **body):
    body.setdefault("endpointId", flow.endpoint)
    body.setdefault("coordinates", coordinates(flow))
    body.setdefault("errorText", "DMF import rejected 3 rows")
    return call("handoff_fail", body)


def props(message) -> dict[str, object]:
    return {str(k): v for k, v in (message.application_properties or {}).items()}


def body_of(message) -> dict[str, object]:
    body: dict[str, object] = json.loads(b"".join(message.body))
    return body


def _status_error(status: int | None) -> Exception:
    from azure.core.exceptions import HttpResponseError

    error = HttpResponseError(message=f"storage answered {status} (test)")
    error.status_code = status
    return error


def park(
    resolve,
    endpoint: str,
    event_id: str,
    *,
    at: datetime,
    event_type: str = "Billing.InvoiceCreated",
    job: str | None = None,
) -> Flow:
    flow = Flow(endpoint=endpoint, event_id=event_id)
    resolve(flow.request(event_type=event_type, enqueued=at - timedelta(seconds=1)))
    resolve(flow.park(event_type=event_type, enqueued=at, job=job or f"job-{event_id}"))
    return flow


def receive(call: Any, endpoint: str, agent: str = "agent-1", **params: str) -> Any:
    return call(
        "handoff_receive",
        None,
        route_params={"endpointId": endpoint},
        params=params,
        headers={"x-agent-id": agent},
    )


def lease_call(call: Any, what: str, endpoint: str, event_id: str, token: str, **extra: Any) -> Any:
    return call(
        f"handoff_lease_{what}",
        {"eventId": event_id, "leaseToken": token, **extra},
        route_params={"endpointId": endpoint},
    )


def settle_leased(call: Any, flow: Flow, token: str | None, agent: str) -> Any:
    extra: dict[str, Any] = {"settledBy": agent}
    if token is not None:
        extra["leaseToken"] = token
    coords = {"eventId": flow.event_id, "messageId": "park-1"}
    return complete(call, flow, coordinates=coords, **extra)


class RecordingRedelivery:
    def __init__(self, *, fail: bool = False) -> None:
        self.scheduled: list[tuple[str, float, int]] = []
        self.fail = fail

    def schedule_copy(self, msg, *, delay_s: float, throttle_retry_count: int) -> None:
        if self.fail:
            raise ConnectionError("Service Bus down too")
        self.scheduled.append((msg.message_id, delay_s, throttle_retry_count))


class Undecodable(HTTPPolicy):  # type: ignore[type-arg]
    """The chosen storage request (by HTTP method) is applied, and its 200 answer arrives cut short, so
    its JSON cannot be decoded (a proxy or a connection dropping mid-body). The Tables SDK raises that as
    an ``HttpResponseError`` with status 200 whose cause is a ``DecodeError``."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self.method = method
        self.armed = 0

    def send(self, request: Any) -> Any:
        response = self.next.send(request)
        if not (self.armed and request.http_request.method == self.method):
            return response
        self.armed -= 1

        raw = requests.Response()
        raw.status_code = 200
        raw.reason = "OK"
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        raw._content = b'{"odata.metadata":"https://example/$metadata#events/@Element","PartitionKey":"'
        cut = RequestsTransportResponse(request.http_request, raw)
        return PipelineResponse(request.http_request, cut, request.context)
