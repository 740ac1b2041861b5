"""Hand-off table names and key layout: the one place that says how every row is keyed, and why.

Table ``hoevents`` (PartitionKey = the endpoint id, encoded). One endpoint's whole hand-off world lives in
one partition so that the resolver writes the history row, the event row and every index row of a message
in **one** entity-group transaction (transactions are single-partition), and so that ``next`` and the job
lookup read a short, ordered key range instead of scanning:

=================================  =====================================================================
RowKey                             row
=================================  =====================================================================
``ev|{eventId}|e``                 the event row (NimBus ``UnresolvedEvent``; one per endpoint + event)
``ev|{eventId}|m|{messageId}``     history: one per projected message (insert-only = idempotent)
``ev|{eventId}|a|{stamp}|{id}``    audit rows (Resolver Comment, ResolveSettlement, AccessDenied; a
                                   claim's CompleteHandoff / FailHandoff / operator action before ADR-0022)
``ev|{eventId}|c|{parkedMsgId}``   the settlement claim of one parked message (an outbox record), also
                                   the audit of its control message (rendered from it, ADR-0022)
``hq|{parkedAt}|{eventId}``        pending hand-off queue, oldest first (agent ``next``); carries the
                                   park's ``ExpectedBy`` (the timeout sweeper and the overdue listing)
``jb|{externalJobId}|{eventId}``   parked row by external job id (before ADR-0022: deleted, never written)
``ex|{expectedBy}|{eventId}``      parked rows by ExpectedBy (before ADR-0022 change 5: deleted with
                                   their park, never written; read with ``hq|`` as :data:`OVERDUE_RANGE`)
``rc|{due}|{eventId}|{parked}``    open claims by when the reconciler looks at them next
``rc|{now}|~ids|{digest}``         lookup index rows whose insert failed, for the reconciler (``hoids``)
``uc|{eventId}|{parked}``          claims that could not be confirmed (operators)
``sd|{status}|{inverted updatedAt}|{eventId}``  an event's listing row in its status, newest first
``ad|…`` ``sa|…`` ``sd|PendingHandoff|…``  listing rows before ADR-0022: deleted when their event changes
``ct|0``                           the counts snapshot of the endpoint
``ct|d|{stamp}|{id}``              a counts delta (insert-only, written with the change it counts)
``pz|{day}|{poisonRowKey}``        an unreplayed poison message attributed to this endpoint
``ss|{sessionId}|{eventId}``       the events of one session (before ADR-0022; no longer written or read)
=================================  =====================================================================

Every row of one event shares the prefix ``ev|{eventId}|``, so the event read (row + history + audits)
is one range query.

Sharded endpoints (``SETTLE_HANDOFF_SHARDS`` = S, default 1): with S > 1 an endpoint's rows spread over S
partitions ``{endpoint}~{S:03d}-{shard:03d}``, shard = first 8 bytes of SHA-256 of the event id, big-endian,
mod S (``~`` is escaped in an encoded endpoint id, so no endpoint's partition equals another's shard). Every
row that belongs to one event (its ``ev|`` rows and its hq/jb/ex/rc/uc/ad/sd/sa/ss rows and the counts
deltas written with its changes) lives in the event's shard, so the resolver's and settlement's writes stay
one EGT. Each shard has its own ``ct|0`` snapshot; ``pz|`` rows (poison has no event) stay in the
unsharded partition ``{endpoint}``. Readers of an endpoint read each shard (first pages, merged) and sum the
shards' counts. With S = 1 every key is exactly the unsharded one above. S and its earlier values are a
:class:`Layout`: the one recorded in storage (common/layouts.py, read by ``handoff/storage/layout.py``; the
settings, ``SETTLE_HANDOFF_SHARDS_PREVIOUS`` the earlier values, only seed a first deployment), which the
composition root (``handoff/service.py``) hands to the store: an event keeps the partition it was created
in, a lookup that misses in the current layout probes the earlier ones, and every endpoint reader reads the
earlier layouts' shards too. Table ``hoendpoints`` lists endpoints that ever parked (the sweeper's only
cross-partition need); table ``hopoison`` keeps poison messages by day for operators.

Table ``hoids`` (the lookup index: operators find a hand-off by the id another team gives, across every
endpoint, in a few reads). One insert-only row per (kind, id, endpoint, event); ids are compared
case-insensitively (each character's simple upper case, as .NET's ``OrdinalIgnoreCase``: the folding keeps
the length, so a folded prefix is the prefix of the folded id):

=====================================  ==================================================================
PartitionKey / RowKey                  row
=====================================  ==================================================================
``e|{first 3 folded chars}`` /         an event id: the partition is its first three characters (the
``{folded id}|{digest}``               shortest prefix a search takes), so a prefix search is one range
                                       of one partition and a fragment from the middle of an id matches
                                       nothing
``x|{digest of the folded id}`` /      a session id, message id or external job id: one partition per
``{kind}|{digest}``                    folded value, holding every kind, so a whole id is one partition
=====================================  ==================================================================

``{digest}`` is the first 32 hex digits of SHA-256 of ``endpoint NUL event id`` (the row is the same
however often it is written); the columns carry ``Kind``, ``Value`` (the id as received), ``EndpointId``
and ``EventId``. A folded id longer than :data:`MAX_ID_KEY_CHARS` (escaped) is cut in the key, the service
compares the whole ``Value``. The resolver sends these inserts beside its event read; one that fails is
written into the event's transaction as a reconcile row (``rc|{now}|~ids|{digest}``, column ``Task`` =
``ids``) the reconciler replays.

Encoding: Table keys forbid ``/ \\ # ?`` and control characters, and ``|`` / ``~`` separate our parts, so
those (and ``%``) are written ``%XX``: injective, readable, and it keeps the range queries exact.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import KeyTooLong
from common.keys import MAX_KEY_BYTES, escape, key_bytes, unescape

EVENTS_TABLE = "hoevents"
ENDPOINTS_TABLE = "hoendpoints"
POISON_TABLE = "hopoison"
IDS_TABLE = "hoids"

ENDPOINTS_PARTITION = "endpoint"
# Counts of poison that names no endpoint: a partition no encoded endpoint id can equal (``~`` is escaped).
UNATTRIBUTED_PARTITION = "~unattributed"


def encode(value: str) -> str:
    """Injective key-safe form of ``value`` (``common.keys.escape``)."""
    return escape(value)


def decode(value: str) -> str:
    """Inverse of :func:`encode`."""
    return unescape(value)


def checked(key: str, *, field: str) -> str:
    """``key`` if within Azure's 1 KiB key limit, else a 400 naming ``field``."""
    if key_bytes(key) > MAX_KEY_BYTES:
        raise KeyTooLong(f"{field} is too long for a Table Storage key (1 KiB).", field=field)
    return key


def stamp(value: datetime) -> str:
    """Fixed-width, sortable UTC time for keys (``20261130T170457123456Z``)."""
    return value.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def partition(endpoint_id: str) -> str:
    return checked(encode(endpoint_id), field="endpointId")


MAX_SHARDS = 999
SHARDS_SETTING = "SETTLE_HANDOFF_SHARDS"
PREVIOUS_SHARDS_SETTING = "SETTLE_HANDOFF_SHARDS_PREVIOUS"


def _shards(text: str, setting: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(
            f"{setting} must be a whole number of shards (1-{MAX_SHARDS}); got {text!r}"
        ) from None
    if not 1 <= value <= MAX_SHARDS:
        raise ValueError(f"{setting} must be between 1 and {MAX_SHARDS}; got {value}")
    return value


def configured_shard_count() -> int:
    """S as ``SETTLE_HANDOFF_SHARDS`` says (default 1)."""
    return _shards(os.environ.get(SHARDS_SETTING) or "1", SHARDS_SETTING)


def configured_previous_shard_counts() -> tuple[int, ...]:
    """Earlier values of S as ``SETTLE_HANDOFF_SHARDS_PREVIOUS`` says."""
    text = (os.environ.get(PREVIOUS_SHARDS_SETTING) or "").replace(";", ",")
    current = configured_shard_count()
    found: list[int] = []
    for part in text.split(","):
        if part.strip():
            value = _shards(part, PREVIOUS_SHARDS_SETTING)
            if value != current and value not in found:
                found.append(value)
    return tuple(found)


def shard_of(event_id: str, shards: int) -> int:
    """The shard of one event: first 8 bytes of SHA-256 of the event id, big-endian, mod ``shards``."""
    return int.from_bytes(hashlib.sha256(event_id.encode()).digest()[:8], "big") % shards


def shard_partition(endpoint_id: str, shards: int, shard: int) -> str:
    """PartitionKey of one shard of an endpoint (the unsharded key when ``shards`` is 1)."""
    base = partition(endpoint_id)
    return base if shards == 1 else checked(f"{base}~{shards:03d}-{shard:03d}", field="endpointId")


def event_partition(endpoint_id: str, event_id: str, shards: int) -> str:
    """PartitionKey of every row of one event in the layout with ``shards``."""
    return shard_partition(endpoint_id, shards, shard_of(event_id, shards) if shards > 1 else 0)


@dataclass(frozen=True)
class Layout:
    """The hand-off layout keys route by: S now (``shards``), the earlier values of S whose rows must still
    be found (``previous``, newest first, none equal to S), and ``era``, how many layouts came before this
    one (a claim's ``Era``, ``common/fence.py``; a return to an earlier S is a new era).

    A process routes by the layout recorded in storage (:class:`handoff.storage.layout.RecordedLayout`,
    built by the composition root ``handoff/service.py``). A layout given as it is (tests, tools) is its own
    source: ``now()`` is itself and ``forget()`` has no copy to drop."""

    shards: int = 1
    previous: tuple[int, ...] = ()
    era: int = 0

    def __post_init__(self) -> None:
        for value in (self.shards, *self.previous):
            if not 1 <= value <= MAX_SHARDS:
                raise ValueError(f"{SHARDS_SETTING} must be between 1 and {MAX_SHARDS}; got {value}")
        if self.era < len(self.previous):
            raise ValueError(f"a layout after {len(self.previous)} earlier ones cannot be era {self.era}")

    def now(self) -> Layout:
        return self

    def forget(self) -> None:
        """A layout given as it is: no copy of a recorded one to drop."""

    def event_partition(self, endpoint_id: str, event_id: str) -> str:
        """PartitionKey of every row of one event created now."""
        return event_partition(endpoint_id, event_id, self.shards)

    def earlier_event_partitions(self, endpoint_id: str, event_id: str) -> list[str]:
        """Where an event created under an earlier layout lives (none equal to its partition now)."""
        current = self.event_partition(endpoint_id, event_id)
        found: list[str] = []
        for count in self.previous:
            pk = event_partition(endpoint_id, event_id, count)
            if pk != current and pk not in found:
                found.append(pk)
        return found

    def endpoint_partitions(self, endpoint_id: str) -> list[str]:
        """Every partition that can hold rows of the endpoint: the current layout's shards, then earlier
        ones'."""
        found: list[str] = []
        for count in (self.shards, *self.previous):
            for shard in range(count):
                pk = shard_partition(endpoint_id, count, shard)
                if pk not in found:
                    found.append(pk)
        return found


def event_prefix(event_id: str) -> str:
    return f"ev|{encode(event_id)}|"


def event_range(event_id: str) -> tuple[str, str]:
    """``[low, high)`` of every row of one event (``}`` sorts right after ``|``)."""
    prefix = event_prefix(event_id)
    return prefix, prefix[:-1] + "}"


def event_row(event_id: str) -> str:
    return checked(event_prefix(event_id) + "e", field="eventId")


def history_row(event_id: str, message_id: str) -> str:
    return checked(f"{event_prefix(event_id)}m|{encode(message_id)}", field="messageId")


def audit_row(event_id: str, at: datetime, audit_id: str) -> str:
    return checked(f"{event_prefix(event_id)}a|{stamp(at)}|{audit_id}", field="eventId")


def claim_row(event_id: str, parked_message_id: str) -> str:
    return checked(f"{event_prefix(event_id)}c|{encode(parked_message_id)}", field="messageId")


def claim_range(event_id: str) -> tuple[str, str]:
    """Every claim of one event (one per parked message it ever had)."""
    prefix = f"{event_prefix(event_id)}c|"
    return prefix, prefix[:-1] + "}"


RECONCILE_RANGE = ("rc|", "rc}")


def reconcile_row(due: datetime, event_id: str, parked_message_id: str) -> str:
    return checked(
        f"rc|{stamp(due)}|{encode(event_id)}|{encode(parked_message_id)}", field="coordinates.messageId"
    )


def reconcile_range_until(now: datetime) -> tuple[str, str]:
    """Reconcile rows due at or before ``now``."""
    return "rc|", f"rc|{stamp(now)}}}"


def ids_repair_row(now: datetime, event_id: str, message_id: str) -> str:
    """A reconcile row carrying lost lookup index rows (``~`` cannot begin an encoded event id, so it is
    never a claim's row)."""
    return f"rc|{stamp(now)}|~ids|{_digest(event_id, message_id)}"


UNCONFIRMED_RANGE = ("uc|", "uc}")


def unconfirmed_row(event_id: str, parked_message_id: str) -> str:
    return checked(f"uc|{encode(event_id)}|{encode(parked_message_id)}", field="coordinates.messageId")


QUEUE_RANGE = ("hq|", "hq}")


def queue_row(parked_at: datetime, event_id: str) -> str:
    return checked(f"hq|{stamp(parked_at)}|{encode(event_id)}", field="eventId")


def job_range(external_job_id: str) -> tuple[str, str]:
    prefix = checked(f"jb|{encode(external_job_id)}|", field="externalJobId")
    return prefix, prefix[:-1] + "}"


def expiry_row(expected_by: datetime, event_id: str) -> str:
    """The key of a park's expiry row as written before ADR-0022 change 5 (no longer written)."""
    return checked(f"ex|{stamp(expected_by)}|{encode(event_id)}", field="eventId")


def expiry_range_until(now: datetime) -> tuple[str, str]:
    """Expiry rows (written before ADR-0022 change 5) whose ExpectedBy is at or before ``now``."""
    return "ex|", f"ex|{stamp(now)}}}"


# The parks the timeout sweeper and the overdue listing read (ADR-0022 change 5): the ``ex|`` rows of parks
# from before and every ``hq|`` row, one key range, since no other row kind sorts between ``ex|`` and
# ``hq}``. Every row of it that names a due park carries ``ExpectedBy``, so one server-side filter on that
# column (``handoff.storage.store.HandoffStore.expired``) finds them; a park without ExpectedBy, or from
# before with its ``ExpectedBy`` on its ``ex|`` row only, is in the range once. In key order: the old
# parks by ExpectedBy, then the queue by when each event parked.
OVERDUE_RANGE = ("ex|", "hq}")


def poison_keys(enqueued: datetime, message_id: str | None) -> tuple[str, str]:
    """Poison rows by UTC day; the RowKey is stable across redeliveries of one message (insert-only)."""
    ident = encode(message_id or "")
    if not ident or len(ident) > 200:
        ident = "h-" + hashlib.sha256((message_id or "").encode()).hexdigest()
    return enqueued.astimezone(UTC).strftime("%Y%m%d"), f"{stamp(enqueued)}|{ident}"


# -- operator listings and counts (see management/ and docs/tables.md) --------------------------------

_INVERT_FROM = 10**17 - 1  # microseconds since 1970: fixed width (17 digits) until the year 5138


def inverted(value: datetime) -> str:
    """Fixed-width key part that sorts *newest first*."""
    micros = int(value.astimezone(UTC).timestamp() * 1_000_000)
    return f"{_INVERT_FROM - micros:017d}"


def bucket_row(status: str, updated_at: datetime, event_id: str) -> str:
    """An event's listing row: in its status's range, newest change first (ADR-0022: one per event)."""
    return checked(f"sd|{status}|{inverted(updated_at)}|{encode(event_id)}", field="eventId")


def listing_prefix(status: str) -> str:
    return f"sd|{status}|"


def listing_range(status: str, newest: datetime | None, oldest: datetime | None) -> tuple[str, str]:
    """``[low, high)`` of the listing rows of ``status`` changed in [oldest, newest].

    Newest first: ``newest`` (the ``to`` filter) is the low end, ``oldest`` (``from``) the high end.
    """
    prefix = listing_prefix(status)
    low = prefix + inverted(newest) if newest else prefix
    high = prefix + inverted(oldest) + "}" if oldest else prefix[:-1] + "}"
    return low, high


def listing_status(row_key: str) -> str:
    """The status a listing row's key names."""
    return row_key[3:].split("|", 1)[0]


def open_ranges(statuses: Sequence[str], listed: Sequence[str]) -> list[tuple[str, str]]:
    """The fewest ``[low, high)`` ranges holding the listing rows of ``statuses`` and no other listed status
    (``listed``: every status with rows): neighbouring statuses in key order share one range read."""
    ordered = sorted(listed, key=listing_prefix)
    ranges: list[tuple[str, str]] = []
    run: list[str] = []
    for status in [*ordered, ""]:
        if status in statuses:
            run.append(status)
            continue
        if run:
            ranges.append((listing_prefix(run[0]), listing_prefix(run[-1])[:-1] + "}"))
            run = []
    return ranges


# Rows of the layout before ADR-0022, never written now: an event row that still names one deletes it when
# the event next changes (the keys are kept so tests can write such rows as the old code did).


def all_events_row(updated_at: datetime, event_id: str) -> str:
    return checked(f"ad|{inverted(updated_at)}|{encode(event_id)}", field="eventId")


def since_row(group: str, since: datetime, event_id: str) -> str:
    return checked(f"sa|{group}|{stamp(since)}|{encode(event_id)}", field="eventId")


COUNTS_SNAPSHOT = "ct|0"
COUNTS_RANGE = ("ct|", "ct}")


def delta_row(at: datetime, ident: str) -> str:
    return f"ct|d|{stamp(at)}|{ident}"


POISON_INDEX_RANGE = ("pz|", "pz}")


def poison_index_row(day: str, poison_row_key: str) -> str:
    return checked(f"pz|{day}|{encode(poison_row_key)}", field="id")


# -- find (operators): the events of one session -----------------------------------------------------


# -- hoids: the lookup index (see the module docstring) ---------------------------------------------------

ID_KINDS = ("eventId", "sessionId", "messageId", "externalJobId")
_KIND_LETTER = {"eventId": "e", "sessionId": "s", "messageId": "m", "externalJobId": "j"}
# The shortest event id prefix a search takes (and the event id partitions' width).
MIN_PREFIX = 3
# Escaped folded id kept in a key: with a 34-character digest part, within 1 KiB as UTF-16.
MAX_ID_KEY_CHARS = 400


def fold(text: str) -> str:
    """Case-insensitive form of an id: each character's simple upper case (``ß`` stays ``ß``), so the length
    and every prefix are kept."""
    return "".join(u if len(u := c.upper()) == 1 else c for c in text)


def _id_key(text: str) -> str:
    return encode(fold(text))[:MAX_ID_KEY_CHARS]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def event_id_partition(text: str) -> str:
    """The partition of event ids starting with the first three characters of ``text`` (folded)."""
    return "e|" + encode(fold(text[:MIN_PREFIX]))


def exact_id_partition(text: str) -> str:
    """The partition of every session, message and external job id equal to ``text`` (folded)."""
    return "x|" + _digest(fold(text))


def id_keys(kind: str, value: str, endpoint_id: str, event_id: str) -> tuple[str, str]:
    """``(PartitionKey, RowKey)`` of the index row saying ``endpoint_id``'s ``event_id`` has ``value``."""
    target = _digest(endpoint_id, event_id)
    if kind == "eventId":
        return event_id_partition(value), f"{_id_key(value)}|{target}"
    return exact_id_partition(value), f"{_KIND_LETTER[kind]}|{target}"


def exact_kind_range(kind: str) -> tuple[str, str]:
    """``[low, high)`` of one kind's rows in an exact id partition."""
    letter = _KIND_LETTER[kind]
    return f"{letter}|", f"{letter}}}"


def event_id_range(text: str) -> tuple[str, str]:
    """``[low, high)`` of the event id rows whose folded id starts with ``text`` folded (in its partition):
    ids at least as long as ``text`` (``\uffff`` sorts after every character of a key)."""
    low = _id_key(text)
    return low, low + "\uffff"


def event_id_exact_range(text: str) -> tuple[str, str]:
    """``[low, high)`` of the rows of event ids equal to ``text`` folded (a search shorter than
    :data:`MIN_PREFIX` takes only a whole id)."""
    low = _id_key(text)
    return low + "|", low + "}"
