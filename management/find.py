"""Find, across endpoints: a hand-off by any id the other team gives (failed events: management.failed).

Never a scan, and a find's cost does not grow with the endpoints or their shards: the ids live in the
lookup index ``hoids`` (layout: :mod:`handoff.storage.keys`, docs/tables.md), written with the projection.

- **q** (``GET v1/find?q=``): an event id or its first characters (at least
  :data:`handoff.storage.keys.MIN_PREFIX`; fewer take only a whole id), a session id, a message id or an
  external job id, in any case. Two reads, sent together: the one partition of every other kind of id equal to
  ``q``, and the event-id range of ``q`` in its prefix partition. A fragment from the middle of an id
  is in neither.
- **eventId= / sessionId= / messageId= / externalJobId=**: the same, one kind only (one read).
- Then one point read of each hand-off found (its current row): a row written for an event whose
  projection never committed names nothing and is left out.
- **Pages** (``pageSize``, default :data:`MAX_HITS`, at most :data:`MAX_PAGE`; ``continuationToken``): the
  index is read as one stream, the exact-id partition first (whole session, message and job ids), then
  the event-id range, each in key order; a token is the position in that stream. A hand-off two of whose
  ids match is listed once, where the stream first meets it (its row says which of its ids match). A page
  lists its whole ids first, then oldest first.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from common.beside import Beside, side_by_side
from common.errors import InvalidInput
from common.tables import quoted
from handoff.projection.rules import error_text
from handoff.storage import keys
from handoff.storage.records import EventRow
from handoff.storage.store import HandoffStore
from management.models import FindAnswer, FoundEvent, IdMatch

MAX_HITS = 50  # the default page
MAX_PAGE = 200
# Longer than any id a key can hold (1 KiB): a longer text names nothing.
MAX_QUERY_CHARS = 1024
# The order matches are named in: the hand-off's own id first.
_KIND_ORDER = {kind: n for n, kind in enumerate(keys.ID_KINDS)}
_PARAMS = ("q", *keys.ID_KINDS)
# Where the stream meets each kind of whole id: the exact-id partition in key order (j|, m|, s|), then
# the event-id range.
_STREAM_ORDER = {"externalJobId": 0, "messageId": 1, "sessionId": 2, "eventId": 3}
_POINT_READERS = 16
_BAD_TOKEN = "continuationToken is not one this API issued for this find; start again without it."


def summary(endpoint_id: str, row: EventRow) -> FoundEvent:
    return FoundEvent.of(endpoint_id, row, reason=row.reason or _cut(error_text(row.message_content)))


def _cut(text: str | None) -> str | None:
    return text[:300] if text is not None else None


def answer(store: HandoffStore, params: Mapping[str, str], *, page_size: int = MAX_HITS) -> FindAnswer:
    """``GET v1/find``: ``q`` (any kind of id) or one of ``eventId``, ``sessionId``, ``messageId``,
    ``externalJobId`` (that kind only); a page of ``page_size`` from ``continuationToken``."""
    for name in _PARAMS:
        text = (params.get(name) or "").strip()
        if not text:
            continue
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidInput(f"{name} is longer than any id ({MAX_QUERY_CHARS} characters).", field=name)
        if name == "eventId" and len(text) < keys.MIN_PREFIX:
            raise InvalidInput(f"eventId needs at least {keys.MIN_PREFIX} characters.", field="eventId")
        kinds = keys.ID_KINDS if name == "q" else (name,)
        items, after = find_page(
            store, text, kinds=kinds, page_size=page_size, after=params.get("continuationToken") or None
        )
        return FindAnswer(items=items, continuation_token=after)
    raise InvalidInput(
        "Give q: an event id (or its first 3 characters), a session id, a message id or an external job id.",
        field="q",
    )


@dataclass(frozen=True)
class _Phase:
    """One part of the stream: a key range of one hoids partition, and which rows of it match."""

    name: str  # "x": the exact-id partition, "e": the event-id range
    partition: str
    low: str
    high: str
    keep: Callable[[Any], bool]


@dataclass(frozen=True)
class _Hit:
    phase: str
    row_key: str
    endpoint_id: str
    event_id: str
    match: IdMatch


def _phases(text: str, kinds: tuple[str, ...]) -> list[_Phase]:
    folded = keys.fold(text)
    phases = []
    others = tuple(k for k in kinds if k != "eventId")
    if others:
        low, high = keys.exact_kind_range(others[0]) if len(others) == 1 else ("", "\uffff")
        phases.append(
            _Phase(
                "x",
                keys.exact_id_partition(text),
                low,
                high,
                lambda r: r["Kind"] in others and keys.fold(str(r["Value"])) == folded,
            )
        )
    if "eventId" in kinds:
        prefix = len(text) >= keys.MIN_PREFIX
        low, high = keys.event_id_range(text) if prefix else keys.event_id_exact_range(text)
        # The key holds a long id cut: the whole id decides.
        phases.append(
            _Phase(
                "e",
                keys.event_id_partition(text),
                low,
                high,
                lambda r: keys.fold(str(r["Value"]))[: len(folded)] == folded,
            )
        )
    return phases


def _binding(text: str, kinds: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps([keys.fold(text), list(kinds)]).encode()).hexdigest()[:16]


def _encode(binding: str, hit: _Hit) -> str:
    raw = json.dumps({"f": binding, "p": hit.phase, "k": hit.row_key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str, binding: str, phases: list[_Phase]) -> tuple[int, str]:
    """(index of the phase, row key) a page ended at. Like the listings' tokens it only positions reads the
    caller may make anyway, so it needs no signature: it must name this find and lie inside its ranges."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        position = (data["f"], data["p"], data["k"])
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(_BAD_TOKEN, field="continuationToken") from exc
    found, name, row_key = position
    at = next((n for n, p in enumerate(phases) if p.name == name), None)
    if found != binding or at is None or not isinstance(row_key, str):
        raise InvalidInput(_BAD_TOKEN, field="continuationToken")
    if not phases[at].low <= row_key < phases[at].high:
        raise InvalidInput(_BAD_TOKEN, field="continuationToken")
    return at, row_key


def _read(store: HandoffStore, phase: _Phase, after: str | None, limit: int) -> list[_Hit]:
    """Up to ``limit`` matching rows of ``phase`` after ``after``, in key order (pages followed: a short
    page with a continuation does not end the range)."""
    query = (
        f"PartitionKey eq {quoted(phase.partition)} and RowKey {'gt' if after else 'ge'} "
        f"{quoted(after or phase.low)} and RowKey lt {quoted(phase.high)}"
    )
    hits: list[_Hit] = []
    for row in store.table(keys.IDS_TABLE).query_entities(query, results_per_page=min(limit, 1000)):
        if phase.keep(row):
            match = IdMatch(kind=row["Kind"], value=str(row["Value"]))
            hits.append(
                _Hit(phase.name, str(row["RowKey"]), str(row["EndpointId"]), str(row["EventId"]), match)
            )
            if len(hits) >= limit:
                break
    return hits


def _stream(
    store: HandoffStore, phases: list[_Phase], start: int, after: str | None, limit: int
) -> list[_Hit]:
    """The next ``limit`` hits of the stream from ``(start, after)``: the phases' reads sent together."""
    later = [
        Beside(partial(_read, store, phase, None, limit), name="settle-find") for phase in phases[start + 1 :]
    ]
    hits = _read(store, phases[start], after, limit)
    for read in later:
        hits += read.result()
    return hits[:limit]


def _row_matches(row: EventRow, text: str, kinds: tuple[str, ...]) -> list[IdMatch]:
    """The ids of the hand-off's current row that match ``text`` (an event id: that starts with it)."""
    folded = keys.fold(text)
    values = {
        "eventId": row.event_id,
        "sessionId": row.session_id,
        "messageId": row.last_message_id,
        "externalJobId": row.external_job_id,
    }
    found = []
    for kind in kinds:
        value = values[kind]
        if value is None:
            continue
        whole = keys.fold(value) == folded
        prefix = kind == "eventId" and len(folded) >= keys.MIN_PREFIX
        if whole or (prefix and keys.fold(value).startswith(folded)):
            found.append(IdMatch(kind=kind, value=value))
    return found


def _listed_before(hit: _Hit, matches: list[IdMatch], text: str) -> bool:
    """Whether the stream met this hand-off earlier, by another of its ids equal to ``text``."""
    folded = keys.fold(text)
    own = _STREAM_ORDER[hit.match.kind]
    return any(
        _STREAM_ORDER[m.kind] < own and keys.fold(m.value) == folded for m in matches if m.kind != "eventId"
    )


def find_page(
    store: HandoffStore,
    text: str,
    *,
    kinds: tuple[str, ...] = keys.ID_KINDS,
    page_size: int = MAX_HITS,
    after: str | None = None,
) -> tuple[list[FoundEvent], str | None]:
    """A page of the hand-offs carrying an id of ``kinds`` that is ``text`` in any case (an event id: that
    starts with ``text``), with what matched, and the token of the next page (None: this is the last)."""
    phases = _phases(text, kinds)
    binding = _binding(text, kinds)
    start, position = _decode(after, binding, phases) if after else (0, None)
    hits = _stream(store, phases, start, position, page_size + 1)
    more = len(hits) > page_size
    hits = hits[:page_size]
    targets: dict[tuple[str, str], list[_Hit]] = {}
    for hit in hits:
        targets.setdefault((hit.endpoint_id, hit.event_id), []).append(hit)
    rows = _point_reads(store, list(targets))
    folded = keys.fold(text)
    items: list[tuple[int, FoundEvent]] = []
    for (endpoint_id, event_id), found_by in targets.items():
        row = rows[(endpoint_id, event_id)]
        if row is None:
            continue  # a row of a projection that never committed
        matches = _row_matches(row, text, kinds)
        if _listed_before(found_by[0], matches, text):
            continue
        for hit in found_by:  # an id the row no longer shows (an earlier message's)
            if hit.match not in matches:
                matches.append(hit.match)
        matches.sort(key=lambda m: (keys.fold(m.value) != folded, _KIND_ORDER[m.kind]))
        item = summary(endpoint_id, row)
        item.matches = matches
        item.matched_by = matches[0].kind
        items.append((0 if keys.fold(matches[0].value) == folded else 1, item))
    items.sort(key=lambda pair: (pair[0], pair[1].enqueued_time_utc, pair[1].endpoint_id, pair[1].event_id))
    return [item for _, item in items], (_encode(binding, hits[-1]) if more else None)


def find(store: HandoffStore, text: str, *, kinds: tuple[str, ...] = keys.ID_KINDS) -> list[FoundEvent]:
    """The first page (:data:`MAX_HITS`) of :func:`find_page`."""
    return find_page(store, text, kinds=kinds)[0]


def _point_reads(
    store: HandoffStore, targets: list[tuple[str, str]]
) -> dict[tuple[str, str], EventRow | None]:
    """The current row of each hand-off (one point read each, a few at a time)."""
    rows = side_by_side(lambda t: store.get_event(*t), targets, workers=_POINT_READERS, name="settle-find")
    return dict(zip(targets, rows, strict=True))
