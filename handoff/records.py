"""The rows of the hand-off tables as typed records, and their Table entity form.

Column names are NimBus's (PascalCase, ``UnresolvedEvent`` / ``MessageEntity`` / ``MessageAuditEntity``),
enums are stored by name. ``MessageContent`` may exceed a property's 64 KiB limit, so long strings are
split across ``MessageContent``, ``MessageContent_1``, ... and joined on read; the entity as a whole is
kept under Azure's 1 MiB.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_pascal

from handoff.contract import HANDOFF_SUB_STATUS, MessageType, PoisonMessage, ResolutionStatus

# 15,000 characters is at most 60 KB as UTF-16 even if every character is a surrogate pair.
_CHUNK_CHARS = 15_000
# Azure: 1 MiB per entity; leave room for the other columns.
MAX_CONTENT_BYTES = 900_000
_CHUNKED = ("MessageContent",)


class TableRecord(BaseModel):
    """Base: PascalCase columns, ETag kept aside (it is not a column)."""

    model_config = ConfigDict(alias_generator=to_pascal, populate_by_name=True, defer_build=True)

    etag: str | None = Field(default=None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _enums_by_name(cls, data: Any) -> Any:
        """Enums are stored by name (as NimBus does), so read them back by name."""
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                kind = info.annotation
                key = info.alias or name
                value = data.get(key)
                is_enum = isinstance(kind, type) and issubclass(kind, Enum)
                if is_enum and isinstance(value, str) and value in kind.__members__:  # type: ignore[union-attr]
                    data[key] = kind[value]  # type: ignore[index]
        return data

    def to_entity(self, partition_key: str, row_key: str) -> dict[str, Any]:
        entity: dict[str, Any] = {"PartitionKey": partition_key, "RowKey": row_key}
        for name, value in self.model_dump(by_alias=True, exclude_none=True).items():
            if isinstance(value, Enum):
                value = value.name
            if name in _CHUNKED and isinstance(value, str):
                entity.update(_split(name, value))
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                value = int64(value)  # durations in ms outgrow 32 bits after ~25 days
            entity[name] = value
        return entity

    @classmethod
    def from_entity(cls, entity: Any) -> Any:
        data: dict[str, Any] = {}
        for name, value in dict(entity).items():
            if name in ("PartitionKey", "RowKey", "Timestamp") or (
                "_" in name and name.split("_")[0] in _CHUNKED
            ):
                continue
            # Int64 columns come back wrapped (``EntityProperty``).
            data[name] = getattr(value, "value", value) if type(value).__name__ == "EntityProperty" else value
        for name in _CHUNKED:
            if name in data:
                data[name] = _join(name, entity)
        record = cls.model_validate(data)
        record.etag = entity.metadata.get("etag") if hasattr(entity, "metadata") else None
        return record


def int64(value: int) -> Any:
    """An Int64 column value (the SDK sends a plain int as Int32 and refuses larger ones)."""
    from azure.data.tables import EdmType, EntityProperty

    return EntityProperty(value, EdmType.INT64)


def _split(name: str, text: str) -> dict[str, str]:
    if len(text.encode("utf-16-le")) > MAX_CONTENT_BYTES:
        raise PoisonMessage(f"{name} is too large for a Table Storage row ({MAX_CONTENT_BYTES} bytes).")
    parts = [text[i : i + _CHUNK_CHARS] for i in range(0, len(text), _CHUNK_CHARS)] or [""]
    return {name if i == 0 else f"{name}_{i}": part for i, part in enumerate(parts)}


def _join(name: str, entity: Any) -> str:
    parts = [str(entity[name])]
    i = 1
    while f"{name}_{i}" in entity:
        parts.append(str(entity[f"{name}_{i}"]))
        i += 1
    return "".join(parts)


class EventRow(TableRecord):
    """NimBus ``UnresolvedEvent`` plus the keys of this row's index rows (kept in the same partition)."""

    updated_at: datetime
    enqueued_time_utc: datetime
    event_id: str
    session_id: str | None = None
    correlation_id: str | None = None
    resolution_status: ResolutionStatus
    endpoint_role: str = "Subscriber"
    endpoint_id: str
    retry_count: int | None = None
    retry_limit: int | None = None
    message_type: MessageType
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    last_message_id: str | None = None
    originating_message_id: str | None = None
    parent_message_id: str | None = None
    reason: str | None = None
    originating_from: str | None = None
    event_type_id: str | None = None
    to: str | None = None
    from_: str | None = Field(default=None, alias="From")
    message_content: str | None = None
    queue_time_ms: int | None = None
    processing_time_ms: int | None = None
    pending_sub_status: str | None = None
    handoff_reason: str | None = None
    external_job_id: str | None = None
    expected_by: datetime | None = None
    # Bookkeeping, so a projection needs no history read: when the (first) EventRequest was enqueued and
    # whether a PendingHandoffResponse was ever seen (the processing-time override), and the index keys.
    request_enqueued_at: datetime | None = None
    handoff_seen: bool = False
    history_count: int = 0
    queue_key: str | None = None
    job_key: str | None = None
    expiry_key: str | None = None

    @property
    def is_pending_handoff(self) -> bool:
        return (
            self.resolution_status is ResolutionStatus.Pending
            and self.pending_sub_status == HANDOFF_SUB_STATUS
        )


class HistoryRow(TableRecord):
    """NimBus ``MessageEntity``: one projected message, as received (raw hop timings kept)."""

    event_id: str
    message_id: str
    message_type: MessageType
    endpoint_id: str
    endpoint_role: str = "Subscriber"
    event_type_id: str | None = None
    originating_message_id: str | None = None
    parent_message_id: str | None = None
    from_: str | None = Field(default=None, alias="From")
    to: str | None = None
    originating_from: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    enqueued_time_utc: datetime
    message_content: str | None = None
    dead_letter_reason: str | None = None
    dead_letter_error_description: str | None = None
    queue_time_ms: int | None = None
    processing_time_ms: int | None = None
    pending_sub_status: str | None = None
    handoff_reason: str | None = None
    external_job_id: str | None = None
    expected_by: datetime | None = None
    delivery_count: int | None = None
    throttle_retry_count: int | None = None
    recorded_at: datetime | None = None
    # 1, 2, 3, ... per event: the order the resolver projected them in (enqueue times come from different
    # topics, and clocks can step back, so neither orders the history reliably).
    sequence: int | None = None


class AuditRow(TableRecord):
    """NimBus ``MessageAuditEntity``."""

    auditor_name: str
    audit_timestamp: datetime
    audit_type: str
    comment: str | None = None
    data: str | None = None
    event_id: str
    endpoint_id: str
    event_type_id: str | None = None


class ClaimRow(TableRecord):
    """A settlement in flight for one parked message (insert-only; taken over only after it expires)."""

    event_id: str
    parked_message_id: str
    claimed_at: datetime
    expires_at: datetime
    control_message_id: str
    message_type: MessageType
    settled_by: str
    audit_key: str


class QueueRow(TableRecord):
    """Index: a parked event, oldest first; ``ClaimedUntil`` lets ``next`` skip settlements in flight."""

    event_id: str
    event_type_id: str | None = None
    parked_message_id: str
    # ISO text compared server-side; "0" (sorts before every time) when unclaimed, so the column always
    # exists (a filter on a missing property never matches).
    claimed_until: str = "0"


class JobRow(TableRecord):
    """Index: a parked event by its external job id."""

    event_id: str
    external_job_id: str


class ExpiryRow(TableRecord):
    """Index: a parked event by its ExpectedBy (timeout sweeper)."""

    event_id: str
    expected_by: datetime


class EndpointRow(TableRecord):
    """An endpoint that has parked at least once (the sweeper walks these partitions)."""

    endpoint_id: str


class PoisonRow(TableRecord):
    """A resolver input that can never be projected, with the reason, for operators."""

    reason: str
    message_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    enqueued_time_utc: datetime
    recorded_at: datetime
    application_properties: str
    message_content: str | None = None
