"""State handlers: what a ``handler.key`` selects (seed 000/001).

``built-in`` keeps records in Table Storage (:class:`~state.store.StateStore`); ``null`` is the seeds'
NullDataStateMachine: exists is false, lock always succeeds, nothing is written or read.
Both answer with the same response models, so the HTTP layer does not know which one it called.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from datetime import datetime
from typing import Any, Protocol

from common.clock import utcnow
from common.errors import InvalidInput, NotFound
from state import envelope
from state.keys import escape, item_entity_range, parse_row_key, partition_key, tenant_prefix
from state.model import EXISTS_STATUSES, SETTABLE_STATUSES, Scope, Status
from state.schemas import (
    DEFAULT_LOCK_SECONDS,
    ExistsResponse,
    ExtendRequest,
    ExtendResponse,
    HistoryRequest,
    KeyRequest,
    LockRequest,
    LockResponse,
    QueryRequest,
    Record,
    RecordPage,
    ReleaseRequest,
    SetRequest,
    UpsertRequest,
)
from state.store import Head, StateStore, WriteContext, effective_status


class StateHandler(Protocol):
    def exists(self, req: KeyRequest) -> ExistsResponse: ...
    def lock(self, req: LockRequest) -> LockResponse: ...
    def extend(self, req: ExtendRequest) -> ExtendResponse: ...
    def set(self, req: SetRequest) -> Record | None: ...
    def upsert(self, req: UpsertRequest) -> Record | None: ...
    def release(self, req: ReleaseRequest) -> Record | None: ...
    def get(self, req: KeyRequest) -> Record: ...
    def history(self, req: HistoryRequest) -> RecordPage: ...
    def query(self, req: QueryRequest) -> RecordPage: ...


def settable_status(value: str | int) -> Status:
    """The status ``set`` may record, or a 400 naming ``status``."""
    try:
        status = Status.parse(value)
    except ValueError as exc:
        raise InvalidInput(
            f"Unknown status {value!r}: set records Processed, Skipped or Failed.", field="status"
        ) from exc
    if status not in SETTABLE_STATUSES:
        raise InvalidInput(
            f"set cannot record {status.label}: use Processed, Skipped or Failed "
            "(Processing comes from lock; Superseded and Expired are Settle's own).",
            field="status",
        )
    return status


def request_digest(req: SetRequest | UpsertRequest | ReleaseRequest, status: Status) -> str:
    """What a fenced write asked for, so its retry can be recognised (the token is not part of it)."""
    asked = req.model_dump(mode="json", exclude={"lock_token", "handler"})
    raw = json.dumps([int(status), asked], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def lock_seconds(req: LockRequest | ExtendRequest) -> int:
    return req.lock_seconds or req.handler.options.lock_seconds or DEFAULT_LOCK_SECONDS


def encode_continuation(token: dict[str, str] | None) -> str | None:
    if not token:
        return None
    return base64.urlsafe_b64encode(json.dumps(token, separators=(",", ":")).encode()).decode()


def decode_continuation(text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("continuationToken is not one Settle issued.", field="continuationToken") from exc
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInput("continuationToken is not one Settle issued.", field="continuationToken")
    return value


def _dt(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


def to_record(entity: dict[str, Any], now: datetime) -> Record:
    scope = Scope(int(entity["ScopeId"]))
    fields = parse_row_key(str(entity["RowKey"]), scope)
    stored = Status(int(entity["Status"]))
    status = effective_status(entity, now) if stored is not Status.SUPERSEDED else stored
    recorded = entity.get("RecordedStatus")
    execution = entity.get("EntityExecutionId")
    return Record(
        tenant_id=int(entity["TenantId"]),
        scope_id=int(scope),
        scope=scope.code,
        entity_id=int(entity["EntityId"]),
        entity_execution_id=int(execution) if execution is not None else None,
        source_app_id=int(entity["SourceAppId"]) if entity.get("SourceAppId") is not None else None,
        item_key=str(fields["item_key"]),
        item_entity_key=str(fields["item_entity_key"]),
        sub_item_key=str(fields["sub_item_key"]),
        sub_item_entity_key=str(fields["sub_item_entity_key"]),
        status=status.label,
        status_code=int(status),
        original_status=Status(int(recorded)).label if recorded is not None else None,
        substatus=entity.get("Substatus"),
        error=entity.get("Error"),
        note=entity.get("Note"),
        data=envelope.decode(entity),
        version=int(entity["Version"]),
        handler_key=entity.get("HandlerKey"),
        locked_at=_dt(entity.get("LockedAt")),
        locked_until=_dt(entity.get("LockedUntil")),
        created_at=_dt(entity.get("CreatedAt")),
        updated_at=_dt(entity.get("UpdatedAt")),
        superseded_at=_dt(entity.get("SupersededAt")),
    )


def _page(entities: list[dict[str, Any]], token: dict[str, str] | None) -> RecordPage:
    now = utcnow()
    return RecordPage(
        items=[to_record(e, now) for e in entities], continuation_token=encode_continuation(token)
    )


def _context(req: KeyRequest) -> WriteContext:
    return WriteContext(
        handler_key=req.handler.key,
        source_app_id=req.key.source_app_id,
        entity_execution_id=req.key.entity_execution_id,
        retention_seconds=req.handler.options.retention,
    )


class BuiltInHandler:
    """Records in Table Storage."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def exists(self, req: KeyRequest) -> ExistsResponse:
        head = self._store.read_head(req.key.record_key())
        if head is None:
            return ExistsResponse(exists=False, status=Status.NONE.label)
        status = effective_status(head.entity, utcnow())
        return ExistsResponse(exists=status in EXISTS_STATUSES, status=status.label)

    def lock(self, req: LockRequest) -> LockResponse:
        outcome = self._store.lock(
            req.key.record_key(), _context(req), lock_seconds(req), request_id=req.request_id
        )
        return LockResponse(
            acquired=outcome.acquired,
            lock_token=outcome.token,
            locked_until=outcome.locked_until,
            reason=outcome.reason,
            status=outcome.status.label,
            takeover=outcome.takeover,
        )

    def extend(self, req: ExtendRequest) -> ExtendResponse:
        outcome = self._store.extend(req.key.record_key(), _context(req), req.lock_token, lock_seconds(req))
        assert outcome.token is not None and outcome.locked_until is not None
        return ExtendResponse(lock_token=outcome.token, locked_until=outcome.locked_until)

    def _outcome(
        self,
        req: SetRequest | UpsertRequest | ReleaseRequest,
        status: Status,
        *,
        error: str | None,
        require_processing: bool = False,
    ) -> Record:
        key = req.key.record_key()
        props = None
        if not isinstance(req, ReleaseRequest):
            metadata = req.metadata.model_dump(by_alias=True, exclude_none=True) if req.metadata else None
            env = envelope.build_envelope(
                key=key, status=status, data=req.data, metadata=metadata, handler_key=req.handler.key
            )
            props = envelope.encode(env)
        head = self._store.record(
            key,
            _context(req),
            status=status,
            envelope_props=props,
            substatus=None if isinstance(req, ReleaseRequest) else req.substatus,
            error=error,
            token_text=req.lock_token,
            require_processing=require_processing,
            digest=request_digest(req, status),
        )
        return to_record(head.entity, utcnow())

    def set(self, req: SetRequest) -> Record:
        status = settable_status(req.status)
        return self._outcome(req, status, error=req.error)

    def upsert(self, req: UpsertRequest) -> Record:
        return self._outcome(req, Status.PROCESSED, error=None)

    def release(self, req: ReleaseRequest) -> Record:
        return self._outcome(req, Status.FAILED, error=req.error, require_processing=True)

    def get(self, req: KeyRequest) -> Record:
        head: Head | None = self._store.read_head(req.key.record_key())
        if head is None:
            raise NotFound("No record for this key.", field="key")
        return to_record(head.entity, utcnow())

    def history(self, req: HistoryRequest) -> RecordPage:
        entities, token = self._store.history_page(
            req.key.record_key(),
            page_size=req.page_size,
            continuation=decode_continuation(req.continuation_token),
        )
        now = utcnow()
        return RecordPage(
            items=[to_record(e, now) for e in entities], continuation_token=encode_continuation(token)
        )

    def query(self, req: QueryRequest) -> RecordPage:
        filters = ["Status ne 5", "TenantId eq @tenant"]
        params: dict[str, Any] = {"tenant": req.tenant_id}
        if req.scope_id is not None and req.entity_id is not None:
            filters.insert(0, "PartitionKey eq @pk")
            params["pk"] = partition_key(req.tenant_id, req.scope_id, req.entity_id)
        else:
            prefix = tenant_prefix(req.tenant_id, req.scope_id)
            filters.insert(0, "PartitionKey ge @low and PartitionKey lt @high")
            params.update(low=prefix, high=prefix[:-1] + chr(ord(prefix[-1]) + 1))
            if req.entity_id is not None:
                filters.append("EntityId eq @entity")
                params["entity"] = req.entity_id
        if req.entity_execution_id is not None:
            filters.append("EntityExecutionId eq @execution")
            params["execution"] = req.entity_execution_id
        if req.item_entity_key is not None:
            if req.scope_id is not None and not Scope(req.scope_id).is_execution:
                low, high = item_entity_range(req.item_entity_key)
                filters.append("RowKey ge @rklow and RowKey lt @rkhigh")
                params.update(rklow=low, rkhigh=high)
            filters.append("ItemEntityKey eq @iek")
            params["iek"] = escape(req.item_entity_key)
        if req.status is not None:
            try:
                status = Status.parse(req.status)
            except ValueError as exc:
                raise InvalidInput(f"Unknown status {req.status!r}.", field="status") from exc
            filters.append("Status eq @status")
            params["status"] = int(status)
        if req.updated_from is not None:
            filters.append("UpdatedAt ge @from")
            params["from"] = req.updated_from
        if req.updated_to is not None:
            filters.append("UpdatedAt lt @to")
            params["to"] = req.updated_to
        entities, token = self._store.query_page(
            " and ".join(filters),
            params,
            page_size=req.page_size,
            continuation=decode_continuation(req.continuation_token),
        )
        now = utcnow()
        return RecordPage(
            items=[to_record(e, now) for e in entities], continuation_token=encode_continuation(token)
        )


class NullHandler:
    """The seeds' NullDataStateMachine: safe no-op answers, no storage touched."""

    def exists(self, req: KeyRequest) -> ExistsResponse:
        return ExistsResponse(exists=False, status=Status.NONE.label)

    def lock(self, req: LockRequest) -> LockResponse:
        return LockResponse(acquired=True, status=Status.NONE.label)

    def extend(self, req: ExtendRequest) -> ExtendResponse:
        raise InvalidInput("The null handler holds no locks to extend.", field="handler.key")

    def set(self, req: SetRequest) -> None:
        settable_status(req.status)  # bad input is still bad input

    def upsert(self, req: UpsertRequest) -> None:
        return None

    def release(self, req: ReleaseRequest) -> None:
        return None

    def get(self, req: KeyRequest) -> Record:
        raise NotFound("The null handler keeps no records.", field="key")

    def history(self, req: HistoryRequest) -> RecordPage:
        return RecordPage(items=[])

    def query(self, req: QueryRequest) -> RecordPage:
        return RecordPage(items=[])
