"""The HTTP contract of the state functions: request and response models (camelCase JSON)."""

# No ``from __future__ import annotations`` here: annotations evaluated as each class is made spare
# pydantic compiling them from strings (this module's import ~20 % shorter: a shorter cold start).

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, JsonValue, model_validator

from common.clock import storable_utc
from common.keys import MAX_KEY_BYTES, escape, key_bytes
from common.limits import INT32_MAX, MAX_TEXT_UNITS, utf16_units
from common.models import ApiModel, RequestModel
from state.model import MAX_RETENTION_DAYS, MAX_RETENTION_SECONDS, RecordKey, Scope

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
MAX_LOCK_SECONDS = 7 * 24 * 3600
DEFAULT_LOCK_SECONDS = 1800
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
MAX_TOKEN_CHARS = 4096
# Table Storage's DateTime starts at 1601-01-01 (UTC).
EARLIEST = datetime(1601, 1, 1, tzinfo=UTC)


def _fits_a_property(text: str) -> str:
    units = utf16_units(text)
    if units > MAX_TEXT_UNITS:
        raise ValueError(
            f"at most {MAX_TEXT_UNITS} UTF-16 code units (one Table Storage property; a character outside "
            f"the Basic Multilingual Plane counts two), got {units}"
        )
    return text


def _storable_instant(value: datetime) -> datetime:
    # Times are UTC (SPEC §4); past the last instant (9999-12-31 with a negative offset) is the last instant.
    utc = storable_utc(value)
    if utc is None:
        raise ValueError("must be 1601-01-01T00:00:00Z or later (the earliest instant Table Storage holds)")
    return utc


def _matchable_item_entity_key(text: str) -> str:
    """A query's itemEntityKey no stored key can hold (its escaped form alone is over a key's 1 KiB, UTF-16)
    matches nothing, and as a filter in the request URL it can exceed what storage reads (431)."""
    size = key_bytes(escape(text))
    if size > MAX_KEY_BYTES:
        raise ValueError(
            f"longer than any record's key can hold: {size} bytes as stored (UTF-16, escaped) against "
            f"Table Storage's {MAX_KEY_BYTES}-byte key"
        )
    return text


Text = Annotated[
    str,
    Field(max_length=MAX_TEXT_UNITS, description=f"At most {MAX_TEXT_UNITS} UTF-16 code units."),
    AfterValidator(_fits_a_property),
]
Instant = Annotated[datetime, AfterValidator(_storable_instant)]
Token = Annotated[str, Field(min_length=1, max_length=MAX_TOKEN_CHARS)]


class KeyIn(RequestModel):
    """A record's key and the context the seeds' StateHandlerContext carries."""

    tenant_id: Int32
    scope_id: Annotated[int, Field(ge=1, le=7)] | None = None
    scope: str | None = Field(default=None, description="Scope by name (App ... ElementExecution).")
    entity_id: Int32
    entity_execution_id: Int32 | None = Field(
        default=None, description="Required for scopes 5-7 (part of the key); recorded otherwise."
    )
    source_app_id: Int32 | None = None
    item_key: Annotated[str, Field(min_length=1)]
    item_entity_key: Annotated[str, Field(min_length=1)]
    sub_item_key: str = ""
    sub_item_entity_key: str = ""

    @model_validator(mode="after")
    def _scope_and_execution(self) -> Self:
        if self.scope is not None:
            try:
                named = Scope.from_code(self.scope)
            except ValueError as exc:
                raise ValueError(str(exc)) from exc
            if self.scope_id is not None and self.scope_id != int(named):
                raise ValueError(f"scopeId {self.scope_id} and scope {self.scope!r} disagree")
            self.scope_id = int(named)
        if self.scope_id is None:
            raise ValueError("scopeId (1-7) or scope (its name) is required")
        if Scope(self.scope_id).is_execution and self.entity_execution_id is None:
            raise ValueError("entityExecutionId is required for execution scopes (5-7)")
        return self

    def record_key(self) -> RecordKey:
        assert self.scope_id is not None
        scope = Scope(self.scope_id)
        return RecordKey(
            tenant_id=self.tenant_id,
            scope=scope,
            entity_id=self.entity_id,
            item_entity_key=self.item_entity_key,
            item_key=self.item_key,
            sub_item_entity_key=self.sub_item_entity_key,
            sub_item_key=self.sub_item_key,
            entity_execution_id=self.entity_execution_id if scope.is_execution else None,
        )


class HandlerOptions(RequestModel):
    lock_seconds: Annotated[int, Field(ge=1, le=MAX_LOCK_SECONDS)] | None = Field(
        default=None, description=f"Default lock length for this handler (default {DEFAULT_LOCK_SECONDS})."
    )
    retention_seconds: Annotated[int, Field(ge=1, le=MAX_RETENTION_SECONDS)] | None = Field(
        default=None,
        description="Opt-in: finished records older than this become Expired "
        f"(at most {MAX_RETENTION_SECONDS}, i.e. {MAX_RETENTION_DAYS} days).",
    )
    retention_days: Annotated[int, Field(ge=1, le=MAX_RETENTION_DAYS)] | None = None

    @property
    def retention(self) -> int | None:
        if self.retention_seconds is not None:
            return self.retention_seconds
        return self.retention_days * 86400 if self.retention_days is not None else None


class HandlerIn(RequestModel):
    """Which handler serves the call: ``built-in`` (Table Storage, the default) or ``null`` (no-op)."""

    key: Literal["built-in", "null"] = "built-in"
    options: HandlerOptions = Field(default_factory=HandlerOptions)


class KeyRequest(RequestModel):
    key: KeyIn
    handler: HandlerIn = Field(default_factory=HandlerIn)


class LockRequest(KeyRequest):
    lock_seconds: Annotated[int, Field(ge=1, le=MAX_LOCK_SECONDS)] | None = None
    request_id: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        default=None,
        description=(
            "Optional id of this lock attempt. A call with the same requestId while that lock holds gets "
            "it back (a new token, replayed: true) instead of a refusal: use a fresh id per attempt and "
            "reuse it only to retry that attempt's call, never one that a duplicate of your input shares."
        ),
    )


class ExtendRequest(KeyRequest):
    lock_token: Token
    lock_seconds: Annotated[int, Field(ge=1, le=MAX_LOCK_SECONDS)] | None = None


class MetadataIn(RequestModel):
    """Envelope metadata the caller knows; Settle fills the rest."""

    node_type: str | None = None
    element_key: str | None = None
    execution_id: int | str | None = None
    run_at: str | None = None
    version: str | None = None


class _Outcome(KeyRequest):
    data: JsonValue = None
    metadata: MetadataIn | None = None
    substatus: Text | None = None
    lock_token: Token | None = None


class SetRequest(_Outcome):
    status: str | int = Field(description="Processed, Skipped or Failed (name or code 1, 4, 3).")
    error: Text | None = None


class UpsertRequest(_Outcome):
    pass


class ReleaseRequest(KeyRequest):
    error: Text = Field(description="Why processing failed.")
    lock_token: Token | None = None


class HistoryRequest(KeyRequest):
    page_size: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE
    continuation_token: Token | None = None


class QueryRequest(RequestModel):
    tenant_id: Int32
    scope_id: Annotated[int, Field(ge=1, le=7)] | None = None
    scope: str | None = None
    entity_id: Int32 | None = None
    entity_execution_id: Int32 | None = None
    item_entity_key: (
        Annotated[str, Field(min_length=1), AfterValidator(_matchable_item_entity_key)] | None
    ) = None
    status: str | int | None = None
    updated_from: Instant | None = None
    updated_to: Instant | None = None
    page_size: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE
    continuation_token: Token | None = None
    handler: HandlerIn = Field(default_factory=HandlerIn)

    @model_validator(mode="after")
    def _scope(self) -> Self:
        if self.scope is not None:
            named = int(Scope.from_code(self.scope))
            if self.scope_id is not None and self.scope_id != named:
                raise ValueError(f"scopeId {self.scope_id} and scope {self.scope!r} disagree")
            self.scope_id = named
        return self


# -- responses ---------------------------------------------------------------------------------------
class ExistsResponse(ApiModel):
    exists: bool
    status: str = Field(description="Current status name (None when there is no record).")


class PreviousAttempt(ApiModel):
    """How the version this lock replaced ended (the attempt before this one)."""

    status: str = Field(description="Its status: Processing (taken over now), Failed, Processed, Expired ...")
    error: str | None = Field(default=None, description="Its error text (Failed), if any.")
    lock_expired: bool = Field(
        description=(
            "True when that attempt ended because its lock expired before its holder recorded an outcome: "
            "taken over by this lock, or concluded Failed (substatus LockExpired) by catch-up before. The "
            "previous holder may have done part of the work."
        )
    )
    version: int = Field(description="Its version in the record's history.")


class LockResponse(ApiModel):
    acquired: bool
    lock_token: str | None = None
    locked_until: datetime | None = Field(
        default=None,
        description=(
            "Acquired: when the lock expires. Refused because another caller holds it: when that lock may "
            "be taken over (the answer's Retry-After header gives the seconds to wait)."
        ),
    )
    reason: str | None = Field(
        default=None, description="Why the lock was refused, and what happens next (when it is taken over)."
    )
    status: str = Field(description="The record's status after the call.")
    takeover: bool = Field(default=False, description="True when an expired lock was taken over.")
    replayed: bool = Field(
        default=False,
        description=(
            "True when this call did not take the lock but was handed the one a call with the same "
            "requestId took (still held). Only the attempt that took it should act on it."
        ),
    )
    previous_attempt: PreviousAttempt | None = Field(
        default=None,
        description="When acquired: how the attempt before this lock ended (null for a new record).",
    )


class ExtendResponse(ApiModel):
    lock_token: str
    locked_until: datetime


class Record(ApiModel):
    """A record (the current version) or one version of its history."""

    tenant_id: int
    scope_id: int
    scope: str
    entity_id: int
    entity_execution_id: int | None = None
    source_app_id: int | None = None
    item_key: str
    item_entity_key: str
    sub_item_key: str
    sub_item_entity_key: str
    status: str
    status_code: int
    original_status: str | None = Field(
        default=None, description="For a Superseded history row: the status it had when it was current."
    )
    substatus: str | None = None
    error: str | None = None
    note: str | None = None
    data: Any = None
    version: int
    handler_key: str | None = None
    locked_at: datetime | None = None
    locked_until: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    superseded_at: datetime | None = None


class RecordPage(ApiModel):
    items: list[Record]
    continuation_token: str | None = None


class ScopeInfo(ApiModel):
    id: int
    name: str


class StatusInfo(ApiModel):
    code: int
    name: str


class StateMeta(ApiModel):
    """The seeds' lookup lists (scopes, statuses) and the handler names, so clients need not copy them."""

    scopes: list[ScopeInfo]
    statuses: list[StatusInfo]
    handlers: list[str]
    exists_statuses: list[str]
    settable_statuses: list[str]
