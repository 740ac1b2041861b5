"""What operators read about hand-offs: the endpoints' figures, an endpoint's events, one event with what it
allows, the stuck settlements and overdue hand-offs, the audit search, find and failed across endpoints.

The service behind :mod:`management.functions`: it reads (through the hand-off store and its overview),
asks :mod:`management.rules` and returns what it found; the blueprint parses the request and shapes the
answer. Built per call by :func:`management.services.operator_reads`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from common import page_tokens
from common.clock import utcnow
from common.errors import NotFound
from handoff.storage import keys
from handoff.storage.counts import POISON, Capped
from handoff.storage.overview import OpenEvents, Overview
from handoff.storage.records import (
    AuditRow,
    ClaimRow,
    EventRow,
    ExpiryRow,
    HistoryRow,
    ListingRow,
    TableRecord,
    UnconfirmedRow,
)
from handoff.storage.store import HandoffStore, classify_event_rows
from management import failed, find, rules
from management.audits import AuditQuery, AuditSearch, search
from management.models import FindAnswer, FoundEvent


def _capped(count: int) -> Capped:
    """A count of index rows that stops at :data:`management.rules.COUNT_CAP`."""
    return Capped(count, rules.at_least(count))


@dataclass(frozen=True)
class EndpointFigures:
    """One endpoint in the overview: its counts by status (the open ones up to their cap: ``open_events``
    says which stopped there, and whether the oldest ages are of all the events) and what is oldest or
    stuck."""

    endpoint_id: str
    totals: dict[str, int]
    open_events: OpenEvents
    poison: int
    oldest_poison_day: str | None
    unconfirmed: Capped
    overdue: Capped


@dataclass(frozen=True)
class Figures:
    """Every endpoint's figures, and the poison that names no endpoint."""

    endpoints: list[EndpointFigures]
    unattributed_poison: int
    unattributed_oldest_poison_day: str | None


@dataclass(frozen=True)
class EventsPage:
    rows: list[ListingRow]
    continuation: str | None
    count: Capped | None  # the listed status's count, when the listing is counted (rules.counted_status)


@dataclass(frozen=True)
class EventDetail:
    """One event as operators see it: its rows, the claim on its current message and what it allows."""

    row: EventRow
    history: list[HistoryRow]
    audits: list[AuditRow]
    claim: ClaimRow | None
    actions: list[str]
    event_json: str | None


@dataclass(frozen=True)
class IndexPage[Row: TableRecord]:
    """A page of an endpoint's index rows, the count of them all and, when more follow, the key of the
    page's last row (where the next page starts)."""

    rows: list[Row]
    count: Capped
    last_key: str | None


class OperatorReads:
    def __init__(
        self, store: HandoffStore, overview: Overview, *, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.store = store
        self.overview = overview
        self.clock = clock

    # -- overview and listings ----------------------------------------------------------------------

    def figures(self) -> Figures:
        """Every endpoint with counts by status, oldest ages, poison and stuck counts: the tallies (exact) and
        one keys-only read of the open events' rows per endpoint and shard, each status up to its cap (no
        scan of the table)."""
        endpoints = []
        for endpoint_id in sorted(self.store.endpoints()):
            totals = self.overview.tallies(endpoint_id)
            open_events = self.overview.open_events(endpoint_id)
            totals.update(open_events.totals)
            poison = totals[POISON]
            endpoints.append(
                EndpointFigures(
                    endpoint_id=endpoint_id,
                    totals=totals,
                    open_events=open_events,
                    poison=poison,
                    oldest_poison_day=self.overview.oldest_poison_day(endpoint_id) if poison else None,
                    unconfirmed=self._count(endpoint_id, keys.UNCONFIRMED_RANGE),
                    overdue=self._overdue_count(endpoint_id, self.clock()),
                )
            )
        unattributed = self.overview.counts(None)[POISON]
        return Figures(
            endpoints=endpoints,
            unattributed_poison=unattributed,
            unattributed_oldest_poison_day=self.overview.oldest_poison_day(None) if unattributed else None,
        )

    def events(
        self,
        endpoint_id: str,
        *,
        bucket: str | None,
        event_type_ids: list[str],
        oldest: datetime | None,
        newest: datetime | None,
        page_size: int,
        continuation: str | None,
    ) -> EventsPage:
        """A page of an endpoint's events, newest change first; counted as :func:`rules.counted_status`
        says (the overview's count of that status: its tally, or its open rows counted)."""
        page = self.overview.events(
            endpoint_id,
            bucket=bucket,
            event_type_ids=event_type_ids,
            oldest=oldest,
            newest=newest,
            page_size=page_size,
            continuation=continuation,
        )
        counted = rules.counted_status(
            bucket, first_page=not continuation, event_type_ids=event_type_ids, oldest=oldest, newest=newest
        )
        return EventsPage(
            rows=page.items,
            continuation=page.continuation,
            count=self.overview.count(endpoint_id, counted) if counted else None,
        )

    def event(self, endpoint_id: str, event_id: str) -> EventDetail:
        """One event with its history, audits, the claim on its current message, the actions it allows
        and the payload a resubmit would send; one range read (claims included). 404 when unknown."""
        rows = list(self.store.event_rows(endpoint_id, event_id))
        row, history, event_audits = classify_event_rows(iter(rows))
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        current = keys.claim_row(row.event_id, row.last_message_id) if row.last_message_id else None
        claim = next((ClaimRow.from_entity(e) for e in rows if e["RowKey"] == current), None)
        return EventDetail(
            row=row,
            history=history,
            audits=event_audits,
            claim=claim,
            actions=rules.offered_actions(row, claim),
            event_json=rules.payload_of(history, row)[1],
        )

    # -- stuck settlements and overdue hand-offs (index rows only) ------------------------------------

    def unconfirmed(self, endpoint_id: str, *, after: str | None, limit: int) -> IndexPage[UnconfirmedRow]:
        """Settlements Settle could neither confirm nor safely re-send, in key order behind ``after``."""
        span = keys.UNCONFIRMED_RANGE
        self._within(after, span)
        rows = self.store.unconfirmed(endpoint_id, after=after, limit=limit + 1)
        return self._page(endpoint_id, span, rows, limit)

    def overdue(self, endpoint_id: str, *, after: str | None, limit: int) -> IndexPage[ExpiryRow]:
        """Parked hand-offs past their ExpectedBy, behind ``after``: the parks from before ADR-0022 change 5
        (their ``ex|`` rows) most overdue first, then the queue rows (``hq|``) **oldest park first**, read
        with a filter on ``ExpectedBy`` (``HandoffStore.expired``). Each row is read as an
        :class:`ExpiryRow` (event id, ExpectedBy, key) whatever its kind. The page and its count are linear
        in the endpoint's parked hand-offs (storage examines each), not in its table."""
        now = self.clock()
        self._within(after, keys.OVERDUE_RANGE)
        behind = dict.fromkeys(self.store.endpoint_partitions(endpoint_id), after) if after else None
        rows = [
            ExpiryRow.from_entity(e)
            for e in self.store.expired(endpoint_id, now, after=behind, limit=limit + 1)
        ]
        more = len(rows) > limit
        count = self._overdue_count(endpoint_id, now)
        return IndexPage(rows[:limit], count, rows[limit - 1].row_key if more else None)

    def _overdue_count(self, endpoint_id: str, now: datetime) -> Capped:
        """The parks due at ``now``, counted up to :data:`management.rules.COUNT_CAP` (keys only)."""
        return _capped(self.store.count_due(endpoint_id, now, cap=rules.COUNT_CAP))

    def _count(self, endpoint_id: str, span: tuple[str, str]) -> Capped:
        return _capped(self.store.count_range(endpoint_id, *span, cap=rules.COUNT_CAP))

    @staticmethod
    def _within(after: str | None, span: tuple[str, str]) -> None:
        """A page's start lies in the index range it pages (else the token is not this listing's)."""
        if after is not None and not span[0] <= after < span[1]:
            raise page_tokens.refused()

    def _page[Row: TableRecord](
        self, endpoint_id: str, span: tuple[str, str], rows: list[Row], limit: int
    ) -> IndexPage[Row]:
        count = self._count(endpoint_id, span)
        more = len(rows) > limit
        return IndexPage(rows[:limit], count, rows[limit - 1].row_key if more else None)

    # -- across endpoints ---------------------------------------------------------------------------

    def audit_search(self, query: AuditQuery, *, page_size: int, after: str | None) -> AuditSearch:
        """Operator audits by endpoint, type, operator and time (:mod:`management.audits`)."""
        return search(self.store, query, page_size=page_size, after=after)

    def find_events(self, params: Mapping[str, str], *, page_size: int) -> FindAnswer:
        """Hand-offs across endpoints by any id (:mod:`management.find`)."""
        return find.answer(self.store, params, page_size=page_size)

    def failed_events(self, *, page_size: int, token: str | None) -> tuple[list[FoundEvent], str | None]:
        """Failed and dead-lettered events across endpoints, newest first (:mod:`management.failed`)."""
        return failed.page(self.store, page_size=page_size, token=token)
