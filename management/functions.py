"""The management API's reads: the endpoints' counts, an endpoint's events, one event with what it
allows, stuck settlements and overdue hand-offs, find, failed events and the audit search.

Thin: parse, check who (:func:`management.api.operator_read`), ask :class:`management.reads.OperatorReads`
(:func:`management.services.operator_reads`), shape the answer. The models and the operator modules are
imported by the handler that needs them: indexing and a cold start load none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import azure.functions as func

from common import openapi
from common.clock import utcnow
from common.errors import InvalidInput
from common.http import Handler
from common.layouts import operator_warnings
from handoff.limits import query_value, route_value
from management import services
from management.api import (
    AUTH,
    BUCKET_NAMES,
    CONTINUATION,
    ENDPOINT,
    EVENT,
    FROM,
    INVALID,
    PAGE_SIZE,
    TO,
    models,
    operator_read,
    page_size,
    time_param,
)

if TYPE_CHECKING:
    from handoff.storage.records import ClaimRow, ExpiryRow, TableRecord, UnconfirmedRow
    from management.models import (
        AuditSearchPage,
        EndpointsOverview,
        EventPage,
        FindAnswer,
        IndexListing,
        OperatorEventView,
        OverdueHandoffs,
        SettlementView,
        UnconfirmedSettlements,
    )
    from management.reads import IndexPage


bp = func.Blueprint()


def _per_endpoint(
    what: str,
    summary: str,
    response: openapi.ModelRef,
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
    "Every endpoint with counts by status, oldest ages and poison (no scan of the table)",
    lambda: models.EndpointsOverview,
)
def endpoints_overview(req: func.HttpRequest) -> EndpointsOverview:
    from management.models import Counts, EndpointsOverview, EndpointSummary

    figures = services.operator_reads().figures()
    return EndpointsOverview(
        items=[
            EndpointSummary(
                endpoint_id=e.endpoint_id,
                counts=Counts(
                    pending=e.totals["Pending"],
                    pending_handoff=e.totals["PendingHandoff"],
                    deferred=e.totals["Deferred"],
                    failed=e.totals["Failed"],
                    dead_lettered=e.totals["DeadLettered"],
                    unsupported=e.totals["Unsupported"],
                    completed=e.totals["Completed"],
                    skipped=e.totals["Skipped"],
                    pending_at_least="Pending" in e.open_events.at_least,
                    pending_handoff_at_least="PendingHandoff" in e.open_events.at_least,
                    deferred_at_least="Deferred" in e.open_events.at_least,
                    failed_at_least="Failed" in e.open_events.at_least,
                    dead_lettered_at_least="DeadLettered" in e.open_events.at_least,
                    unsupported_at_least="Unsupported" in e.open_events.at_least,
                ),
                oldest_pending_at=e.open_events.oldest_pending_at,
                oldest_pending_at_least=e.open_events.oldest_pending_at_least,
                oldest_failed_at=e.open_events.oldest_failed_at,
                oldest_failed_at_least=e.open_events.oldest_failed_at_least,
                poison=e.poison,
                oldest_poison_day=e.oldest_poison_day,
                unconfirmed=e.unconfirmed.count,
                unconfirmed_at_least=e.unconfirmed.at_least,
                overdue_handoffs=e.overdue.count,
                overdue_handoffs_at_least=e.overdue.at_least,
            )
            for e in figures.endpoints
        ],
        unattributed_poison=figures.unattributed_poison,
        unattributed_oldest_poison_day=figures.unattributed_oldest_poison_day,
        warnings=operator_warnings(),  # docs/adr/0017: near one partition's budget, a setting overridden
    )


@_per_endpoint(
    "events",
    "A page of an endpoint's events, newest change first (status, type and time filters)",
    lambda: models.EventPage,
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
    page = services.operator_reads().events(
        endpoint_id,
        bucket=status,
        event_type_ids=types,
        oldest=oldest,
        newest=newest,
        page_size=page_size(req, 50, 200),
        continuation=req.params.get("continuationToken") or None,
    )
    return EventPage(
        items=[EventSummary.of(endpoint_id, row) for row in page.rows],
        continuation_token=page.continuation,
        count=page.count.count if page.count else None,
        at_least=bool(page.count and page.count.at_least),
    )


@operator_read(
    bp,
    "v1/endpoints/{endpointId}/events/{eventId}",
    "One event with its history, audits, the actions it allows and the payload to resubmit",
    lambda: models.OperatorEventView,
    query_route="v1/endpoints/event",
    responses={**AUTH, 404: "Unknown event"},
    parameters=(ENDPOINT, EVENT),
)
def endpoint_event(req: func.HttpRequest) -> OperatorEventView:
    from handoff.models import EventView
    from management.models import OperatorEventView

    endpoint_id, event_id = route_value(req, "endpointId"), route_value(req, "eventId")
    found = services.operator_reads().event(endpoint_id, event_id)
    view = EventView.of(found.row, found.history, found.audits)
    return OperatorEventView(
        **view.model_dump(by_alias=False),
        actions=found.actions,
        event_json=found.event_json,
        settlement=_settlement_view(found.claim, found.claim.state.name) if found.claim is not None else None,
    )


# -- stuck settlements and overdue hand-offs (index rows only) ---------------------------------------

INDEX_PAGE_SIZE = {**PAGE_SIZE, "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}


def _settlement_view(claim: ClaimRow | UnconfirmedRow, state: str) -> SettlementView:
    """A settlement claim (or an unconfirmed index row) in ``state``, as operators see it."""
    from management.models import SettlementView

    return SettlementView(
        event_id=claim.event_id,
        addressed_message_id=claim.parked_message_id,
        control_message_id=claim.control_message_id,
        message_type=claim.message_type.name,
        state=state,
        settled_by=claim.settled_by,
        claimed_at=claim.claimed_at,
    )


def _index_read(what: str, summary: str, response: openapi.ModelRef) -> Callable[[Handler], Any]:
    """Registers ``GET v1/endpoints/{endpointId}/<what>``, a listing of one of the endpoint's indexes
    (paged by its continuation token, up to 1,000 rows a page)."""
    return _per_endpoint(what, summary, response, responses=INVALID, more=(INDEX_PAGE_SIZE, CONTINUATION))


def _index_listing[Row: TableRecord, Listing: IndexListing](
    req: func.HttpRequest,
    what: str,
    read: Callable[..., IndexPage[Row]],
    listing: type[Listing],
    item: Callable[[Row], Any],
) -> Listing:
    """A page of an endpoint's index (``what``: the listing, which binds its tokens) read with
    ``read(endpoint_id, after=, limit=)``, each row answered as ``item(row)``."""
    from common import page_tokens

    endpoint_id = route_value(req, "endpointId")
    limit = page_size(req, 200, 1000)
    bound = page_tokens.binding(what, endpoint_id)
    token = req.params.get("continuationToken")
    after = page_tokens.strings(page_tokens.decode(token, bound), 1)[0] if token else None
    page = read(endpoint_id, after=after, limit=limit)
    return listing(
        endpoint_id=endpoint_id,
        count=page.count.count,
        at_least=page.count.at_least,
        items=[item(r) for r in page.rows],
        continuation_token=page_tokens.encode(bound, [page.last_key]) if page.last_key else None,
    )


@_index_read(
    "unconfirmed",
    "Settlements Settle could neither confirm nor safely re-send: an operator resolves each (paged)",
    lambda: models.UnconfirmedSettlements,
)
def endpoint_unconfirmed(req: func.HttpRequest) -> UnconfirmedSettlements:
    from management.models import UnconfirmedSettlements

    view = partial(_settlement_view, state="unconfirmed")
    unconfirmed = services.operator_reads().unconfirmed
    return _index_listing(req, "unconfirmed", unconfirmed, UnconfirmedSettlements, view)


@_index_read(
    "overdue",
    "Parked hand-offs past their ExpectedBy, oldest park first (the agent queue filtered on ExpectedBy: "
    "linear in the endpoint's parked hand-offs; paged)",
    lambda: models.OverdueHandoffs,
)
def endpoint_overdue(req: func.HttpRequest) -> OverdueHandoffs:
    from management.models import OverdueHandoff, OverdueHandoffs

    def view(row: ExpiryRow) -> OverdueHandoff:
        return OverdueHandoff(event_id=row.event_id, expected_by=row.expected_by)

    return _index_listing(req, "overdue", services.operator_reads().overdue, OverdueHandoffs, view)


@operator_read(
    bp,
    "v1/audits",
    "Operator audits by endpoint, type, operator and time (hoaudit by day; oldest first)",
    lambda: models.AuditSearchPage,
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
    from management.audits import AuditQuery
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
    query = AuditQuery(
        oldest=oldest,
        newest=newest,
        endpoint_id=query_value(req, "endpointId"),
        audit_type=query_value(req, "auditType"),
        by=query_value(req, "by"),
    )
    found = services.operator_reads().audit_search(
        query,
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
    lambda: models.FindAnswer,
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
    from management.find import MAX_HITS, MAX_PAGE

    return services.operator_reads().find_events(req.params, page_size=page_size(req, MAX_HITS, MAX_PAGE))


@operator_read(
    bp,
    "v1/failed",
    "Failed and dead-lettered events across endpoints, newest change first, page by page",
    lambda: models.FindAnswer,
    responses={**AUTH, 400: "A bad pageSize or continuationToken (the problem names it)"},
    parameters=(PAGE_SIZE, CONTINUATION),
)
def failed_events(req: func.HttpRequest) -> FindAnswer:
    from management.models import FindAnswer

    items, token = services.operator_reads().failed_events(
        page_size=page_size(req, 50, 200), token=req.params.get("continuationToken") or None
    )
    return FindAnswer(items=items, continuation_token=token)
