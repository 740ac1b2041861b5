"""Find, across endpoints: an event by id (or id prefix), the events of a session, failed events.

Never a scan: the endpoints are the short ``hoendpoints`` list, and per endpoint each lookup is one key
read or one bounded key range of that endpoint's partition:

- **event id**: a range read of ``ev|{eventId}``… (the id, or an id prefix of at least
  :data:`MIN_PREFIX` characters), filtered by the service to event rows (the only rows with
  ``HistoryCount``), at most :data:`MAX_HITS` per endpoint;
- **session id**: the ``ss|{sessionId}|`` range (the resolver inserts one row per event, in the
  transaction that creates its event row), then one point read per event row;
- **failed**: the first rows of ``sd|Failed|`` and ``sd|DeadLettered|`` per endpoint (newest first),
  merged newest first.
"""

from __future__ import annotations

import json
from typing import Any

from common.errors import InvalidInput
from handoff import keys
from handoff.records import EventRow, ListingRow
from handoff.store import HandoffStore
from management.models import EventSummary
from management.overview import Overview

MIN_PREFIX = 3
MAX_HITS = 50


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _error_text(content: str | None) -> str | None:
    if not content:
        return None
    try:
        data: Any = json.loads(content)
    except ValueError:
        return None
    error = data.get("ErrorContent") if isinstance(data, dict) else None
    text = error.get("ErrorText") if isinstance(error, dict) else None
    return text[:300] if isinstance(text, str) else None


def summary(endpoint_id: str, row: EventRow) -> EventSummary:
    return EventSummary.of(endpoint_id, row, reason=row.reason or _error_text(row.message_content))


def by_event_id(store: HandoffStore, text: str) -> list[EventSummary]:
    text = text.strip()
    if len(text) < MIN_PREFIX:
        raise InvalidInput(f"eventId needs at least {MIN_PREFIX} characters.", field="eventId")
    table = store.table(keys.EVENTS_TABLE)
    low = "ev|" + keys.encode(text)
    high = low + "\uffff"
    found: list[EventSummary] = []
    for endpoint_id in sorted(store.endpoints()):
        # A prefix can match events of any shard: one short range read per shard (the exact id is in the
        # shard its hash names, so it is always among them).
        hits = 0
        for pk in keys.endpoint_partitions(endpoint_id):
            query = (
                f"PartitionKey eq {_quote(pk)} and RowKey ge {_quote(low)} and RowKey lt {_quote(high)} "
                "and HistoryCount ge 0"
            )
            for n, entity in enumerate(table.query_entities(query, results_per_page=MAX_HITS)):
                if n == MAX_HITS or hits == MAX_HITS:
                    break
                hits += 1
                found.append(summary(endpoint_id, EventRow.from_entity(entity)))
    exact = [s for s in found if s.event_id == text]
    return exact + [s for s in found if s.event_id != text]


def by_session(store: HandoffStore, session_id: str) -> list[EventSummary]:
    if not session_id.strip():
        raise InvalidInput("sessionId is required.", field="sessionId")
    from azure.core.exceptions import ResourceNotFoundError

    table = store.table(keys.EVENTS_TABLE)
    low, high = keys.session_range(session_id)
    found: list[EventSummary] = []
    for endpoint_id in sorted(store.endpoints()):
        for pk in keys.endpoint_partitions(endpoint_id):  # a session's events may sit in every shard
            query = f"PartitionKey eq {_quote(pk)} and RowKey ge {_quote(low)} and RowKey lt {_quote(high)}"
            for index in table.query_entities(query, select=["EventId"]):
                try:
                    entity = table.get_entity(pk, keys.event_row(str(index["EventId"])))
                except ResourceNotFoundError:
                    continue
                found.append(summary(endpoint_id, EventRow.from_entity(entity)))
    return sorted(found, key=lambda s: s.enqueued_time_utc)


def failed(store: HandoffStore, overview: Overview, *, per_endpoint: int) -> list[EventSummary]:
    items: list[tuple[str, ListingRow]] = []
    for endpoint_id in sorted(store.endpoints()):
        for bucket in ("Failed", "DeadLettered"):
            page = overview.events(
                endpoint_id,
                bucket=bucket,
                event_type_ids=(),
                oldest=None,
                newest=None,
                page_size=per_endpoint,
                continuation=None,
            )
            items += [(endpoint_id, row) for row in page.items]
    items.sort(key=lambda pair: pair[1].updated_at, reverse=True)
    return [EventSummary.of(endpoint_id, row) for endpoint_id, row in items]
