"""The operator's actions on events: resubmit, skip, complete, fail, resolve a settlement, and the bulk
form of resubmit and skip. Each is audited (a refused one too) and counted in
``settle.operator.actions``. Thin: parse, check who, call :class:`management.actions.OperatorActions`
(which writes each audit's ``hoaudit`` copy), shape the answer. Each route names the method that serves it.
The models, the audit copies and the bulk runner are imported by the handler that needs them: indexing and
a cold start load none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

import azure.functions as func

from common import openapi, telemetry
from common.http import Handler, parse_body
from common.principal import Actor, actor_of, allowed, denial
from handoff.limits import route_value
from handoff.messages.contract import MessageType
from management import services
from management.api import ACTION, AUTH, acting, models, on_item

if TYPE_CHECKING:
    from management.actions import ActionResult
    from management.models import (
        ActionAccepted,
        BulkAnswer,
        BulkRequest,
        SettlementResolved,
    )


bp = func.Blueprint()
_EVENT = "events/{endpointId}/{eventId}"
_IDS = ("endpointId", "eventId")
P = ParamSpec("P")


# -- actions ------------------------------------------------------------------------------------------


def _answer(result: ActionResult) -> ActionAccepted:
    """The API's answer to an accepted action: its settlement and the audit it wrote."""
    from handoff.models import AuditEntry
    from management.models import ActionAccepted

    audit = AuditEntry.of(result.audit) if result.audit is not None else None
    return ActionAccepted.of(result.action, result.accepted, audit)


def _accepted(result: ActionResult) -> ActionAccepted:
    accepted = result.accepted
    telemetry.current().set_outcome(
        "replayed" if accepted.replayed else "sent" if accepted.confirmed else "unconfirmed"
    )
    telemetry.annotate({"nimbus.control_message_id": accepted.control_message_id})
    return _answer(result)


@dataclass(frozen=True)
class _OnEvent:
    """An operator acting on the route's event."""

    endpoint_id: str
    event_id: str
    actor: Actor

    def __call__(
        self, method: Callable[Concatenate[str, str, Actor, P], ActionResult], /, *a: P.args, **kw: P.kwargs
    ) -> ActionAccepted:
        """The service's ``method(endpoint_id, event_id, actor, ...)``, its answer shaped."""
        return _accepted(method(self.endpoint_id, self.event_id, self.actor, *a, **kw))


@contextmanager
def _on_the_event(
    action: str, req: func.HttpRequest, model: type[Any], *, needs_body: bool = True
) -> Iterator[tuple[Any, _OnEvent]]:
    """:func:`management.api.acting` on the route's event: its body, and how to act on the event."""
    with acting(action, req, model, *_IDS, needs_body=needs_body) as (body, actor, (endpoint_id, event_id)):
        yield body, _OnEvent(endpoint_id, event_id, actor)


def _on_event(
    action: str,
    summary: str,
    request: openapi.ModelRef,
    response: openapi.ModelRef = lambda: models.ActionAccepted,
    responses: dict[int, str] = ACTION,
    ok_status: int = 202,
    span: str | None = None,
) -> Callable[[Handler], Any]:
    """Registers ``POST v1/events/{endpointId}/{eventId}/<action>`` and its query twin."""
    return on_item(bp, _EVENT, action, summary, request, response, responses, ok_status=ok_status, span=span)


@_on_event(
    "resubmit",
    "Resubmit an event (optionally with an edited EventJson): one ResubmissionRequest, audited",
    lambda: models.ResubmitRequest,
)
def event_resubmit(req: func.HttpRequest) -> ActionAccepted:
    from management.models import ResubmitRequest

    with _on_the_event("resubmit", req, ResubmitRequest, needs_body=False) as (body, act):
        resubmit = services.operator_actions().resubmit
        return act(resubmit, message_id=body.message_id, event_json=body.event_json, reason=body.reason)


@_on_event("skip", "Skip an event: one SkipRequest, audited", lambda: models.SkipRequest)
def event_skip(req: func.HttpRequest) -> ActionAccepted:
    from management.models import SkipRequest

    with _on_the_event("skip", req, SkipRequest, needs_body=False) as (body, act):
        return act(services.operator_actions().skip, message_id=body.message_id, reason=body.reason)


@_on_event(
    "complete",
    "Complete the event's parked hand-off as an operator (one HandoffCompletedRequest, audited)",
    lambda: models.CompleteRequest,
)
def event_complete(req: func.HttpRequest) -> ActionAccepted:
    from management.models import CompleteRequest

    with _on_the_event("complete", req, CompleteRequest, needs_body=False) as (body, act):
        kind = MessageType.HandoffCompletedRequest
        return act(
            services.operator_actions().settle, kind=kind, message_id=body.message_id, result=body.result
        )


@_on_event(
    "fail",
    "Fail the event's parked hand-off as an operator (one HandoffFailedRequest, audited)",
    lambda: models.FailRequest,
)
def event_fail(req: func.HttpRequest) -> ActionAccepted:
    from management.models import FailRequest

    with _on_the_event("fail", req, FailRequest) as (body, act):
        return act(
            services.operator_actions().settle,
            kind=MessageType.HandoffFailedRequest,
            message_id=body.message_id,
            error_text=body.error_text,
            error_type=body.error_type,
        )


@_on_event(
    "settlement/resolve",
    "Resolve an unconfirmed settlement: mark it delivered (checked at the endpoint) or release it "
    "(the hand-off can be settled again); audited ResolveSettlement with who and why",
    lambda: models.ResolveSettlementRequest,
    lambda: models.SettlementResolved,
    {**ACTION, 404: "Unknown event, or no settlement of that message is claimed"},
    ok_status=200,
    span="resolve",
)
def event_settlement_resolve(req: func.HttpRequest) -> SettlementResolved:
    from handoff.models import AuditEntry
    from management.models import ResolveSettlementRequest, SettlementResolved

    with acting("resolve", req, ResolveSettlementRequest, *_IDS) as (body, actor, (endpoint_id, event_id)):
        done = services.operator_actions().resolve_settlement(
            endpoint_id,
            event_id,
            actor,
            message_id=body.message_id,
            resolution=body.resolution,
            reason=body.reason,
            control_message_id=body.control_message_id,
        )
        telemetry.current().set_outcome("replayed" if done.replayed else done.state)
        return SettlementResolved(
            endpoint_id=endpoint_id,
            event_id=event_id,
            addressed_message_id=body.message_id,
            control_message_id=done.control_message_id or body.control_message_id,
            state=done.state,
            replayed=done.replayed,
            by=actor.by,
            audit=AuditEntry.of(done.audit) if done.audit is not None else None,
        )


@on_item(
    bp,
    "endpoints/{endpointId}",
    "bulk",
    "Resubmit or skip up to 50 events: the single action once per event, a result per event",
    lambda: models.BulkRequest,
    lambda: models.BulkAnswer,
    {**AUTH, 400: "Invalid input (the problem names the field)"},
)
def endpoint_bulk(req: func.HttpRequest) -> BulkAnswer:
    from management import bulk
    from management.models import BulkAnswer, BulkItemAnswer, BulkRequest

    body: BulkRequest = parse_body(req, BulkRequest)
    actor = actor_of(req, body.by)
    endpoint_id = route_value(req, "endpointId")

    def done(item: bulk.BulkItem) -> None:
        outcome = "accepted" if item.status == 202 else item.slug or "error"
        telemetry.add("settle.operator.actions", action=f"bulk-{body.action}", outcome=outcome)

    items = bulk.run(
        services.operator_actions(),
        endpoint_id,
        body.event_ids,
        actor,
        action=body.action,
        reason=body.reason,
        message_ids=body.message_ids,
        on_done=done,
    )
    answers = [
        BulkItemAnswer(
            event_id=item.event_id,
            status=item.status,
            problem=item.slug,
            detail=item.detail,
            accepted=_answer(item.result) if item.result is not None else None,
        )
        for item in items
    ]
    if not allowed(actor):  # each event has its AccessDenied audit (the single action's); the call is 403
        raise denial(actor)
    ok = sum(1 for a in answers if a.status == 202)
    return BulkAnswer(action=body.action, accepted=ok, refused=len(answers) - ok, items=answers)
