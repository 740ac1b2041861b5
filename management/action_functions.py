"""The operator's actions on events: resubmit, skip, complete, fail, resolve a settlement, and the bulk
form of resubmit and skip. Each is audited (a refused one too) and counted in
``settle.operator.actions``. Thin: parse, check who, call :class:`management.actions.OperatorActions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import azure.functions as func

from common import telemetry
from common.http import operation, parse_body
from common.principal import actor_of, allowed, denial
from handoff import service
from handoff.contract import MessageType
from handoff.limits import route_value
from management import services
from management.api import (
    ACTION,
    AUTH,
    ENDPOINT,
    EVENT,
    MODELS,
    TAG,
    body_or_defaults,
    counted,
)

if TYPE_CHECKING:
    from management.models import (
        ActionAccepted,
        BulkAnswer,
        BulkRequest,
        CompleteRequest,
        ResubmitRequest,
        SettlementResolved,
        SkipRequest,
    )

bp = func.Blueprint()


# -- actions ------------------------------------------------------------------------------------------


def _accepted(result: Any) -> ActionAccepted:
    from handoff.models import AuditEntry
    from management.audits import mirror
    from management.models import ActionAccepted

    mirror(service.store(), result.audit)
    audit = AuditEntry.of(result.audit) if result.audit is not None else None
    accepted = result.accepted
    telemetry.current().set_outcome(
        "replayed" if accepted.replayed else "sent" if accepted.confirmed else "unconfirmed"
    )
    telemetry.annotate({"nimbus.control_message_id": accepted.control_message_id})
    return ActionAccepted.of(result.action, accepted, audit)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/resubmit",
    query_route="v1/events/resubmit",
    method="POST",
    span="settle.operator.resubmit",
    summary="Resubmit an event (optionally with an edited EventJson): one ResubmissionRequest, audited",
    request=MODELS + "ResubmitRequest",
    response=MODELS + "ActionAccepted",
    responses=ACTION,
    parameters=(ENDPOINT, EVENT),
    anonymous=True,
    ok_status=202,
    tag=TAG,
)
def event_resubmit(req: func.HttpRequest) -> ActionAccepted:
    from management.models import ResubmitRequest

    with counted("resubmit", req, "endpointId", "eventId"):
        body: ResubmitRequest = body_or_defaults(req, ResubmitRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().resubmit(
            route_value(req, "endpointId"),
            route_value(req, "eventId"),
            actor,
            event_json=body.event_json,
            reason=body.reason,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/skip",
    query_route="v1/events/skip",
    method="POST",
    span="settle.operator.skip",
    summary="Skip an event: one SkipRequest, audited",
    request=MODELS + "SkipRequest",
    response=MODELS + "ActionAccepted",
    responses=ACTION,
    parameters=(ENDPOINT, EVENT),
    anonymous=True,
    ok_status=202,
    tag=TAG,
)
def event_skip(req: func.HttpRequest) -> ActionAccepted:
    from management.models import SkipRequest

    with counted("skip", req, "endpointId", "eventId"):
        body: SkipRequest = body_or_defaults(req, SkipRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().skip(
            route_value(req, "endpointId"),
            route_value(req, "eventId"),
            actor,
            reason=body.reason,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/complete",
    query_route="v1/events/complete",
    method="POST",
    span="settle.operator.complete",
    summary="Complete the event's parked hand-off as an operator (one HandoffCompletedRequest, audited)",
    request=MODELS + "CompleteRequest",
    response=MODELS + "ActionAccepted",
    responses=ACTION,
    parameters=(ENDPOINT, EVENT),
    anonymous=True,
    ok_status=202,
    tag=TAG,
)
def event_complete(req: func.HttpRequest) -> ActionAccepted:
    from management.models import CompleteRequest

    with counted("complete", req, "endpointId", "eventId"):
        body: CompleteRequest = body_or_defaults(req, CompleteRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().settle(
            route_value(req, "endpointId"),
            route_value(req, "eventId"),
            actor,
            kind=MessageType.HandoffCompletedRequest,
            result=body.result,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/fail",
    query_route="v1/events/fail",
    method="POST",
    span="settle.operator.fail",
    summary="Fail the event's parked hand-off as an operator (one HandoffFailedRequest, audited)",
    request=MODELS + "FailRequest",
    response=MODELS + "ActionAccepted",
    responses=ACTION,
    parameters=(ENDPOINT, EVENT),
    anonymous=True,
    ok_status=202,
    tag=TAG,
)
def event_fail(req: func.HttpRequest) -> ActionAccepted:
    from management.models import FailRequest

    with counted("fail", req, "endpointId", "eventId"):
        body = parse_body(req, FailRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().settle(
            route_value(req, "endpointId"),
            route_value(req, "eventId"),
            actor,
            kind=MessageType.HandoffFailedRequest,
            error_text=body.error_text,
            error_type=body.error_type,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/settlement/resolve",
    query_route="v1/events/settlement/resolve",
    method="POST",
    span="settle.operator.resolve",
    summary="Resolve an unconfirmed settlement: mark it delivered (checked at the endpoint) or release it "
    "(the hand-off can be settled again); audited ResolveSettlement with who and why",
    request=MODELS + "ResolveSettlementRequest",
    response=MODELS + "SettlementResolved",
    responses={**ACTION, 404: "Unknown event, or no settlement of that message is claimed"},
    parameters=(ENDPOINT, EVENT),
    anonymous=True,
    tag=TAG,
)
def event_settlement_resolve(req: func.HttpRequest) -> SettlementResolved:
    from management.models import ResolveSettlementRequest, SettlementResolved

    with counted("resolve", req, "endpointId", "eventId"):
        from handoff.models import AuditEntry
        from management.audits import mirror

        body = parse_body(req, ResolveSettlementRequest)
        actor = actor_of(req, body.by)
        endpoint_id, event_id = route_value(req, "endpointId"), route_value(req, "eventId")
        done = services.operator_actions().resolve_settlement(
            endpoint_id,
            event_id,
            actor,
            message_id=body.message_id,
            resolution=body.resolution,
            reason=body.reason,
            control_message_id=body.control_message_id,
        )
        # The copy is written after the resolution, as for the other actions: a retry (answered from the
        # earlier resolution's audit) lands on the same row, or writes the copy a crash left missing.
        mirror(service.store(), done.audit)
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


@operation(
    bp,
    route="v1/endpoints/{endpointId}/bulk",
    query_route="v1/endpoints/bulk",
    method="POST",
    span="settle.operator.bulk",
    summary="Resubmit or skip up to 50 events: the single action once per event, a result per event",
    request=MODELS + "BulkRequest",
    response=MODELS + "BulkAnswer",
    responses={**AUTH, 400: "Invalid input (the problem names the field)"},
    parameters=(ENDPOINT,),
    anonymous=True,
    tag=TAG,
)
def endpoint_bulk(req: func.HttpRequest) -> BulkAnswer:
    from management import bulk
    from management.audits import mirror
    from management.models import ActionAccepted, BulkAnswer, BulkItemAnswer, BulkRequest

    body: BulkRequest = parse_body(req, BulkRequest)
    actor = actor_of(req, body.by)
    endpoint_id = route_value(req, "endpointId")
    store = service.store()

    def done(item: bulk.BulkItem) -> None:
        outcome = "accepted" if item.status == 202 else item.slug or "error"
        telemetry.add("settle.operator.actions", action=f"bulk-{body.action}", outcome=outcome)
        if item.result is not None:
            mirror(store, item.result.audit)

    items = bulk.run(
        services.operator_actions(),
        endpoint_id,
        list(dict.fromkeys(body.event_ids)),  # one action per event, however often it was selected
        actor,
        action=body.action,
        reason=body.reason,
        message_ids=body.message_ids,
        on_done=done,
    )
    answers = []
    for item in items:
        accepted = None
        if item.result is not None:
            from handoff.models import AuditEntry

            audit = AuditEntry.of(item.result.audit) if item.result.audit is not None else None
            accepted = ActionAccepted.of(item.result.action, item.result.accepted, audit)
        answers.append(
            BulkItemAnswer(
                event_id=item.event_id,
                status=item.status,
                problem=item.slug,
                detail=item.detail,
                accepted=accepted,
            )
        )
    if not allowed(actor):  # each event has its AccessDenied audit (the single action's); the call is 403
        raise denial(actor)
    ok = sum(1 for a in answers if a.status == 202)
    return BulkAnswer(action=body.action, accepted=ok, refused=len(answers) - ok, items=answers)
