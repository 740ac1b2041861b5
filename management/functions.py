"""The management blueprint: counts, listings, operator actions, poison, state records.

Every route is anonymous for the Functions host: in Azure, App Service authentication (Entra ID) signs
the operator in and the code checks the principal and its app role (:mod:`common.principal`,
``docs/adr/0013-console-auth.md``); locally no key or sign-in is needed. Thin: parse, check who, call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import azure.functions as func

from common import telemetry
from common.clock import storable_utc
from common.errors import InvalidInput, SettleError
from common.http import dependency_problem, operation, parse_body
from common.layouts import operator_warnings
from common.principal import actor_of, allowed, denial, require_operator
from handoff import service
from handoff.contract import MessageType
from handoff.limits import query_value, route_value
from management import services
from state.schemas import HistoryRequest, QueryRequest, RecordPage

if TYPE_CHECKING:
    from management.models import (
        ActionAccepted,
        AuditSearchPage,
        BulkAnswer,
        BulkRequest,
        CompleteRequest,
        DismissRequest,
        EndpointsOverview,
        EventPage,
        FindAnswer,
        OperatorEventView,
        OverdueHandoffs,
        PoisonEntry,
        PoisonPage,
        RecordLookup,
        ReplayAnswer,
        ReplayRequest,
        ResubmitRequest,
        SettlementResolved,
        SettlementView,
        SkipRequest,
        StuckRecords,
        UnconfirmedSettlements,
    )

# The API's models are imported by the handler that needs them, never at indexing: the OpenAPI document
# names them as "module:Name" (a cold start pays for none of them; issue 21).
_MODELS = "management.models:"

bp = func.Blueprint()

_TAG = "management"
_AUTH = {401: "No signed-in principal (in Azure)", 403: "The principal lacks the app role Settle.Operator"}
_ACTION = {
    **_AUTH,
    400: "Invalid input (the problem names the field)",
    404: "Unknown event",
    409: "The event's state does not allow it, or another action on it is in flight",
    413: "The control message would exceed 256 KB",
    503: "Service Bus or storage unavailable and nothing was sent (retry)",
}
_ENDPOINT = {"name": "endpointId", "in": "path", "required": True, "schema": {"type": "string"}}
_EVENT = {"name": "eventId", "in": "path", "required": True, "schema": {"type": "string"}}
BUCKET_NAMES = (
    "Pending",
    "PendingHandoff",
    "Deferred",
    "Failed",
    "DeadLettered",
    "Unsupported",
    "Completed",
    "Skipped",
)


def _route(req: func.HttpRequest, name: str) -> str:
    return route_value(req, name)


def _body(req: func.HttpRequest, model: type[Any]) -> Any:
    """The JSON body, or the model's defaults when there is none (every field is optional)."""
    if not (req.get_body() or b"").strip():
        return model()
    return parse_body(req, model)


def _time(req: func.HttpRequest, name: str) -> datetime | None:
    raw = req.params.get(name)
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"{name} must be an ISO-8601 time (2026-12-01T09:00:00Z).", field=name) from exc
    if value.tzinfo is None:
        raise InvalidInput(f"{name} needs a time zone (Z for UTC).", field=name)
    utc = storable_utc(value)  # 9999-12-31T23:00-05:00 is past the last instant: that instant
    if utc is None:
        raise InvalidInput(f"{name} must be 1601-01-01T00:00:00Z or later.", field=name)
    return utc


def _page_size(req: func.HttpRequest, default: int, maximum: int) -> int:
    raw = req.params.get("pageSize")
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:  # "²" is a digit to isdigit
        raise InvalidInput(f"pageSize must be 1-{maximum}.", field="pageSize")
    return int(raw)


# -- overview and listings ------------------------------------------------------------------------


@operation(
    bp,
    route="v1/endpoints",
    method="GET",
    summary="Every endpoint with exact counts by status, oldest ages and poison (no scan)",
    response=_MODELS + "EndpointsOverview",
    responses=_AUTH,
    anonymous=True,
    tag=_TAG,
)
def endpoints_overview(req: func.HttpRequest) -> EndpointsOverview:
    from management.models import Counts, EndpointsOverview, EndpointSummary

    require_operator(req)
    from handoff.counts import FAILED_GROUP, PENDING_GROUP, POISON

    overview = service.overview()
    items = []
    for endpoint_id in sorted(service.store().endpoints()):
        totals = overview.counts(endpoint_id)
        items.append(
            EndpointSummary(
                endpoint_id=endpoint_id,
                counts=Counts(
                    pending=totals["Pending"],
                    pending_handoff=totals["PendingHandoff"],
                    deferred=totals["Deferred"],
                    failed=totals["Failed"],
                    dead_lettered=totals["DeadLettered"],
                    unsupported=totals["Unsupported"],
                    completed=totals["Completed"],
                    skipped=totals["Skipped"],
                ),
                oldest_pending_at=overview.oldest(endpoint_id, PENDING_GROUP),
                oldest_failed_at=overview.oldest(endpoint_id, FAILED_GROUP),
                poison=totals[POISON],
                oldest_poison_day=overview.oldest_poison_day(endpoint_id) if totals[POISON] else None,
                **_stuck_counts(endpoint_id),
            )
        )
    unattributed = overview.counts(None)[POISON]
    return EndpointsOverview(
        items=items,
        unattributed_poison=unattributed,
        unattributed_oldest_poison_day=overview.oldest_poison_day(None) if unattributed else None,
        warnings=operator_warnings(),  # docs/adr/0017: near one partition's budget, a setting overridden
    )


@operation(
    bp,
    route="v1/endpoints/{endpointId}/events",
    method="GET",
    summary="A page of an endpoint's events, newest change first (status, type and time filters)",
    response=_MODELS + "EventPage",
    responses={**_AUTH, 400: "Invalid parameter"},
    parameters=(
        _ENDPOINT,
        {"name": "status", "in": "query", "schema": {"type": "string", "enum": list(BUCKET_NAMES)}},
        {"name": "eventTypeId", "in": "query", "schema": {"type": "string"}, "description": "Repeatable."},
        {"name": "from", "in": "query", "schema": {"type": "string", "format": "date-time"}},
        {"name": "to", "in": "query", "schema": {"type": "string", "format": "date-time"}},
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
        {"name": "continuationToken", "in": "query", "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=_TAG,
)
def endpoint_events(req: func.HttpRequest) -> EventPage:
    from management.models import EventPage, EventSummary

    require_operator(req)
    endpoint_id = _route(req, "endpointId")
    status = req.params.get("status") or None
    if status is not None and status not in BUCKET_NAMES:
        raise InvalidInput(f"status must be one of {', '.join(BUCKET_NAMES)}.", field="status")
    types = [t.strip() for t in (req.params.get("eventTypeId") or "").split(",") if t.strip()]
    if len(types) > 32:
        raise InvalidInput("At most 32 eventTypeId filters.", field="eventTypeId")
    oldest, newest = _time(req, "from"), _time(req, "to")
    if oldest and newest and oldest > newest:
        raise InvalidInput("from must not be after to.", field="from")
    page = service.overview().events(
        endpoint_id,
        bucket=status,
        event_type_ids=types,
        oldest=oldest,
        newest=newest,
        page_size=_page_size(req, 50, 200),
        continuation=req.params.get("continuationToken") or None,
    )
    return EventPage(
        items=[EventSummary.of(endpoint_id, row) for row in page.items], continuation_token=page.continuation
    )


@operation(
    bp,
    route="v1/endpoints/{endpointId}/events/{eventId}",
    method="GET",
    summary="One event with its history, audits, the actions it allows and the payload to resubmit",
    response=_MODELS + "OperatorEventView",
    responses={**_AUTH, 404: "Unknown event"},
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    tag=_TAG,
)
def endpoint_event(req: func.HttpRequest) -> OperatorEventView:
    from management.models import OperatorEventView

    require_operator(req)
    from common.errors import NotFound
    from handoff import keys
    from handoff.models import EventView
    from handoff.records import ClaimRow
    from handoff.store import classify_event_rows
    from management.actions import offered_actions, payload_of

    endpoint_id, event_id = _route(req, "endpointId"), _route(req, "eventId")
    rows = list(service.store().event_rows(endpoint_id, event_id))  # one range read, claims included
    row, history, audits = classify_event_rows(iter(rows))
    if row is None:
        raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
    view = EventView.of(row, history, audits)
    current = keys.claim_row(row.event_id, row.last_message_id) if row.last_message_id else None
    claim = next((ClaimRow.from_entity(e) for e in rows if e["RowKey"] == current), None)
    return OperatorEventView(
        **view.model_dump(by_alias=False),
        actions=offered_actions(row, claim),
        event_json=payload_of(history, row)[1],
        settlement=_settlement_view(claim) if claim is not None else None,
    )


# -- stuck settlements and overdue hand-offs (index rows only) ---------------------------------------

_STUCK_CAP = 1000


def _stuck_counts(endpoint_id: str) -> dict[str, int]:
    """Unconfirmed settlements and overdue hand-offs of an endpoint, counted on their index rows."""
    from common.clock import utcnow
    from handoff import keys

    store = service.store()
    return {
        "unconfirmed": store.count_range(endpoint_id, *keys.UNCONFIRMED_RANGE, cap=_STUCK_CAP),
        "overdue_handoffs": store.count_range(
            endpoint_id, *keys.expiry_range_until(utcnow()), cap=_STUCK_CAP
        ),
    }


def _settlement_view(claim: Any) -> SettlementView:
    from management.models import SettlementView

    return SettlementView(
        event_id=claim.event_id,
        addressed_message_id=claim.parked_message_id,
        control_message_id=claim.control_message_id,
        message_type=claim.message_type.name,
        state=claim.state.name,
        settled_by=claim.settled_by,
        claimed_at=claim.claimed_at,
    )


@operation(
    bp,
    route="v1/endpoints/{endpointId}/unconfirmed",
    method="GET",
    summary="Settlements Settle could neither confirm nor safely re-send: an operator resolves each",
    response=_MODELS + "UnconfirmedSettlements",
    responses=_AUTH,
    parameters=(_ENDPOINT,),
    anonymous=True,
    tag=_TAG,
)
def endpoint_unconfirmed(req: func.HttpRequest) -> UnconfirmedSettlements:
    from management.models import SettlementView, UnconfirmedSettlements

    require_operator(req)
    endpoint_id = _route(req, "endpointId")
    items = [
        SettlementView(
            event_id=r.event_id,
            addressed_message_id=r.parked_message_id,
            control_message_id=r.control_message_id,
            message_type=r.message_type.name,
            state="unconfirmed",
            settled_by=r.settled_by,
            claimed_at=r.claimed_at,
        )
        for r in service.store().unconfirmed(endpoint_id, limit=_STUCK_CAP)
    ]
    return UnconfirmedSettlements(endpoint_id=endpoint_id, count=len(items), items=items)


@operation(
    bp,
    route="v1/endpoints/{endpointId}/overdue",
    method="GET",
    summary="Parked hand-offs past their ExpectedBy, most overdue first (the expiry index, no scan)",
    response=_MODELS + "OverdueHandoffs",
    responses=_AUTH,
    parameters=(_ENDPOINT,),
    anonymous=True,
    tag=_TAG,
)
def endpoint_overdue(req: func.HttpRequest) -> OverdueHandoffs:
    from management.models import OverdueHandoff, OverdueHandoffs

    require_operator(req)
    from common.clock import utcnow
    from handoff.records import ExpiryRow

    endpoint_id = _route(req, "endpointId")
    rows = [
        ExpiryRow.from_entity(e) for e in service.store().expired(endpoint_id, utcnow(), limit=_STUCK_CAP)
    ]
    items = [OverdueHandoff(event_id=r.event_id, expected_by=r.expected_by) for r in rows]
    return OverdueHandoffs(endpoint_id=endpoint_id, count=len(items), items=items)


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


@contextmanager
def _counted(action: str, req: func.HttpRequest, *ids: str) -> Iterator[None]:
    """Names the item on the action's span and counts the action in ``settle.operator.actions`` by
    outcome (the span's, once the block has set it; a refusal's slug; a dependency's 503). The principal
    is in the audit row, not in telemetry."""
    names = (
        ("nimbus.endpoint", "nimbus.event_id")
        if action not in ("replay", "dismiss")
        else ("settle.poison.day", "settle.poison.id")
    )
    telemetry.annotate({name: req.route_params.get(route) for name, route in zip(names, ids, strict=True)})
    try:
        yield
    except SettleError as exc:
        telemetry.add("settle.operator.actions", action=action, outcome=exc.slug)
        raise
    except Exception as exc:
        mapped = dependency_problem(exc)
        telemetry.add("settle.operator.actions", action=action, outcome=mapped.slug if mapped else "error")
        raise
    telemetry.add("settle.operator.actions", action=action, outcome=telemetry.current().outcome or "ok")


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/resubmit",
    method="POST",
    span="settle.operator.resubmit",
    summary="Resubmit an event (optionally with an edited EventJson): one ResubmissionRequest, audited",
    request=_MODELS + "ResubmitRequest",
    response=_MODELS + "ActionAccepted",
    responses=_ACTION,
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    ok_status=202,
    tag=_TAG,
)
def event_resubmit(req: func.HttpRequest) -> ActionAccepted:
    from management.models import ResubmitRequest

    with _counted("resubmit", req, "endpointId", "eventId"):
        body: ResubmitRequest = _body(req, ResubmitRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().resubmit(
            _route(req, "endpointId"),
            _route(req, "eventId"),
            actor,
            event_json=body.event_json,
            reason=body.reason,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/skip",
    method="POST",
    span="settle.operator.skip",
    summary="Skip an event: one SkipRequest, audited",
    request=_MODELS + "SkipRequest",
    response=_MODELS + "ActionAccepted",
    responses=_ACTION,
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    ok_status=202,
    tag=_TAG,
)
def event_skip(req: func.HttpRequest) -> ActionAccepted:
    from management.models import SkipRequest

    with _counted("skip", req, "endpointId", "eventId"):
        body: SkipRequest = _body(req, SkipRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().skip(
            _route(req, "endpointId"),
            _route(req, "eventId"),
            actor,
            reason=body.reason,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/complete",
    method="POST",
    span="settle.operator.complete",
    summary="Complete the event's parked hand-off as an operator (one HandoffCompletedRequest, audited)",
    request=_MODELS + "CompleteRequest",
    response=_MODELS + "ActionAccepted",
    responses=_ACTION,
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    ok_status=202,
    tag=_TAG,
)
def event_complete(req: func.HttpRequest) -> ActionAccepted:
    from management.models import CompleteRequest

    with _counted("complete", req, "endpointId", "eventId"):
        body: CompleteRequest = _body(req, CompleteRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().settle(
            _route(req, "endpointId"),
            _route(req, "eventId"),
            actor,
            kind=MessageType.HandoffCompletedRequest,
            result=body.result,
            message_id=body.message_id,
        )
        return _accepted(result)


@operation(
    bp,
    route="v1/events/{endpointId}/{eventId}/fail",
    method="POST",
    span="settle.operator.fail",
    summary="Fail the event's parked hand-off as an operator (one HandoffFailedRequest, audited)",
    request=_MODELS + "FailRequest",
    response=_MODELS + "ActionAccepted",
    responses=_ACTION,
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    ok_status=202,
    tag=_TAG,
)
def event_fail(req: func.HttpRequest) -> ActionAccepted:
    from management.models import FailRequest

    with _counted("fail", req, "endpointId", "eventId"):
        body = parse_body(req, FailRequest)
        actor = actor_of(req, body.by)
        result = services.operator_actions().settle(
            _route(req, "endpointId"),
            _route(req, "eventId"),
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
    method="POST",
    span="settle.operator.resolve",
    summary="Resolve an unconfirmed settlement: mark it delivered (checked at the endpoint) or release it "
    "(the hand-off can be settled again); audited ResolveSettlement with who and why",
    request=_MODELS + "ResolveSettlementRequest",
    response=_MODELS + "SettlementResolved",
    responses={**_ACTION, 404: "Unknown event, or no settlement of that message is claimed"},
    parameters=(_ENDPOINT, _EVENT),
    anonymous=True,
    tag=_TAG,
)
def event_settlement_resolve(req: func.HttpRequest) -> SettlementResolved:
    from management.models import ResolveSettlementRequest, SettlementResolved

    with _counted("resolve", req, "endpointId", "eventId"):
        from handoff.models import AuditEntry
        from management.audits import mirror

        body = parse_body(req, ResolveSettlementRequest)
        actor = actor_of(req, body.by)
        endpoint_id, event_id = _route(req, "endpointId"), _route(req, "eventId")
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


# -- poison ---------------------------------------------------------------------------------------


@operation(
    bp,
    route="v1/poison",
    method="GET",
    summary="Poison messages of one UTC day (reason, whole body, replay record), in enqueue order",
    response=_MODELS + "PoisonPage",
    responses={**_AUTH, 400: "Invalid parameter"},
    parameters=(
        {"name": "day", "in": "query", "required": True, "schema": {"type": "string", "pattern": "^\\d{8}$"}},
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
        {"name": "continuationToken", "in": "query", "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=_TAG,
)
def poison_list(req: func.HttpRequest) -> PoisonPage:
    from management.models import PoisonEntry, PoisonPage

    require_operator(req)
    from handoff.overview import decode_continuation, encode_continuation

    day = req.params.get("day") or ""
    if not day:
        raise InvalidInput("day (YYYYMMDD) is required.", field="day")
    token = req.params.get("continuationToken")
    rows, last = services.poison_desk().page(
        day, after=decode_continuation(token) if token else None, limit=_page_size(req, 50, 200)
    )
    return PoisonPage(
        day=day,
        items=[PoisonEntry.of(day, r) for r in rows],
        continuation_token=encode_continuation(last) if last else None,
    )


@operation(
    bp,
    route="v1/poison/{day}/{id}/replay",
    method="POST",
    span="settle.operator.replay",
    summary="Replay a poison message through the resolver; answers the outcome (409 if replayed before)",
    request=_MODELS + "ReplayRequest",
    response=_MODELS + "ReplayAnswer",
    responses={**_AUTH, 404: "Unknown poison message", 409: "Replayed before", 503: "Storage unavailable"},
    parameters=(
        {"name": "day", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=_TAG,
)
def poison_replay(req: func.HttpRequest) -> ReplayAnswer:
    from management.models import PoisonEntry, ReplayAnswer, ReplayRequest

    with _counted("replay", req, "day", "id"):
        body: ReplayRequest = _body(req, ReplayRequest)
        actor = actor_of(req, body.by)
        from management.poison import Edits

        edits = Edits(
            message_content=body.message_content, application_properties=body.application_properties
        )
        result = services.poison_desk().replay(_route(req, "day"), _route(req, "id"), actor, edits)
        telemetry.current().set_outcome(result.outcome)
        return ReplayAnswer(
            outcome=result.outcome,
            detail=result.detail,
            replayed=result.replayed,
            poison=PoisonEntry.of(result.day, result.row),
        )


# -- state records ----------------------------------------------------------------------------------


@operation(
    bp,
    route="v1/records/lookup",
    method="POST",
    summary="A state record by its key, with its history (for operators)",
    request=HistoryRequest,
    response=_MODELS + "RecordLookup",
    responses={**_AUTH, 400: "Invalid key (the problem names the field)"},
    anonymous=True,
    tag=_TAG,
)
def records_lookup(req: func.HttpRequest) -> RecordLookup:
    from management.models import RecordLookup

    require_operator(req)
    from management.records import lookup

    record, history = lookup(parse_body(req, HistoryRequest))
    return RecordLookup(record=record, history=history)


@operation(
    bp,
    route="v1/records/stuck",
    method="GET",
    summary="Records stuck in Processing past their lock (from the lock-expiry index, never a scan)",
    response=_MODELS + "StuckRecords",
    responses=_AUTH,
    anonymous=True,
    tag=_TAG,
)
def records_stuck(req: func.HttpRequest) -> StuckRecords:
    from management.models import StuckRecords

    require_operator(req)
    from management.records import stuck

    items = stuck()
    return StuckRecords(count=len(items), items=items)


# -- issue 25: dismiss poison, bulk actions, audit search, find ------------------------------------------


@operation(
    bp,
    route="v1/poison/{day}/{id}/dismiss",
    method="POST",
    span="settle.operator.dismiss",
    summary="Dismiss (archive) a poison message no fix will project: recorded with its reason, audited",
    request=_MODELS + "DismissRequest",
    response=_MODELS + "PoisonEntry",
    responses={
        **_AUTH,
        400: "No reason",
        404: "Unknown poison message",
        409: "Dismissed or projected before",
    },
    parameters=(
        {"name": "day", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=_TAG,
)
def poison_dismiss(req: func.HttpRequest) -> PoisonEntry:
    from management.models import DismissRequest, PoisonEntry

    with _counted("dismiss", req, "day", "id"):
        body: DismissRequest = parse_body(req, DismissRequest)
        actor = actor_of(req, body.by)
        day = _route(req, "day")
        row = services.poison_desk().dismiss(day, _route(req, "id"), actor, body.reason)
        return PoisonEntry.of(day, row)


@operation(
    bp,
    route="v1/endpoints/{endpointId}/bulk",
    method="POST",
    span="settle.operator.bulk",
    summary="Resubmit or skip up to 50 events: the single action once per event, a result per event",
    request=_MODELS + "BulkRequest",
    response=_MODELS + "BulkAnswer",
    responses={**_AUTH, 400: "Invalid input (the problem names the field)"},
    parameters=(_ENDPOINT,),
    anonymous=True,
    tag=_TAG,
)
def endpoint_bulk(req: func.HttpRequest) -> BulkAnswer:
    from management import bulk
    from management.audits import mirror
    from management.models import ActionAccepted, BulkAnswer, BulkItemAnswer, BulkRequest

    body: BulkRequest = parse_body(req, BulkRequest)
    actor = actor_of(req, body.by)
    endpoint_id = _route(req, "endpointId")
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


@operation(
    bp,
    route="v1/audits",
    method="GET",
    summary="Operator audits by endpoint, type, operator and time (hoaudit by day; oldest first)",
    response=_MODELS + "AuditSearchPage",
    responses={**_AUTH, 400: "Invalid parameter"},
    parameters=(
        {"name": "from", "in": "query", "schema": {"type": "string", "format": "date-time"}},
        {"name": "to", "in": "query", "schema": {"type": "string", "format": "date-time"}},
        {"name": "endpointId", "in": "query", "schema": {"type": "string"}},
        {"name": "auditType", "in": "query", "schema": {"type": "string"}},
        {"name": "by", "in": "query", "schema": {"type": "string"}},
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
        {"name": "continuationToken", "in": "query", "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=_TAG,
)
def audits_search(req: func.HttpRequest) -> AuditSearchPage:
    from management.models import AuditSearchEntry, AuditSearchPage

    require_operator(req)
    from datetime import timedelta

    from common.clock import utcnow
    from handoff.overview import decode_continuation, encode_continuation
    from management.audits import search

    # No "to": up to now, plus the skew Settle's clock may move by (it follows storage's clock), so an
    # audit written a moment ago is never outside the default window.
    newest = _time(req, "to") or utcnow() + timedelta(minutes=5)
    oldest = _time(req, "from") or newest - timedelta(days=1)
    token = req.params.get("continuationToken")
    found = search(
        service.store(),
        oldest=oldest,
        newest=newest,
        endpoint_id=query_value(req, "endpointId"),
        audit_type=query_value(req, "auditType"),
        by=query_value(req, "by"),
        page_size=_page_size(req, 50, 200),
        after=decode_continuation(token) if token else None,
    )
    from handoff.models import AuditEntry

    return AuditSearchPage(
        items=[
            AuditSearchEntry(
                **AuditEntry.of(row).model_dump(by_alias=False),
                endpoint_id=row.endpoint_id,
                event_id=row.event_id,
            )
            for row in found.items
        ],
        continuation_token=encode_continuation(found.last_key) if found.last_key else None,
    )


@operation(
    bp,
    route="v1/find",
    method="GET",
    summary="Hand-offs across endpoints by any id: event id (or its first 3+ characters), session, message "
    "or external job id, any case, with what matched (hoids: a few reads at any number of endpoints)",
    response=_MODELS + "FindAnswer",
    responses={**_AUTH, 400: "No id, or an eventId prefix shorter than 3 characters (the problem names it)"},
    parameters=tuple(
        {"name": name, "in": "query", "schema": {"type": "string"}}
        for name in ("q", "eventId", "sessionId", "messageId", "externalJobId")
    ),
    anonymous=True,
    tag=_TAG,
)
def find_events(req: func.HttpRequest) -> FindAnswer:
    require_operator(req)
    from management import find

    return find.answer(service.store(), req.params)


@operation(
    bp,
    route="v1/failed",
    method="GET",
    summary="Failed and dead-lettered events across endpoints, newest change first",
    response=_MODELS + "FindAnswer",
    responses={**_AUTH, 400: "Invalid parameter"},
    parameters=(
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
    ),
    anonymous=True,
    tag=_TAG,
)
def failed_events(req: func.HttpRequest) -> FindAnswer:
    from management.models import FindAnswer

    require_operator(req)
    from management import find

    return FindAnswer(
        items=find.failed(service.store(), service.overview(), per_endpoint=_page_size(req, 50, 200))
    )


@operation(
    bp,
    route="v1/records/query",
    method="POST",
    summary="Records of a tenant by scope (id or name), entity, status and time, for operators (state query)",
    request=QueryRequest,
    response=RecordPage,
    responses={**_AUTH, 400: "Invalid filter (the problem names the field)"},
    anonymous=True,
    tag=_TAG,
)
def records_query(req: func.HttpRequest) -> RecordPage:
    require_operator(req)
    from state import service as state_service

    body: QueryRequest = parse_body(req, QueryRequest)
    return state_service.handler(body.handler).query(body)
