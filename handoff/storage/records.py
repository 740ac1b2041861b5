"""The rows of the hand-off tables as typed records, and their Table entity form.

Column names are NimBus's (PascalCase, ``UnresolvedEvent`` / ``MessageEntity`` / ``MessageAuditEntity``),
enums are stored by name. Long text (message bodies) may exceed a property's 64 KiB limit, so it is split
across ``MessageContent``, ``MessageContent_1``, ... and joined on read.

Table Storage limits (Azure's, enforced here because Azurite is looser): 64 KiB per property (UTF-16),
1 MiB per entity (Azurite: counted in the request's escaped JSON), 4 MiB per entity-group transaction
(the request body, JSON with non-ASCII escaped).
A body that cannot fit is *stored truncated* (``ContentTruncated`` = true), never refused: the row must
still be projected (a message refused for its size would be missing from the history). Each long text
column is kept within ``MAX_CONTENT_BYTES`` as UTF-16 and ``MAX_CONTENT_WIRE`` as escaped JSON, so the two
copies a projection writes (history row and event row) fit one transaction.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

# No ``from __future__ import annotations`` here: annotations evaluated as each class is made spare
# pydantic compiling them from strings (this module's import ~20 % shorter: it is on the cold start's path).

import base64
import binascii
import json
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_pascal

from common.models import from_fields
from handoff.messages.contract import HANDOFF_SUB_STATUS, MessageType, ResolutionStatus
from handoff.messages.outbound import OutboxMessage
from handoff.storage.claim_state import ClaimState

# 15,000 characters is at most 60 KB as UTF-16 even if every character is a surrogate pair.
_CHUNK_CHARS = 15_000
# Azure: 1 MiB per entity; leave room for the other columns.
MAX_CONTENT_BYTES = 900_000
# Azure: 4 MiB per transaction body; two long columns per transaction at most, plus the rest. Azurite
# counts an entity's 1 MiB in the request's bytes (JSON, non-ASCII escaped: ``é`` is 6 bytes there, 2 as
# UTF-16), so a long column is kept within both counts: a row fits whichever way storage measures it.
MAX_CONTENT_WIRE = 900_000
# Azure: 64 KiB per property; a plain (unsplit) text column longer than this is cut.
MAX_PROPERTY_BYTES = 64_000
_CHUNKED = (
    "MessageContent",
    "MessageContentBase64",
    "ControlBody",
    "ControlEnvelope",
    "ApplicationProperties",
)
TRUNCATED = "ContentTruncated"


def utf16_bytes(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass"))


def wire_bytes(text: str) -> int:
    """Size of ``text`` in a Table request body (the SDK's ``json.dumps`` escapes non-ASCII)."""
    return len(json.dumps(text))


def fit(
    text: str, *, max_bytes: int = MAX_CONTENT_BYTES, max_wire: int = MAX_CONTENT_WIRE
) -> tuple[str, bool]:
    """The longest prefix of ``text`` within both limits, and whether it had to be cut."""

    def fits(t: str) -> bool:
        return utf16_bytes(t) <= max_bytes and wire_bytes(t) <= max_wire

    if fits(text):
        return text, False
    low, high = 0, len(text)
    while low < high:  # largest n with fits(text[:n])
        mid = (low + high + 1) // 2
        if fits(text[:mid]):
            low = mid
        else:
            high = mid - 1
    return text[:low], True


class TableRecord(BaseModel):
    """Base: PascalCase columns, ETag kept aside (it is not a column)."""

    model_config = ConfigDict(alias_generator=to_pascal, populate_by_name=True, defer_build=True)

    etag: str | None = Field(default=None, exclude=True)
    # The RowKey the record was read from (not a column either).
    row_key: str | None = Field(default=None, exclude=True)
    # True when a text column had to be cut to fit Table Storage (stored only when true).
    content_truncated: bool = False

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
        truncated = self.content_truncated
        for name, value in self.model_dump(by_alias=True, exclude_none=True).items():
            if name == TRUNCATED:
                continue
            if isinstance(value, Enum):
                value = value.name
            if name in _CHUNKED and isinstance(value, str):
                value, cut = fit(value)
                truncated = truncated or cut
                entity.update(_split(name, value))
                continue
            if isinstance(value, str):
                value, cut = fit(value, max_bytes=MAX_PROPERTY_BYTES, max_wire=MAX_CONTENT_WIRE)
                truncated = truncated or cut
            if isinstance(value, int) and not isinstance(value, bool):
                value = int64(value)  # durations in ms outgrow 32 bits after ~25 days
            entity[name] = value
        if truncated:
            entity[TRUNCATED] = True
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
        record.row_key = str(entity["RowKey"]) if "RowKey" in entity else None
        return record


def columns_of[R: TableRecord](model: type[R], row: TableRecord, /, **overrides: Any) -> R:
    """An index row: ``model`` built from the same-named columns of ``row``, then ``overrides``. Only the
    columns are carried: ``row``'s ETag, RowKey and truncation mark are its own, not the new row's."""
    return from_fields(model, row, etag=None, row_key=None, content_truncated=False, **overrides)


def int64(value: int) -> Any:
    """An Int64 column value (the SDK sends a plain int as Int32 and refuses larger ones)."""
    from azure.data.tables import EdmType, EntityProperty

    return EntityProperty(value, EdmType.INT64)


def _split(name: str, text: str) -> dict[str, str]:
    parts = [text[i : i + _CHUNK_CHARS] for i in range(0, len(text), _CHUNK_CHARS)] or [""]
    return {name if i == 0 else f"{name}_{i}": part for i, part in enumerate(parts)}


def _join(name: str, entity: Any) -> str:
    parts = [str(entity[name])]
    i = 1
    while f"{name}_{i}" in entity:
        parts.append(str(entity[f"{name}_{i}"]))
        i += 1
    return "".join(parts)


class MessageColumns(TableRecord):
    """The columns an event row (``UnresolvedEvent``) and a history row (``MessageEntity``) both copy from
    a message: its headers, its body, and the NimBus hand-off marks."""

    event_id: str
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
    # What Settle changed to store this message's headers (ExpectedBy out of range, a job id too long for
    # the job index), one note a line; the park is kept either way.
    input_notes: str | None = None


class EventRow(MessageColumns):
    """NimBus ``UnresolvedEvent`` plus the keys of this row's index rows (kept in the same partition)."""

    updated_at: datetime
    resolution_status: ResolutionStatus
    retry_count: int | None = None
    retry_limit: int | None = None
    last_message_id: str | None = None
    reason: str | None = None
    # Bookkeeping, so a projection needs no history read: when the (first) EventRequest was enqueued and
    # whether a PendingHandoffResponse was ever seen (the processing-time override), and the index keys.
    request_enqueued_at: datetime | None = None
    handoff_seen: bool = False
    history_count: int = 0
    queue_key: str | None = None
    job_key: str | None = None
    expiry_key: str | None = None
    # Operator listings and counts (handoff/storage/counts.py): whether this row's buckets are in the counts,
    # the key of its listing row (``sd|``; before ADR-0022 also ``ad|`` and ``sd|PendingHandoff|``, newline-
    # joined, and an oldest-first row ``sa|``: deleted when the event next changes), and when it entered its
    # open group.
    counted: bool = False
    all_key: str | None = None
    bucket_keys: str | None = None
    since_key: str | None = None
    since_at: datetime | None = None

    @property
    def listing_keys(self) -> list[str]:
        keys = [self.all_key] if self.all_key else []
        return keys + [k for k in (self.bucket_keys or "").split("\n") if k]

    @property
    def is_pending_handoff(self) -> bool:
        return (
            self.resolution_status is ResolutionStatus.Pending
            and self.pending_sub_status == HANDOFF_SUB_STATUS
        )


class HistoryRow(MessageColumns):
    """NimBus ``MessageEntity``: one projected message, as received (raw hop timings kept)."""

    message_id: str
    delivery_count: int | None = None
    throttle_retry_count: int | None = None
    recorded_at: datetime | None = None
    # 1, 2, 3, ... per event: the order the resolver projected them in (enqueue times come from different
    # topics, and clocks can step back, so neither orders the history reliably).
    sequence: int | None = None


class Auditor(Protocol):
    """Who an audit row names: an operator (:class:`common.principal.Actor`), a claim's order, or Settle
    itself (:class:`System`)."""

    @property
    def by(self) -> str: ...
    @property
    def principal_name(self) -> str | None: ...
    @property
    def principal_id(self) -> str | None: ...


class System(BaseModel):
    """Settle itself (or NimBus's resolver and manager) as an auditor: a name and no principal."""

    model_config = ConfigDict(frozen=True)

    by: str
    principal_name: None = None
    principal_id: None = None


class AuditedEvent(Protocol):
    """The event an audit row is about: its row, or the message that carries it."""

    @property
    def event_id(self) -> str: ...
    @property
    def endpoint_id(self) -> str: ...
    @property
    def event_type_id(self) -> str | None: ...


class AuditRow(TableRecord):
    """NimBus ``MessageAuditEntity``, plus the principal App Service authenticated (when it did)."""

    auditor_name: str
    audit_timestamp: datetime
    audit_type: str
    comment: str | None = None
    data: str | None = None
    event_id: str
    endpoint_id: str
    event_type_id: str | None = None
    principal_name: str | None = None
    principal_id: str | None = None
    # NimBus ``MessageAuditEntity.AccessDenied``: the action was refused for lack of the operator role.
    access_denied: bool = False

    @classmethod
    def of(
        cls,
        event: AuditedEvent,
        at: datetime,
        auditor: Auditor,
        audit_type: str,
        *,
        comment: str | None = None,
        data: str | None = None,
        access_denied: bool = False,
    ) -> "AuditRow":
        """The audit row of what ``auditor`` did to ``event`` at ``at``."""
        return cls(
            auditor_name=auditor.by,
            audit_timestamp=at,
            audit_type=audit_type,
            comment=comment,
            data=data,
            event_id=event.event_id,
            endpoint_id=event.endpoint_id,
            event_type_id=event.event_type_id,
            principal_name=auditor.principal_name,
            principal_id=auditor.principal_id,
            access_denied=access_denied,
        )


class ClaimRow(TableRecord):
    """The settlement of one parked message: an outbox record holding the exact control message.

    Inserted before the send; never taken over; deleted only after a send that certainly reached nothing.
    See :mod:`handoff.storage.claim_state` for the states.

    It is also the audit of what it sends (ADR-0022 change 3): who (``SettledBy``, the principal), when
    (``ClaimedAt``), the audit's type, comment and ``Data`` and the event it is about are its columns, and
    every reader of an event's audits renders the entry from them (:meth:`audit`). A claim written before
    that has its own audit row instead, named by ``AuditKey`` (and no audit columns).
    """

    event_id: str
    parked_message_id: str
    state: ClaimState = ClaimState.sending
    claimed_at: datetime
    updated_at: datetime | None = None
    control_message_id: str
    message_type: MessageType
    request_digest: str = ""
    settled_by: str
    agent_id: str | None = None
    principal_name: str | None = None
    principal_id: str | None = None
    attempts: int = 0
    last_sent_at: datetime | None = None
    # A claim written before ADR-0022 change 3: the key of its audit row (written in its transaction);
    # empty (or missing) on a claim whose audit is rendered from it.
    audit_key: str | None = None
    reconcile_key: str | None = None
    unconfirmed_key: str | None = None
    control_envelope: str | None = None
    control_body: str | None = None
    # The audit rendered from the claim (None on a claim whose audit is its own row, ``audit_key``).
    audit_type: str | None = None
    audit_comment: str | None = None
    audit_data: str | None = None
    endpoint_id: str | None = None
    event_type_id: str | None = None

    def outbox_message(self) -> OutboxMessage:
        if self.control_envelope is None or self.control_body is None:
            raise ValueError(f"claim of {self.event_id} holds no message")
        return OutboxMessage.from_stored(self.control_envelope, self.control_body)

    def audit(self) -> AuditRow | None:
        """The audit entry of this claim, as the audit row it replaces said it: who settled, when it was
        claimed, the audit's type, comment and data. None for a claim written with its own audit row
        (``audit_key``): that row is the entry."""
        if self.audit_key or self.audit_type is None:
            return None
        return AuditRow(
            auditor_name=self.settled_by,
            audit_timestamp=self.claimed_at,
            audit_type=self.audit_type,
            comment=self.audit_comment,
            data=self.audit_data,
            event_id=self.event_id,
            endpoint_id=self.endpoint_id or "",
            event_type_id=self.event_type_id,
            principal_name=self.principal_name,
            principal_id=self.principal_id,
        )


class ReconcileRow(TableRecord):
    """Index: an open claim the reconciler must look at from ``DueAt`` on; or, with ``Task`` = ``ids``,
    lookup index rows (``Ids``, JSON) whose insert failed, for the reconciler to write."""

    event_id: str
    parked_message_id: str
    due_at: datetime
    task: str | None = None
    ids: str | None = None


class UnconfirmedRow(TableRecord):
    """Index: a claim that could neither be confirmed nor safely re-sent (operators look here)."""

    event_id: str
    parked_message_id: str
    control_message_id: str
    message_type: MessageType
    settled_by: str
    claimed_at: datetime
    since: datetime


class QueueRow(TableRecord):
    """Index: a parked event, oldest first; ``ClaimedUntil`` lets ``next`` skip settlements in flight;
    ``ExpectedBy`` (the park's, when it has one) lets the timeout sweeper and the overdue listing find the
    due parks with a filter on this range (ADR-0022 change 5; parks from before have it on their
    :class:`ExpiryRow` instead). Every later write of this row merges, so the column stays."""

    event_id: str
    event_type_id: str | None = None
    parked_message_id: str
    expected_by: datetime | None = None
    # ISO text compared server-side; "0" (sorts before every time) when unclaimed, so the column always
    # exists (a filter on a missing property never matches). A leased receive sets it to the lease's end.
    claimed_until: str = "0"
    # Leased receive: the current lease's token, holder and start (kept after it ends: a
    # settlement with that token is fenced by it until another agent leases the hand-off).
    lease_token: str | None = None
    leased_by: str | None = None
    leased_at: datetime | None = None
    # A settlement's claim marked this row (``ClaimedUntil`` = CLAIMED): when the reconciler first looks
    # at that claim (ADR-0022 change 9; the claim then has no ``rc|`` row). Moved to ``RECONCILED`` once
    # the reconciler has handled it.
    reconcile_at: datetime | None = None


class ListingRow(TableRecord):
    """Index: one event in its status's operator listing, newest change first (one row per event).

    It carries the summary the listing shows, so a page of one status is one range read; the open
    statuses' rows are also what their counts and the oldest ages are read from.
    """

    event_id: str
    event_type_id: str | None = None
    resolution_status: ResolutionStatus
    pending_sub_status: str | None = None
    message_type: MessageType
    last_message_id: str | None = None
    session_id: str | None = None
    updated_at: datetime
    enqueued_time_utc: datetime
    reason: str | None = None
    external_job_id: str | None = None
    # An open event's: when it entered its group (Pending, or Failed/DeadLettered): the overview's ages.
    since_at: datetime | None = None


class JobRow(TableRecord):
    """Index: a parked event by its external job id."""

    event_id: str
    external_job_id: str


class ExpiryRow(TableRecord):
    """Index: a parked event by its ExpectedBy, as written before ADR-0022 change 5 (deleted when its park
    ends, no longer written). Also how the overdue listing reads a due park's row of either kind: its
    ``EventId``, its ``ExpectedBy`` and its key."""

    event_id: str
    expected_by: datetime


class EndpointRow(TableRecord):
    """An endpoint that has parked at least once (the sweeper and reconciler walk these partitions).

    ``SweepCursor``: per shard, the last row of the ``ex|``…``hq}`` range (``keys.OVERDUE_RANGE``) the
    sweeper looked at when a run stopped at its bound, so the next run (on any instance) continues there.
    """

    endpoint_id: str
    sweep_cursor: str | None = None


class PoisonRow(TableRecord):
    """A resolver input that can never be projected, with the reason, kept whole for a replay.

    The body is ``MessageContent`` when it is UTF-8 text, else ``MessageContentBase64``; both are split
    across properties. A Standard-tier message (256 KB) always fits; only a larger (Premium) body can be
    cut, and ``ContentTruncated`` then says so.
    """

    reason: str
    message_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    delivery_count: int | None = None
    enqueued_time_utc: datetime
    recorded_at: datetime
    application_properties: str
    message_content: str | None = None
    message_content_base64: str | None = None
    # The endpoint the message names (To for a request, From for a response), when it names one.
    endpoint_id: str | None = None
    # Operator replays: when, by whom, what the resolver did, how often (merged If-Match the row's ETag).
    replayed_at: datetime | None = None
    replayed_by: str | None = None
    replay_outcome: str | None = None
    replay_detail: str | None = None
    replay_count: int = 0
    # Dismissed (archived) by an operator: no fix will ever project it (merged If-Match the row's ETag).
    dismissed_at: datetime | None = None
    dismissed_by: str | None = None
    dismiss_reason: str | None = None

    @classmethod
    def body_columns(cls, body: bytes) -> dict[str, str]:
        try:
            return {"message_content": body.decode("utf-8")} if body else {}
        except UnicodeDecodeError:
            return {"message_content_base64": base64.b64encode(body).decode("ascii")}

    def body_bytes(self) -> bytes:
        """The body as received (as far as it was stored)."""
        if self.message_content is not None:
            return self.message_content.encode("utf-8")
        if self.message_content_base64:
            text = self.message_content_base64
            try:
                return base64.b64decode(text[: len(text) - len(text) % 4])
            except binascii.Error:
                return b""
        return b""
