"""Failed across endpoints (``GET v1/failed``): failed and dead-lettered events of every endpoint, newest
change first, page by page until every one was listed.

One stream, merged from the listing index of each endpoint, bucket (``sd|Failed|``, ``sd|DeadLettered|``)
and shard, ordered by the row's key after its bucket (``{inverted time}|{event id}``: newest first), then
endpoint and bucket. A page reads, in each of those ranges, the next ``pageSize + 1`` rows behind the
position the last page ended at, and keeps the first ``pageSize`` of their merge; its token is that
position (one row's sort key), so it stays small whatever the number of endpoints. Round trips per page:
1 (the endpoints) + 2 x S per endpoint, as the first page always cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from common import page_tokens
from common.tables import quoted
from handoff.storage import keys
from handoff.storage.records import ListingRow
from handoff.storage.store import HandoffStore
from management.models import FoundEvent

BUCKETS = ("Failed", "DeadLettered")
_QUERY = page_tokens.binding("failed")


@dataclass(frozen=True)
class _Hit:
    order: tuple[str, str, str]  # (key after the bucket, endpoint, bucket): the stream's order
    endpoint_id: str
    row: ListingRow


def _read(
    store: HandoffStore,
    endpoint_id: str,
    bucket: str,
    pk: str,
    after: tuple[str, str, str] | None,
    limit: int,
) -> list[_Hit]:
    """Up to ``limit`` rows of one range behind ``after`` in the stream's order."""
    prefix, high = keys.listing_range(bucket, None, None)
    low, op = prefix, "ge"
    if after is not None:
        # Behind ``after`` in the stream's order: a later key, or the same key at a later endpoint/bucket.
        low, op = prefix + after[0], "ge" if (endpoint_id, bucket) > after[1:] else "gt"
    query = f"PartitionKey eq {quoted(pk)} and RowKey {op} {quoted(low)} and RowKey lt {quoted(high)}"
    hits: list[_Hit] = []
    for entity in store.table(keys.EVENTS_TABLE).query_entities(query, results_per_page=min(limit, 1000)):
        order = (str(entity["RowKey"])[len(prefix) :], endpoint_id, bucket)
        hits.append(_Hit(order, endpoint_id, ListingRow.from_entity(entity)))
        if len(hits) >= limit:
            break
    return hits


def page(store: HandoffStore, *, page_size: int, token: str | None) -> tuple[list[FoundEvent], str | None]:
    """A page of failed and dead-lettered events of every endpoint, newest first, and the token of the
    next (None: this is the last)."""
    after: tuple[str, str, str] | None = None
    if token:
        tail, endpoint_id, bucket = page_tokens.strings(page_tokens.decode(token, _QUERY), 3)
        if bucket not in BUCKETS:
            raise page_tokens.refused()
        after = (tail, endpoint_id, bucket)
    hits: list[_Hit] = []
    for endpoint_id in sorted(store.endpoints()):
        for bucket in BUCKETS:
            for pk in store.endpoint_partitions(endpoint_id):
                hits += _read(store, endpoint_id, bucket, pk, after, page_size + 1)
    hits.sort(key=lambda h: h.order)
    items = [FoundEvent.of(h.endpoint_id, h.row) for h in hits[:page_size]]
    more = len(hits) > page_size
    return items, (page_tokens.encode(_QUERY, list(hits[page_size - 1].order)) if more else None)
