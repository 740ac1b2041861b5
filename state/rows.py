"""The rows of the state table as typed records, and the one place that maps them to and from a Table entity.

A record is a head (its current version, ``state/keys.py`` lays out its keys) and history rows (each
version it superseded, the same columns plus three that say when and by which version). Beside them in
the record's partition stand the expiry-index rows: a row named by the head's ``LockIndexKey`` or
``RetainIndexKey`` that points back at the head (``StateRK``), so catch-up finds expired locks and
retentions by a range read, and each minute's markers; in table ``statelocks``, the index's level-1 rows
(``state/expiry.py``).

The column names are PascalCase, as the table has always held them; here each is said once, beside the
attribute that reads it. What a record's data is (``Data0`` .. ``DataN`` chunks of the envelope) is
``state/envelope.py``'s business: a row carries those properties as they are. A column this module does
not name is kept too (``other``), so reading and writing a row back never loses a property.

Types are the entity's: integers are Edm.Int32, except ``RetentionSeconds``, written as Edm.Int64
(``common.limits.int64``) and read back whichever way storage returns it; instants are datetimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from common.limits import int64, plain_int
from state.envelope import DATA_PREFIX
from state.keys import (
    is_marker,
    level1_partition,
    marker_row_key,
    parse_level1_partition,
    parse_marker_row_key,
)
from state.model import Status

PARTITION_KEY = "PartitionKey"
ROW_KEY = "RowKey"
STATE_ROW_KEY = "StateRK"
LOCK_INDEX_KEY = "LockIndexKey"
RETAIN_INDEX_KEY = "RetainIndexKey"
RECORDED_STATUS = "RecordedStatus"

# attribute -> (column, kind). Kinds: "str", "int" (Int32), "int64", "datetime", "status".
_COLUMNS: dict[str, tuple[str, str]] = {
    "partition_key": (PARTITION_KEY, "str"),
    "row_key": (ROW_KEY, "str"),
    "tenant_id": ("TenantId", "int"),
    "scope_id": ("ScopeId", "int"),
    "entity_id": ("EntityId", "int"),
    "item_entity_key": ("ItemEntityKey", "str"),
    "status": ("Status", "status"),
    "handler_key": ("HandlerKey", "str"),
    "retain_until": ("RetainUntil", "datetime"),
    "entity_execution_id": ("EntityExecutionId", "int"),
    "source_app_id": ("SourceAppId", "int"),
    "retention_seconds": ("RetentionSeconds", "int64"),
    "version": ("Version", "int"),
    "created_at": ("CreatedAt", "datetime"),
    "updated_at": ("UpdatedAt", "datetime"),
    "data_chunks": ("DataChunks", "int"),
    "lock_id": ("LockId", "str"),
    "locked_at": ("LockedAt", "datetime"),
    "locked_until": ("LockedUntil", "datetime"),
    "lock_index_key": (LOCK_INDEX_KEY, "str"),
    "retain_index_key": (RETAIN_INDEX_KEY, "str"),
    "lock_request_id": ("LockRequestId", "str"),
    "closed_lock_id": ("ClosedLockId", "str"),
    "closed_digest": ("ClosedDigest", "str"),
    "substatus": ("Substatus", "str"),
    "note": ("Note", "str"),
    "error": ("Error", "str"),
    # History rows only: the status the version was written with, and when and by which version it was
    # superseded (its ``Status`` is Superseded).
    "recorded_status": (RECORDED_STATUS, "status"),
    "superseded_at": ("SupersededAt", "datetime"),
    "superseded_by_version": ("SupersededByVersion", "int"),
}
_ATTRIBUTE_OF = {column: attribute for attribute, (column, _) in _COLUMNS.items()}


def column(attribute: str) -> str:
    """The table column that holds a row's ``attribute``."""
    return _COLUMNS[attribute][0]


def _read(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "status":
        return Status(int(value))
    if kind == "int64":
        return plain_int(value)
    if kind == "int":
        return int(value)
    if kind == "datetime":
        return value if isinstance(value, datetime) else None
    return str(value)


def _write(kind: str, value: Any) -> Any:
    if kind == "status":
        return int(value)
    if kind == "int64":
        return int64(value)
    return value


@dataclass(frozen=True, kw_only=True)
class StateRow:
    """One version of a record: its head (``recorded_status`` None) or a history row. ``data`` holds the
    envelope's ``Data0`` .. chunks as stored; ``other`` any column this module does not name."""

    partition_key: str
    row_key: str
    tenant_id: int | None = None
    scope_id: int | None = None
    entity_id: int | None = None
    item_entity_key: str | None = None
    status: Status | None = None
    handler_key: str | None = None
    retain_until: datetime | None = None
    entity_execution_id: int | None = None
    source_app_id: int | None = None
    retention_seconds: int | None = None
    version: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    data_chunks: int | None = None
    lock_id: str | None = None
    locked_at: datetime | None = None
    locked_until: datetime | None = None
    lock_index_key: str | None = None
    retain_index_key: str | None = None
    lock_request_id: str | None = None
    closed_lock_id: str | None = None
    closed_digest: str | None = None
    substatus: str | None = None
    note: str | None = None
    error: str | None = None
    recorded_status: Status | None = None
    superseded_at: datetime | None = None
    superseded_by_version: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    other: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_history(self) -> bool:
        return self.recorded_status is not None

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> StateRow:
        """The row a Table entity holds (as read, or as the code builds it to write)."""
        known: dict[str, Any] = {}
        data: dict[str, Any] = {}
        other: dict[str, Any] = {}
        for name, value in entity.items():
            attribute = _ATTRIBUTE_OF.get(name)
            if attribute is not None:
                known[attribute] = _read(_COLUMNS[attribute][1], value)
            elif name.startswith(DATA_PREFIX) and name[len(DATA_PREFIX) :].isdigit():
                data[name] = value
            else:
                other[name] = value
        return cls(**known, data=data, other=other)

    def with_data(self, properties: Mapping[str, Any]) -> StateRow:
        """This row holding the data properties ``state/envelope.py`` built (``Data0`` .. and their count)."""
        return StateRow.from_entity({**self.to_entity(), **properties})

    def to_entity(self) -> dict[str, Any]:
        """The Table entity of this row: each column that has a value, typed as the table holds it."""
        entity: dict[str, Any] = {}
        for item in fields(self):
            kind = _COLUMNS.get(item.name)
            if kind is None:
                continue
            value = getattr(self, item.name)
            if value is not None:
                entity[kind[0]] = _write(kind[1], value)
        entity.update(self.data)
        entity.update(self.other)
        return entity


@dataclass(frozen=True)
class IndexRow:
    """An expiry-index row of a record's partition: ``row_key`` is the head's ``LockIndexKey`` or
    ``RetainIndexKey`` (``state/keys.py`` ``index_row_key``); ``state_row_key`` is the head's RowKey.
    ``etag`` is the ETag it was read with (catch-up deletes a stale one ``If-Match`` it); never written."""

    partition_key: str
    row_key: str
    state_row_key: str
    etag: str | None = None

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> IndexRow:
        return cls(
            str(entity[PARTITION_KEY]), str(entity[ROW_KEY]), str(entity[STATE_ROW_KEY]), _etag_of(entity)
        )

    def to_entity(self) -> dict[str, Any]:
        return {PARTITION_KEY: self.partition_key, ROW_KEY: self.row_key, STATE_ROW_KEY: self.state_row_key}


def _etag_of(entity: Mapping[str, Any]) -> str | None:
    """The ETag of an entity as read from the table (its metadata); None for one the code built."""
    metadata = getattr(entity, "metadata", None)
    return str(metadata["etag"]) if metadata and metadata.get("etag") is not None else None


# -- the expiry index beyond the index rows (state/expiry.py, ADR-0011) -----------------------------------

LEASED_BY = "LeasedBy"
LEASED_UNTIL = "LeasedUntil"


# A lock entry's column in its minute's marker: ``L{lockId}`` (ADR-0021).
ENTRY_PREFIX = "L"


@dataclass(frozen=True)
class LockEntry:
    """A lock as its minute's marker names it (ADR-0021): column ``L{lock_id}`` holding
    ``{expiry ms}|{head RowKey}``. Catch-up reads the head and concludes it only while it is still
    Processing under ``lock_id`` and expired; anything else (finished, locked again, extended to a later
    minute) is skipped."""

    lock_id: str
    expiry_ms: int
    head_row_key: str

    @property
    def column(self) -> str:
        return f"{ENTRY_PREFIX}{self.lock_id}"

    @property
    def value(self) -> str:
        return f"{self.expiry_ms}|{self.head_row_key}"

    @classmethod
    def parse(cls, column: str, value: str) -> LockEntry:
        ms, head = value.split("|", 1)
        return cls(column[len(ENTRY_PREFIX) :], int(ms), head)


@dataclass(frozen=True)
class MarkerRow:
    """A minute's marker in a record's partition (``~{kind}|{minute}|{n or m}{nonce}``, ``state/keys.py``
    ``marker_row_key``). A transaction adding an index row or a lock of that minute merges it
    (``If-Match: *``), so it fails once catch-up deleted the marker to close the minute. A lock's merge adds
    its :class:`LockEntry` (ADR-0021): the marker is the minute's lock index. ``etag``: as read (catch-up
    deletes it ``If-Match`` the read in which it saw the entries); never written."""

    partition_key: str
    row_key: str
    entries: tuple[LockEntry, ...] = ()
    etag: str | None = None

    @classmethod
    def of(
        cls, partition: str, kind: str, bucket: int, nonce: str, entries: tuple[LockEntry, ...] = ()
    ) -> MarkerRow:
        return cls(partition, marker_row_key(kind, bucket, nonce), entries)

    def minute(self) -> tuple[str, int, str]:
        """(kind, minute, nonce) of this marker."""
        return parse_marker_row_key(self.row_key)

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> MarkerRow:
        entries = tuple(
            LockEntry.parse(name, str(value))
            for name, value in entity.items()
            if name.startswith(ENTRY_PREFIX) and isinstance(value, str)
        )
        return cls(str(entity[PARTITION_KEY]), str(entity[ROW_KEY]), entries, _etag_of(entity))

    def to_entity(self) -> dict[str, Any]:
        entity: dict[str, Any] = {PARTITION_KEY: self.partition_key, ROW_KEY: self.row_key}
        entity.update({entry.column: entry.value for entry in self.entries})
        return entity


def index_entry(entity: Mapping[str, Any]) -> IndexRow | MarkerRow:
    """A row of a minute's range of the index in a record's partition: a marker or an index row."""
    row_key = str(entity[ROW_KEY])
    return MarkerRow.from_entity(entity) if is_marker(row_key) else IndexRow.from_entity(entity)


@dataclass(frozen=True)
class Level1Row:
    """A level-1 row of the expiry index (table ``statelocks``): state partition ``row_key`` holds index rows
    of the kind and minute named by ``partition_key`` (``state/keys.py`` ``level1_partition``). A catch-up
    run leases it (``leased_by`` until ``leased_until``) to divide the work; preparing a marker writes only
    its keys (an Insert Or Merge that keeps a lease)."""

    partition_key: str
    row_key: str
    leased_by: str | None = None
    leased_until: datetime | None = None

    @classmethod
    def of(
        cls, kind: str, bucket: int, partition: str, *, by: str | None = None, until: datetime | None = None
    ) -> Level1Row:
        return cls(level1_partition(kind, bucket), partition, by, until)

    def minute(self) -> tuple[str, int]:
        """(kind, minute) of this row."""
        return parse_level1_partition(self.partition_key)

    @classmethod
    def from_entity(cls, entity: Mapping[str, Any]) -> Level1Row:
        by, until = entity.get(LEASED_BY), entity.get(LEASED_UNTIL)
        return cls(
            str(entity[PARTITION_KEY]),
            str(entity[ROW_KEY]),
            None if by is None else str(by),
            until if isinstance(until, datetime) else None,
        )

    def to_entity(self) -> dict[str, Any]:
        """Its keys, and the lease when it has one."""
        entity: dict[str, Any] = {PARTITION_KEY: self.partition_key, ROW_KEY: self.row_key}
        if self.leased_by is not None:
            entity[LEASED_BY] = self.leased_by
        if self.leased_until is not None:
            entity[LEASED_UNTIL] = self.leased_until
        return entity
