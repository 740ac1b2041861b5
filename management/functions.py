"""The management API's reads: the endpoints' counts, an endpoint's events, one event with what it
allows, stuck settlements and overdue hand-offs, find, failed events and the audit search.

Thin: parse, check who (:func:`management.api.operator_read`), read, answer. The models, the storage
rows and the operator modules are imported by the handler that needs them: indexing and a cold start load
none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import azure.functions as func

from common.clock import utcnow
from common.errors import InvalidInput, NotFound
from common.http import Handler
from common.layouts import operator_warnings
from handoff import service
from handoff.limits import query_value, route_value
from handoff.storage import keys
from management.api import (
    AUTH,
    BUCKET_NAMES,
    CONTINUATION,
    ENDPOINT,
    EVENT,
    FROM,
    INVALID,
    MODELS,
    PAGE_SIZE,
    TO,
    operator_read,
    page_size,
    time_param,
)

if TYPE_CHECKING:
    from management.models import (
        AuditSearchPage,
        EndpointsOverview,
        EventPage,
        FindAnswer,
        OperatorEventView,
        OverdueHandoffs,
        SettlementView,
        UnconfirmedSettlements,
    )

bp = func.Blueprint()


def _per_endpoint(
    what: str,
    summary: str,
    response: str,
    *,
    responses: dict[int, str] = AUTH,
    more: tuple[dict[str, Any], ...] = (),
) -> Callable[[Handler], Any]:
    """Registers ``GET v1/endpoints/{endpointId}/<what>`` and its query twin ``v1/endpoints/<what>``, an
    operator read; ``more``: the parameters after the endpoint."""
    return operator_read(
        bp,
        f"v1/endpoints/{{endpointId}}/{what}",
        summary,
        response,
        query_route=f"v1/endpoints/{what}",
        responses=responses,
        parameters=(ENDPOINT, *more),
    )


# -- overview and listings ------------------------------------------------------------------------


@operator_read(
    bp,
    "v1/endpoints",
    "Every endpoint with exact counts by status, oldest ages and poison (no scan)",
    MODELS + "EndpointsOverview",
)
def endpoints_overview(req: func.HttpRequest) -> EndpointsOverview:
    from handoff.storage.counts import FAILED_GROUP, PENDING_GROUP, POISON
    from management.models import Counts, EndpointsOverview, EndpointSummary

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


@_per_endpoint(
    "events",
    "A page of an endpoint's events, newest change first (status, type and time filters)",
    MODELS + "EventPage",
    responses=INVALID,
    more=(
        {"name": "status", "in": "query", "schema": {"type": "string", "enum": list(BUCKET_NAMES)}},
        {"name": "eventTypeId", "in": "query", "schema": {"type": "string"}, "description": "Repeatable."},
        FROM,
        TO,
        PAGE_SIZE,
        CONTINUATION,
    ),
)
def endpoint_events(req: func.HttpRequest) -> EventPage:
    from management.models import EventPage, EventSummary

    endpoint_id = route_value(req, "endpointId")
    status = req.params.get("status") or None
    if status is not None and status not in BUCKET_NAMES:
        raise InvalidInput(f"status must be one of {', '.join(BUCKET_NAMES)}.", field="status")
    types = [t.strip() for t in (req.params.get("eventTypeId") or "").split(",") if t.strip()]
    if len(types) > 32:
        raise InvalidInput("At most 32 eventTypeId filters.", field="eventTypeId")
    oldest, newest = time_param(req, "from"), time_param(req, "to")
    if oldest and newest and oldest > newest:
        raise InvalidInput("from must not be after to.", field="from")
    page = service.overview().events(
        endpoint_id,
        bucket=status,
        event_type_ids=types,
        oldest=oldest,
        newest=newest,
        page_size=page_size(req, 50, 200),
        continuation=req.params.get("continuationToken") or None,
    )
    # The status's count is the overview's (snapshot + deltas: 2 round trips per counts partition), exact
    # for the listing only while nothing else narrows it; read with the first page, which the rest follow.
    first = not req.params.get("continuationToken")
    counted = status if first and not (types or oldest or newest) else None
    return EventPage(
        items=[EventSummary.of(endpoint_id, row) for row in page.items],
        continuation_token=page.continuation,
        count=service.overview().counts(endpoint_id)[counted] if counted else None,
    )


@operator_read(
    bp,
    "v1/endpoints/{endpointId}/events/{eventId}",
    "One event with its history, audits, the actions it allows and the payload to resubmit",
    MODELS + "OperatorEventView",
    query_route="v1/endpoints/event",
    responses={**AUTH, 404: "Unknown event"},
    parameters=(ENDPOINT, EVENT),
)
def endpoint_event(req: func.HttpRequest) -> OperatorEventView:
    from handoff.models import EventView
    from handoff.storage.records import ClaimRow
    from handoff.storage.store import classify_event_rows
    from management.actions import offered_actions, payload_of
    from management.models import OperatorEventView

    endpoint_id, event_id = route_value(req, "endpointId"), route_value(req, "eventId")
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

# Index rows counted for an answer's ``count`` (keys only: one request per shard); beyond, "at least".
_COUNT_CAP = 1000
INDEX_PAGE_SIZE = {**PAGE_SIZE, "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}


def _stuck_counts(endpoint_id: str) -> dict[str, Any]:
    """Unconfirmed settlements and overdue hand-offs of an endpoint, counted on their index rows up to
    :data:`_COUNT_CAP` (beyond: "at least")."""
    store = service.store()
    unconfirmed = store.count_range(endpoint_id, *keys.UNCONFIRMED_RANGE, cap=_COUNT_CAP)
    overdue = store.count_range(endpoint_id, *keys.expiry_range_until(utcnow()), cap=_COUNT_CAP)
    return {
        "unconfirmed": unconfirmed,
        "unconfirmed_at_least": unconfirmed >= _COUNT_CAP,
        "overdue_handoffs": overdue,
        "overdue_handoffs_at_least": overdue >= _COUNT_CAP,
    }


def _settlement_view(claim: Any, state: str | None = None) -> SettlementView:
    """A settlement claim (or an unconfirmed index row, its ``state`` given) as operators see it."""
    from management.models import SettlementView

    return SettlementView(
        event_id=claim.event_id,
        addressed_message_id=claim.parked_message_id,
        control_message_id=claim.control_message_id,
        message_type=claim.message_type.name,
        state=state or claim.state.name,
        settled_by=claim.settled_by,
        claimed_at=claim.claimed_at,
    )


def _index_page(
    req: func.HttpRequest, what: str, span: tuple[str, str], read: Callable[[str | None, int], list[Any]]
) -> dict[str, Any]:
    """A page of an endpoint's index rows in ``span`` (``read(after, limit)``: the rows behind the key
    ``after``, in key order over every shard) with the count of them all: what the model's fields hold."""
    from common import page_tokens

    endpoint_id = route_value(req, "endpointId")
    limit = page_size(req, 200, 1000)
    bound = page_tokens.binding(what, endpoint_id)
    token = req.params.get("continuationToken")
    after = page_tokens.strings(page_tokens.decode(token, bound), 1)[0] if token else None
    if after is not None and not span[0] <= after < span[1]:
        raise page_tokens.refused()
    rows = read(after, limit + 1)
    count = service.store().count_range(endpoint_id, *span, cap=_COUNT_CAP)
    more = len(rows) > limit
    return {
        "endpoint_id": endpoint_id,
        "count": count,
        "at_least": count >= _COUNT_CAP,
        "rows": rows[:limit],
        "continuation_token": page_tokens.encode(bound, [rows[limit - 1].row_key]) if more else None,
    }


@_per_endpoint(
    "unconfirmed",
    "Settlements Settle could neither confirm nor safely re-send: an operator resolves each (paged)",
    MODELS + "UnconfirmedSettlements",
    responses=INVALID,
    more=(INDEX_PAGE_SIZE, CONTINUATION),
)
def endpoint_unconfirmed(req: func.HttpRequest) -> UnconfirmedSettlements:
    from management.models import UnconfirmedSettlements

    endpoint_id = route_value(req, "endpointId")
    page = _index_page(
        req,
        "unconfirmed",
        keys.UNCONFIRMED_RANGE,
        lambda after, limit: service.store().unconfirmed(endpoint_id, after=after, limit=limit),
    )
    rows = page.pop("rows")
    return UnconfirmedSettlements(**page, items=[_settlement_view(r, "unconfirmed") for r in rows])


@_per_endpoint(
    "overdue",
    "Parked hand-offs past their ExpectedBy, most overdue first (the expiry index, no scan; paged)",
    MODELS + "OverdueHandoffs",
    responses=INVALID,
    more=(INDEX_PAGE_SIZE, CONTINUATION),
)
def endpoint_overdue(req: func.HttpRequest) -> OverdueHandoffs:
    from handoff.storage.records import ExpiryRow
    from management.models import OverdueHandoff, OverdueHandoffs

    endpoint_id = route_value(req, "endpointId")
    now = utcnow()
    store = service.store()

    def read(after: str | None, limit: int) -> list[ExpiryRow]:
        behind = dict.fromkeys(store.endpoint_partitions(endpoint_id), after) if after else None
        return [ExpiryRow.from_entity(e) for e in store.expired(endpoint_id, now, after=behind, limit=limit)]

    page = _index_page(req, "overdue", keys.expiry_range_until(now), read)
    rows = page.pop("rows")
    return OverdueHandoffs(
        **page, items=[OverdueHandoff(event_id=r.event_id, expected_by=r.expected_by) for r in rows]
    )


@operator_read(
    bp,
    "v1/audits",
    "Operator audits by endpoint, type, operator and time (hoaudit by day; oldest first)",
    MODELS + "AuditSearchPage",
    responses=INVALID,
    parameters=(
        FROM,
        TO,
        *(
            {"name": name, "in": "query", "schema": {"type": "string"}}
            for name in ("endpointId", "auditType", "by")
        ),
        PAGE_SIZE,
        CONTINUATION,
    ),
)
def audits_search(req: func.HttpRequest) -> AuditSearchPage:
    from common import page_tokens
    from handoff.models import AuditEntry
    from management.audits import search
    from management.models import AuditSearchEntry, AuditSearchPage

    # No "to": up to now, plus the skew Settle's clock may move by (it follows storage's clock), so an
    # audit written a moment ago is never outside the default window.
    newest = time_param(req, "to") or utcnow() + timedelta(minutes=5)
    oldest = time_param(req, "from") or newest - timedelta(days=1)
    # Bound to the filters as given: a window left open moves with the clock, its token stays valid.
    bound = page_tokens.binding(
        "audits", *(req.params.get(n) for n in ("from", "to", "endpointId", "auditType", "by"))
    )
    token = req.params.get("continuationToken")
    found = search(
        service.store(),
        oldest=oldest,
        newest=newest,
        endpoint_id=query_value(req, "endpointId"),
        audit_type=query_value(req, "auditType"),
        by=query_value(req, "by"),
        page_size=page_size(req, 50, 200),
        after=page_tokens.strings(page_tokens.decode(token, bound), 1)[0] if token else None,
    )
    return AuditSearchPage(
        items=[
            AuditSearchEntry(
                **AuditEntry.of(row).model_dump(by_alias=False),
                endpoint_id=row.endpoint_id,
                event_id=row.event_id,
            )
            for row in found.items
        ],
        continuation_token=page_tokens.encode(bound, [found.last_key]) if found.last_key else None,
    )


@operator_read(
    bp,
    "v1/find",
    "Hand-offs across endpoints by any id: event id (or its first 3+ characters), session, message "
    "or external job id, any case, with what matched (hoids: a few reads at any number of endpoints)",
    MODELS + "FindAnswer",
    responses={
        **AUTH,
        400: "No id, an eventId prefix shorter than 3 characters, a bad pageSize or continuationToken "
        "(the problem names it)",
    },
    parameters=(
        *(
            {"name": name, "in": "query", "schema": {"type": "string"}}
            for name in ("q", "eventId", "sessionId", "messageId", "externalJobId")
        ),
        PAGE_SIZE,
        CONTINUATION,
    ),
)
def find_events(req: func.HttpRequest) -> FindAnswer:
    from management import find

    return find.answer(service.store(), req.params, page_size=page_size(req, find.MAX_HITS, find.MAX_PAGE))


@operator_read(
    bp,
    "v1/failed",
    "Failed and dead-lettered events across endpoints, newest change first, page by page",
    MODELS + "FindAnswer",
    responses={**AUTH, 400: "A bad pageSize or continuationToken (the problem names it)"},
    parameters=(PAGE_SIZE, CONTINUATION),
)
def failed_events(req: func.HttpRequest) -> FindAnswer:
    from management import failed
    from management.models import FindAnswer

    items, token = failed.page(
        service.store(), page_size=page_size(req, 50, 200), token=req.params.get("continuationToken") or None
    )
    return FindAnswer(items=items, continuation_token=token)
