"""State handlers: what a ``handler.key`` selects (seed 000/001).

``built-in`` keeps records in Table Storage (:class:`~state.store.StateStore`); ``null`` is the seeds'
NullDataStateMachine: exists is false, lock always succeeds, nothing is written or read.
Both answer with the same response models, so the HTTP layer does not know which one it called.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Protocol

from common import telemetry
from common.errors import InvalidInput, NotFound
from common.signing import Signer
from state import envelope
from state.keys import (
    INDEX_END,
    INDEX_MARK,
    escape,
    item_entity_range,
    node_partition_range,
    parse_row_key,
    partition_key,
    tenant_prefix,
)
from state.lifecycle import FINISHED, Head, WriteContext, effective_status
from state.model import EXISTS_STATUSES, SETTABLE_STATUSES, Scope, Status
from state.rows import StateRow
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
    ScopeInfo,
    SetRequest,
    StateMeta,
    StatusInfo,
    UpsertRequest,
)
from state.store import StateStore
from state.token import key_digest

PAGE_PURPOSE = "page"
_PAGE_KEYS = frozenset({"PartitionKey", "RowKey", "Account"})  # Account: state over several accounts


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


def encode_continuation(signer: Signer, binding: str, token: dict[str, str] | None) -> str | None:
    """A signed continuation token, bound to the query (or record) it pages."""
    if not token:
        return None
    raw = json.dumps({"b": binding, "t": token}, separators=(",", ":"), ensure_ascii=True)
    return signer.sign(PAGE_PURPOSE, raw.encode("ascii"))


def decode_continuation(signer: Signer, binding: str, text: str | None) -> dict[str, str] | None:
    """The storage continuation of a token Settle issued for this very query, or a 400 naming it."""
    if text is None:
        return None
    payload = signer.open(PAGE_PURPOSE, text)
    if payload is None:
        raise InvalidInput(
            "continuationToken is not one Settle issued (or it was changed); start again without it.",
            field="continuationToken",
        )
    value = json.loads(payload)
    token = value.get("t") if isinstance(value, dict) else None
    if (
        not isinstance(token, dict)
        or not token
        or not set(token) <= _PAGE_KEYS
        or not all(v is None or isinstance(v, str) for v in token.values())  # a header may be absent
    ):
        raise InvalidInput("continuationToken is not one Settle issued.", field="continuationToken")
    if value.get("b") != binding:
        raise InvalidInput(
            "continuationToken belongs to another query or record: send it with the request it came from.",
            field="continuationToken",
        )
    return token


def query_binding(req: QueryRequest) -> str:
    """What a query's continuation token is bound to: every filter (the page size may change)."""
    asked = req.model_dump(mode="json", exclude={"page_size", "continuation_token", "handler"})
    raw = json.dumps(asked, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "q:" + hashlib.sha256(raw.encode()).hexdigest()[:32]


def status_filter(status: Status) -> str:
    """The OData filter selecting heads whose *effective* status is ``status`` at ``@now``.

    (Spaces around parentheses: the SDK substitutes ``@name`` only in space-separated words.)
    """
    if status is Status.PROCESSING:
        return "Status eq 2"
    if status is Status.EXPIRED:
        finished = " or ".join(f"Status eq {int(s)}" for s in sorted(FINISHED))
        return f"( Status eq 6 or ( ( {finished} ) and RetainUntil le @now ) )"
    return f"( Status eq {int(status)} and RetainUntil gt @now )"


def queryable_status(value: str | int) -> Status:
    """A status query can filter on (a record's effective status), or a 400 naming ``status``."""
    try:
        status = Status.parse(value)
    except ValueError as exc:
        raise InvalidInput(f"Unknown status {value!r}.", field="status") from exc
    if status in (Status.NONE, Status.SUPERSEDED):
        raise InvalidInput(
            f"query lists records by their current status; {status.label} is never one "
            "(superseded versions are in history).",
            field="status",
        )
    return status


def note_lock(acquired: bool, takeover: bool, replayed: bool, status: str, handler: str) -> None:
    """The lock's outcome on its span and in ``settle.state.locks``."""
    if replayed:
        outcome = "replayed"
    elif takeover:
        outcome = "takeover"
    else:
        outcome = "acquired" if acquired else "refused"
    telemetry.current().set_outcome(outcome)
    telemetry.annotate({"settle.status_after": status})
    telemetry.add("settle.state.locks", outcome=outcome, handler=handler)


def meta() -> StateMeta:
    """Codes and names of scopes and statuses, the handler names, and the statuses exists/set know."""
    return StateMeta(
        scopes=[ScopeInfo(id=int(s), name=s.code) for s in Scope],
        statuses=[StatusInfo(code=int(s), name=s.label) for s in Status],
        handlers=["built-in", "null"],
        exists_statuses=[s.label for s in EXISTS_STATUSES],
        settable_statuses=[s.label for s in SETTABLE_STATUSES],
    )


def to_record(row: StateRow, now: datetime) -> Record:
    """The API's record of a stored head or history row (a history row answers with its own status as
    ``originalStatus``; a finished head past its retention answers Expired)."""
    assert row.scope_id is not None and row.status is not None
    scope = Scope(row.scope_id)
    fields = parse_row_key(row.row_key, scope)
    status = effective_status(row, now) if row.status is not Status.SUPERSEDED else row.status
    assert row.tenant_id is not None and row.entity_id is not None and row.version is not None
    return Record(
        tenant_id=row.tenant_id,
        scope_id=int(scope),
        scope=scope.code,
        entity_id=row.entity_id,
        entity_execution_id=row.entity_execution_id,
        source_app_id=row.source_app_id,
        item_key=str(fields["item_key"]),
        item_entity_key=str(fields["item_entity_key"]),
        sub_item_key=str(fields["sub_item_key"]),
        sub_item_entity_key=str(fields["sub_item_entity_key"]),
        status=status.label,
        status_code=int(status),
        original_status=row.recorded_status.label if row.recorded_status is not None else None,
        substatus=row.substatus,
        error=row.error,
        note=row.note,
        data=envelope.decode(row.to_entity()),
        version=row.version,
        handler_key=row.handler_key,
        locked_at=row.locked_at,
        locked_until=row.locked_until,
        created_at=row.created_at,
        updated_at=row.updated_at,
        superseded_at=row.superseded_at,
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
            telemetry.annotate({"settle.status_before": Status.NONE.label})
            return ExistsResponse(exists=False, status=Status.NONE.label)
        status = effective_status(head.row, self._store.now())
        telemetry.annotate({"settle.status_before": status.label})
        return ExistsResponse(exists=status in EXISTS_STATUSES, status=status.label)

    def lock(self, req: LockRequest) -> LockResponse:
        outcome = self._store.lock(
            req.key.record_key(), _context(req), lock_seconds(req), request_id=req.request_id
        )
        note_lock(outcome.acquired, outcome.takeover, outcome.replayed, outcome.status.label, req.handler.key)
        return LockResponse(
            acquired=outcome.acquired,
            lock_token=outcome.token,
            locked_until=outcome.locked_until,
            reason=outcome.reason,
            status=outcome.status.label,
            takeover=outcome.takeover,
            replayed=outcome.replayed,
            previous_attempt=outcome.previous,
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
                key=key,
                status=status,
                data=req.data,
                metadata=metadata,
                handler_key=req.handler.key,
                execution_id=req.key.entity_execution_id,
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
        return to_record(head.row, self._store.now())

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
        record = to_record(head.row, self._store.now())
        telemetry.annotate({"settle.status_before": record.status})
        return record

    def history(self, req: HistoryRequest) -> RecordPage:
        key = req.key.record_key()
        binding = "h:" + key_digest(key)
        entities, token = self._store.history_page(
            key, page_size=req.page_size, continuation=self._continuation(binding, req.continuation_token)
        )
        return self._page(entities, binding, token, self._store.now())

    def query(self, req: QueryRequest) -> RecordPage:
        now = self._store.now()  # one instant for the filter and the labels, so they agree
        filters = ["Status ne 5", "TenantId eq @tenant", "( RowKey lt @index or RowKey ge @indexend )"]
        params: dict[str, Any] = {"tenant": req.tenant_id, "index": INDEX_MARK, "indexend": INDEX_END}

        def where(clause: str, name: str, value: object) -> None:
            """``clause`` (on the parameter ``@name``) when the request gives ``value``."""
            if value is not None:
                filters.append(clause)
                params[name] = value

        if req.scope_id is not None and req.entity_id is not None and self._store.layout.single:
            filters.insert(0, "PartitionKey eq @pk")
            params["pk"] = partition_key(req.tenant_id, req.scope_id, req.entity_id)
        elif req.scope_id is not None and req.entity_id is not None:
            # Sharded: one range read over the node's partitions (every layout), shard after shard.
            filters.insert(0, "PartitionKey ge @low and PartitionKey lt @high")
            low, high = node_partition_range(req.tenant_id, req.scope_id, req.entity_id)
            params.update(low=low, high=high)
        else:
            prefix = tenant_prefix(req.tenant_id, req.scope_id)
            filters.insert(0, "PartitionKey ge @low and PartitionKey lt @high")
            params.update(low=prefix, high=prefix[:-1] + chr(ord(prefix[-1]) + 1))
            where("EntityId eq @entity", "entity", req.entity_id)
        where("EntityExecutionId eq @execution", "execution", req.entity_execution_id)
        if req.item_entity_key is not None:
            if req.scope_id is not None and not Scope(req.scope_id).is_execution:
                low, high = item_entity_range(req.item_entity_key)
                filters.append("RowKey ge @rklow and RowKey lt @rkhigh")
                params.update(rklow=low, rkhigh=high)
            filters.append("ItemEntityKey eq @iek")
            params["iek"] = escape(req.item_entity_key)
        if req.status is not None:
            filters.append(status_filter(queryable_status(req.status)))
            params["now"] = now
        where("UpdatedAt ge @from", "from", req.updated_from)
        where("UpdatedAt lt @to", "to", req.updated_to)
        binding = query_binding(req)
        entities, token = self._store.query_page(
            " and ".join(filters),
            params,
            page_size=req.page_size,
            continuation=self._continuation(binding, req.continuation_token),
        )
        return self._page(entities, binding, token, now)

    def _continuation(self, binding: str, text: str | None) -> dict[str, str] | None:
        return None if text is None else decode_continuation(self._store.signer(), binding, text)

    def _page(
        self, entities: list[dict[str, Any]], binding: str, token: dict[str, str] | None, now: datetime
    ) -> RecordPage:
        signer = self._store.signer() if token else None
        telemetry.annotate({"settle.items": len(entities), "settle.more": token is not None})
        return RecordPage(
            items=[to_record(StateRow.from_entity(e), now) for e in entities],
            continuation_token=encode_continuation(signer, binding, token) if signer else None,
        )


class NullHandler:
    """The seeds' NullDataStateMachine: safe no-op answers, no storage touched."""

    def exists(self, req: KeyRequest) -> ExistsResponse:
        return ExistsResponse(exists=False, status=Status.NONE.label)

    def lock(self, req: LockRequest) -> LockResponse:
        note_lock(True, False, False, Status.NONE.label, req.handler.key)
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
