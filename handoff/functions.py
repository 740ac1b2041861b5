"""The handoff blueprint: its Functions (HTTP, timer, resolver). Thin: parse, call a service, answer.

The API's models and the settlement, receive and sweeper modules are imported by the function that needs
them: indexing and a cold start load none of them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import azure.functions as func
from pydantic import BaseModel

from common import invocation, openapi, telemetry
from common.errors import InvalidInput
from common.http import Handler, operation, parse_body, path_parameter
from common.models import from_fields
from common.principal import headers_vouched
from common.settings import env_flag
from handoff import limits, service
from handoff.messages.contract import MessageType

if TYPE_CHECKING:
    from handoff.models import (
        EventView,
        LeasedHandoffView,
        LeaseReleased,
        LeaseRequest,
        LeaseView,
        PendingHandoffView,
        SettlementAccepted,
        UnconfirmedList,
    )
    from handoff.receive.receiver import Lease


# The API's models, imported when a route first needs one (never at indexing): ``lambda: models.Name``.
if TYPE_CHECKING:
    from handoff import models
else:
    models = openapi.LazyModels("handoff.models")

Model = Callable[[], type[BaseModel]]

# ``next`` long-polls at most this long: far below the 230 s HTTP limit of the Functions front end.
MAX_WAIT_SECONDS = 20
MAX_EVENT_TYPE_FILTERS = 32

log = logging.getLogger("settle.handoff")

bp = func.Blueprint()

_SETTLE_RESPONSES = {
    400: "Invalid request (the problem names the field)",
    404: "Unknown event",
    413: "The control message would exceed Service Bus Standard's 256 KB as sent",
    409: "Not a pending hand-off, coordinates do not match, or another settlement is in flight "
    "(type urn:settle:problem:settlement-in-flight)",
    503: "Service Bus or storage unavailable and nothing was sent (no audit written; retry)",
}
_DEFAULT_SETTLER = "api"
_ENDPOINT = path_parameter("endpointId")


@bp.function_name("resolver")
@bp.service_bus_topic_trigger(
    arg_name="msg",
    topic_name="%RESOLVER_TOPIC%",
    subscription_name="%RESOLVER_SUBSCRIPTION%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
def resolver(msg: func.ServiceBusMessage, context: func.Context = None) -> None:  # type: ignore[assignment]
    """Project one NimBus message; returning completes it, raising lets the host retry it (ADR 0002).

    ``context``: the host's invocation (its trace context parents the projection's span); the worker
    requires the annotation to be ``func.Context`` itself, so the default is typed loosely. Storage that
    does not answer within ``RESOLVER_DEADLINE_S`` raises here, and Service Bus delivers the message again."""
    with invocation.within(invocation.RESOLVER_DEADLINE_S), telemetry.invocation(context):
        service.resolver_service().handle(msg)


def _settled_by(req: func.HttpRequest, given: str | None) -> str:
    return given or limits.agent_id(req) or _DEFAULT_SETTLER


def _who(req: func.HttpRequest) -> dict[str, str | None]:
    """Who sent the request: the agent's own header, and the principal App Service authentication put in
    ``x-ms-client-principal-name`` / ``-id`` (App Service strips those headers from external requests when
    authentication is on; without it they are caller-supplied like ``x-agent-id``)."""
    name = _header(req, "x-ms-client-principal-name")
    ident = _header(req, "x-ms-client-principal-id")
    if not headers_vouched():
        # The same rule as the management API: only App Service authentication (SETTLE_OPERATOR_AUTH=
        # required) makes these headers a principal; otherwise the audit says they are the caller's claim.
        name = _claimed(name)
        ident = _claimed(ident)
    return {"agent_id": limits.agent_id(req), "principal_name": name, "principal_id": ident}


CLAIMED = " (the caller's claim; not authenticated)"


def _claimed(value: str | None) -> str | None:
    return None if value is None else value + CLAIMED


def _header(req: func.HttpRequest, name: str) -> str | None:
    value = (req.headers.get(name) or "").strip()
    return value[:256] or None


def _settles(action: str, kind: MessageType, request: Model, outcome: tuple[str, ...], summary: str) -> None:
    """Registers ``handoff_<action>``: ``POST v1/handoffs/<action>`` settles the parked hand-off the body
    names with one ``kind`` message, carrying the body's ``outcome`` fields."""

    def settle(req: func.HttpRequest) -> SettlementAccepted:
        from handoff.settlement.settler import Settlement

        body: Any = parse_body(req, request())
        settled = service.settlement_service().settle(
            Settlement(
                kind=kind,
                endpoint_id=body.endpoint_id,
                coordinates=body.coordinates.to_contract(),
                settled_by=_settled_by(req, body.settled_by),
                lease_token=body.lease_token,
                **{name: getattr(body, name) for name in outcome},
                **_who(req),
            )
        )
        return from_fields(models.SettlementAccepted, settled)

    settle.__name__ = settle.__qualname__ = f"handoff_{action}"
    operation(
        bp,
        route=f"v1/handoffs/{action}",
        method="POST",
        summary=summary,
        request=request,
        response=lambda: models.SettlementAccepted,
        responses=_SETTLE_RESPONSES,
        ok_status=202,
    )(settle)


_settles(
    "complete",
    MessageType.HandoffCompletedRequest,
    lambda: models.CompleteHandoffRequest,
    ("result",),
    "Complete a parked hand-off (sends one HandoffCompletedRequest)",
)
_settles(
    "fail",
    MessageType.HandoffFailedRequest,
    lambda: models.FailHandoffRequest,
    ("error_text", "error_type"),
    "Fail a parked hand-off (sends one HandoffFailedRequest)",
)


def _per_endpoint(
    what: str,
    method: str,
    *,
    summary: str,
    response: Model,
    span: str | None = None,
    request: Model | None = None,
    responses: dict[int, str] | None = None,
    more: tuple[dict[str, Any], ...] = (),
    query: str | None = None,
) -> Callable[[Handler], Any]:
    """Registers ``<method> v1/handoffs/{endpointId}/<what>`` and its query twin ``v1/handoffs/<query or
    what>``, with the span ``settle.handoff.<span or what>``; ``more``: the parameters after the endpoint."""
    return operation(
        bp,
        route=f"v1/handoffs/{{endpointId}}/{what}",
        query_route=f"v1/handoffs/{query or what}",
        method=method,
        summary=summary,
        request=request,
        response=response,
        responses=responses,
        parameters=(_ENDPOINT, *more),
        span=f"settle.handoff.{span or what}",
    )


def _wait_seconds(req: func.HttpRequest) -> float:
    raw = req.params.get("waitSeconds")
    if raw is None or raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError as exc:
        raise InvalidInput("waitSeconds must be a number of seconds.", field="waitSeconds") from exc
    if value != value or value < 0:  # NaN or negative
        raise InvalidInput("waitSeconds must be 0 or more.", field="waitSeconds")
    return min(value, float(MAX_WAIT_SECONDS))


def _event_types(req: func.HttpRequest) -> list[str]:
    # The worker joins a repeated query parameter with commas; accept both forms.
    raw = req.params.get("eventTypeId") or ""
    types = [t.strip() for t in raw.split(",") if t.strip()]
    if len(types) > MAX_EVENT_TYPE_FILTERS:
        raise InvalidInput(f"At most {MAX_EVENT_TYPE_FILTERS} eventTypeId filters.", field="eventTypeId")
    return [limits.bounded(t, "eventTypeId", limits.MAX_ID) for t in types]


def _route(req: func.HttpRequest, name: str) -> str:
    value = limits.route_value(req, name)
    if name == "endpointId":
        telemetry.annotate({"nimbus.endpoint": value})
    return value


@_per_endpoint(
    "next",
    "GET",
    summary=f"Oldest parked hand-off of an endpoint (non-claiming; waits up to {MAX_WAIT_SECONDS} s), or 204",
    response=lambda: models.PendingHandoffView,
    responses={204: "No parked hand-off within the wait", 400: "Invalid parameter"},
    more=(
        {
            "name": "eventTypeId",
            "in": "query",
            "required": False,
            "schema": {"type": "string"},
            "description": "Filter; repeat or comma-separate for several.",
        },
        {
            "name": "waitSeconds",
            "in": "query",
            "required": False,
            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS},
            "description": f"Long-poll up to this many seconds (clamped to {MAX_WAIT_SECONDS}).",
        },
    ),
)
def handoff_next(req: func.HttpRequest) -> PendingHandoffView | None:
    from handoff.receive.receiver import long_poll

    endpoint_id, types, wait = _route(req, "endpointId"), _event_types(req), _wait_seconds(req)
    with long_poll(wait):
        row = service.receive_service().next(endpoint_id, types, wait)
        return None if row is None else models.PendingHandoffView.of(row)


_LEASE_RESPONSES = {
    400: "Invalid parameter",
    404: "Unknown event",
    409: "The token no longer holds the hand-off (type urn:settle:problem:lease-lost)",
}


@_per_endpoint(
    "receive",
    "POST",
    summary="Lease the oldest parked hand-off no one holds (leased receive; waits up to "
    f"{MAX_WAIT_SECONDS} s), or 204",
    response=lambda: models.LeasedHandoffView,
    responses={
        204: "No parked hand-off free within the wait",
        400: "Invalid parameter",
        429: "This instance serves 20 long-polls already (Retry-After)",
    },
    more=(
        {"name": "eventTypeId", "in": "query", "required": False, "schema": {"type": "string"}},
        {
            "name": "waitSeconds",
            "in": "query",
            "required": False,
            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS},
        },
        {
            "name": "leaseSeconds",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 10, "maximum": 3600},
            "description": "How long the hand-off is held (default 300 s); renew while the work runs.",
        },
    ),
)
def handoff_receive(req: func.HttpRequest) -> LeasedHandoffView | None:
    from handoff.receive.receiver import lease_length, long_poll

    endpoint_id, types, wait = _route(req, "endpointId"), _event_types(req), _wait_seconds(req)
    lease_for = lease_length(req.params.get("leaseSeconds"))
    with long_poll(wait):
        leased = service.receive_service().lease(
            endpoint_id, types, wait, lease_for=lease_for, agent_id=limits.agent_id(req)
        )
        if leased is None:
            return None
        return models.LeasedHandoffView(
            **models.PendingHandoffView.of(leased.row).model_dump(by_alias=False),
            lease=_lease_view(leased.lease),
        )


def _lease_view(lease: Lease) -> LeaseView:
    return models.LeaseView(
        token=lease.token,
        expires_at=lease.expires_at,
        lease_seconds=int(lease.lease_for.total_seconds()),
        leased_by=lease.leased_by,
    )


def _lease(action: str, summary: str, response: Model) -> Callable[[Handler], Any]:
    """Registers ``POST v1/handoffs/{endpointId}/leases/<action>`` (a ``LeaseRequest`` body), with its
    query twin and the span ``settle.handoff.lease.<action>``."""
    return _per_endpoint(
        f"leases/{action}",
        "POST",
        summary=summary,
        request=lambda: models.LeaseRequest,
        response=response,
        responses=_LEASE_RESPONSES,
        span=f"lease.{action}",
    )


def _lease_request(req: func.HttpRequest) -> tuple[str, LeaseRequest]:
    """The endpoint a lease call names, and its body."""
    from handoff.models import LeaseRequest

    body = parse_body(req, LeaseRequest)  # first: a request wrong in both still names its body
    return _route(req, "endpointId"), body


@_lease("renew", "Renew a lease while its token still holds the hand-off", lambda: models.LeaseView)
def handoff_lease_renew(req: func.HttpRequest) -> LeaseView:
    from handoff.receive.receiver import lease_length

    endpoint_id, body = _lease_request(req)
    lease_for = lease_length(body.lease_seconds)
    return _lease_view(
        service.receive_service().renew(endpoint_id, body.event_id, body.lease_token, lease_for=lease_for)
    )


@_lease(
    "release",
    "Release a lease: the hand-off is offered to the next receive at once",
    lambda: models.LeaseReleased,
)
def handoff_lease_release(req: func.HttpRequest) -> LeaseReleased:
    from handoff.models import LeaseReleased

    endpoint_id, body = _lease_request(req)
    service.receive_service().release(endpoint_id, body.event_id, body.lease_token)
    return LeaseReleased(event_id=body.event_id, released=True)


@_per_endpoint(
    "jobs/{externalJobId}",
    "GET",
    summary="The parked hand-off carrying an external job id",
    response=lambda: models.PendingHandoffView,
    responses={404: "No parked hand-off with that job id"},
    more=(path_parameter("externalJobId"),),
    span="job",
    query="jobs",
)
def handoff_job(req: func.HttpRequest) -> PendingHandoffView:
    row = service.receive_service().job(_route(req, "endpointId"), _route(req, "externalJobId"))
    return models.PendingHandoffView.of(row)


@_per_endpoint(
    "unconfirmed",
    "GET",
    summary="Settlements Settle could neither confirm nor safely re-send (an operator must check them)",
    response=lambda: models.UnconfirmedList,
)
def handoff_unconfirmed(req: func.HttpRequest) -> UnconfirmedList:
    endpoint_id = _route(req, "endpointId")
    rows = service.receive_service().unconfirmed(endpoint_id)
    items = [from_fields(models.UnconfirmedClaim, r, message_type=r.message_type.name) for r in rows]
    return models.UnconfirmedList(endpoint_id=endpoint_id, count=len(items), items=items)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}",
    query_route="v1/events",
    method="GET",
    summary="An event row with its message history and audits",
    response=lambda: models.EventView,
    responses={404: "Unknown event"},
    parameters=(
        _ENDPOINT,
        path_parameter("eventId"),
    ),
    span="settle.events.get",
)
def event_get(req: func.HttpRequest) -> EventView:
    found = service.receive_service().event(_route(req, "endpointId"), _route(req, "eventId"))
    return models.EventView.of(found.row, found.history, found.audits)


@bp.function_name("handoff_sweeper")
@bp.timer_trigger(arg_name="timer", schedule="%HANDOFF_SWEEPER_SCHEDULE%", run_on_startup=False)
def handoff_sweeper(timer: func.TimerRequest, context: func.Context = None) -> None:  # type: ignore[assignment]
    """Reconcile open settlement claims (always), fold the operator counts' deltas (always), then fail
    parked hand-offs past ExpectedBy (opt-in: ``HANDOFF_SWEEPER_ENABLED``). Each part reports
    per-endpoint failures and goes on. With telemetry on, the tick also counts parked and overdue
    hand-offs per endpoint (gauges). Its spans are children of the host's invocation (``context``). It
    gives up on storage after ``TIMER_DEADLINE_S``; the next tick goes on."""
    sweeping = env_flag("HANDOFF_SWEEPER_ENABLED")
    with (
        invocation.within(invocation.TIMER_DEADLINE_S),
        telemetry.invocation(context),
        telemetry.span("settle.sweeper.run", {"settle.sweeper.enabled": sweeping}),
    ):
        report = service.timer_tick(sweeping=sweeping, gauges=telemetry.enabled())
        if report is not None:
            telemetry.annotate(
                {"settle.sweeper.failed": len(report.failed), "settle.sweeper.skipped": len(report.skipped)}
            )
