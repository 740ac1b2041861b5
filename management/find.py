"""Find, across endpoints: a hand-off by any id the other team gives, and failed events.

Never a scan, and a find's cost does not grow with the endpoints or their shards: the ids live in the
lookup index ``hoids`` (layout: :mod:`handoff.keys`, docs/tables.md), written with the projection.

- **q** (``GET v1/find?q=``): an event id or its first characters (at least :data:`MIN_PREFIX`; fewer take
  only a whole id), a session id, a message id or an external job id, in any case. Two reads, sent
  together: the event-id range of ``q`` in its prefix partition, and the one partition of every other kind
  of id equal to ``q``. A fragment from the middle of an id is in neither.
- **eventId= / sessionId= / messageId= / externalJobId=**: the same, one kind only (one read).
- Then one point read of each hand-off found (its current row; at most :data:`MAX_HITS`): a row written
  for an event whose projection never committed names nothing and is left out.
- **failed**: the first rows of ``sd|Failed|`` and ``sd|DeadLettered|`` per endpoint (newest first),
  merged newest first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.beside import Beside
from common.errors import InvalidInput
from common.tables import first_rows, quoted
from handoff import keys
from handoff.overview import Overview
from handoff.projection import error_text
from handoff.records import EventRow, ListingRow
from handoff.store import HandoffStore
from management.models import FindAnswer, FoundEvent, IdMatch

MIN_PREFIX = keys.MIN_PREFIX
MAX_HITS = 50
# Longer than any id a key can hold (1 KiB): a longer text names nothing.
MAX_QUERY_CHARS = 1024
# The order matches are named in: the hand-off's own id first.
_KIND_ORDER = {kind: n for n, kind in enumerate(keys.ID_KINDS)}
_PARAMS = ("q", *keys.ID_KINDS)


def summary(endpoint_id: str, row: EventRow) -> FoundEvent:
    return FoundEvent.of(endpoint_id, row, reason=row.reason or _cut(error_text(row.message_content)))


def _cut(text: str | None) -> str | None:
    return text[:300] if text is not None else None


def answer(store: HandoffStore, params: Mapping[str, str]) -> FindAnswer:
    """``GET v1/find``: ``q`` (any kind of id) or one of ``eventId``, ``sessionId``, ``messageId``,
    ``externalJobId`` (that kind only)."""
    for name in _PARAMS:
        text = (params.get(name) or "").strip()
        if not text:
            continue
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidInput(f"{name} is longer than any id ({MAX_QUERY_CHARS} characters).", field=name)
        if name == "eventId" and len(text) < MIN_PREFIX:
            raise InvalidInput(f"eventId needs at least {MIN_PREFIX} characters.", field="eventId")
        kinds = keys.ID_KINDS if name == "q" else (name,)
        return FindAnswer(items=find(store, text, kinds=kinds))
    raise InvalidInput(
        "Give q: an event id (or its first 3 characters), a session id, a message id or an external job id.",
        field="q",
    )


def _event_ids(store: HandoffStore, text: str) -> list[Any]:
    """Event id rows whose id starts with ``text`` (equals it, when shorter than the prefix)."""
    low, high = keys.event_id_range(text) if len(text) >= MIN_PREFIX else keys.event_id_exact_range(text)
    pk = keys.event_id_partition(text)
    query = f"PartitionKey eq {quoted(pk)} and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
    rows = first_rows(store.table(keys.IDS_TABLE).query_entities(query, results_per_page=MAX_HITS), MAX_HITS)
    folded = keys.fold(text)
    # The key holds a long id cut: the whole id decides.
    return [r for r in rows if keys.fold(str(r["Value"]))[: len(folded)] == folded]


def _exact_ids(store: HandoffStore, text: str, kinds: tuple[str, ...]) -> list[Any]:
    """Session, message and external job id rows equal to ``text`` (of ``kinds``)."""
    query = f"PartitionKey eq {quoted(keys.exact_id_partition(text))}"
    if len(kinds) == 1:
        low, high = keys.exact_kind_range(kinds[0])
        query += f" and RowKey ge {quoted(low)} and RowKey lt {quoted(high)}"
    rows = first_rows(store.table(keys.IDS_TABLE).query_entities(query, results_per_page=MAX_HITS), MAX_HITS)
    folded = keys.fold(text)
    return [r for r in rows if r["Kind"] in kinds and keys.fold(str(r["Value"])) == folded]


def find(store: HandoffStore, text: str, *, kinds: tuple[str, ...] = keys.ID_KINDS) -> list[FoundEvent]:
    """Every hand-off (at most :data:`MAX_HITS`) carrying an id of ``kinds`` that is ``text`` in any case
    (an event id: that starts with ``text``), with what matched; whole ids first, then oldest first."""
    others = tuple(k for k in kinds if k != "eventId")
    by_prefix = None
    if "eventId" in kinds:  # sent beside the other read: one find waits for one round trip of hoids
        by_prefix = Beside(lambda: _event_ids(store, text), name="settle-find-event-ids")
    rows = _exact_ids(store, text, others) if others else []
    if by_prefix is not None:
        rows = by_prefix.result() + rows
    matches: dict[tuple[str, str], list[IdMatch]] = {}
    for row in rows:
        found = matches.setdefault((str(row["EndpointId"]), str(row["EventId"])), [])
        match = IdMatch(kind=row["Kind"], value=str(row["Value"]))
        if match not in found:
            found.append(match)
    folded = keys.fold(text)
    items: list[tuple[int, FoundEvent]] = []
    for (endpoint_id, event_id), found in list(matches.items())[:MAX_HITS]:
        row = store.get_event(endpoint_id, event_id)
        if row is None:
            continue  # a row of a projection that never committed
        found.sort(key=lambda m: (keys.fold(m.value) != folded, _KIND_ORDER[m.kind]))
        item = summary(endpoint_id, row)
        item.matches = found
        item.matched_by = found[0].kind
        items.append((0 if keys.fold(found[0].value) == folded else 1, item))
    items.sort(key=lambda pair: (pair[0], pair[1].enqueued_time_utc, pair[1].endpoint_id, pair[1].event_id))
    return [item for _, item in items]


def failed(store: HandoffStore, overview: Overview, *, per_endpoint: int) -> list[FoundEvent]:
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
    return [FoundEvent.of(endpoint_id, row) for endpoint_id, row in items]
