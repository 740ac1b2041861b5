"""The client's models: what it sends (a :class:`Key`, a :class:`Handler`) and what Settle answers.

Answers are parsed with ``extra="ignore"``: a field the server adds later never breaks the client.
Python names are snake_case, the wire is camelCase (``item_key`` is ``itemKey``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from settle_client.enums import Scope
from settle_client.errors import ContentTruncated, InvalidInput


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Key(BaseModel):
    """A record's key and the context recorded with it (the seeds' StateHandlerContext fields).

    Give the scope as ``scope_id`` (1-7) or ``scope`` (a :class:`Scope` or its name). For execution
    scopes (5-7) ``entity_execution_id`` is part of the key; for the others it is recorded as "which run
    wrote this". Build one from a dict in camelCase or snake_case with :meth:`of`.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    tenant_id: int
    scope_id: int = Field(ge=1, le=7)
    entity_id: int
    item_entity_key: str = Field(min_length=1)
    item_key: str = Field(min_length=1)
    sub_item_entity_key: str = ""
    sub_item_key: str = ""
    entity_execution_id: int | None = None
    source_app_id: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _scope_by_name(cls, value: Any) -> Any:
        if not isinstance(value, Mapping) or "scope" not in value:
            return value
        fields = dict(value)
        named = int(Scope.parse(fields.pop("scope")))
        given = fields.get("scopeId", fields.get("scope_id"))
        if given is not None and given != named:
            raise ValueError(f"scopeId {given} and scope {value['scope']!r} disagree")
        fields["scopeId"] = named
        fields.pop("scope_id", None)
        return fields

    @classmethod
    def of(cls, value: KeyLike) -> Key:
        """A key from a :class:`Key` or a mapping; a clear :class:`InvalidInput` naming the field if not."""
        if isinstance(value, Key):
            return value
        if not isinstance(value, Mapping):
            raise InvalidInput(f"A key is a Key or a mapping, not {type(value).__name__}.", field="key")
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            field = f"key.{where}" if where else "key"
            raise InvalidInput(f"{field}: {first['msg']}", field=field) from exc

    @property
    def scope(self) -> Scope:
        return Scope(self.scope_id)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


KeyLike = Key | Mapping[str, Any]


class Metadata(BaseModel):
    """Envelope metadata the caller knows (Settle fills the rest: handler, scope, status...)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    node_type: str | None = None
    element_key: str | None = None
    execution_id: int | str | None = None
    run_at: str | None = None
    version: str | None = None

    @classmethod
    def of(cls, value: Metadata | Mapping[str, Any] | None) -> Metadata | None:
        """Metadata from a model or a mapping; :class:`InvalidInput` naming an unknown field."""
        if value is None or isinstance(value, Metadata):
            return value
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = "metadata." + ".".join(str(p) for p in first["loc"])
            raise InvalidInput(f"{field}: {first['msg']}", field=field) from exc

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


MetadataLike = Metadata | Mapping[str, Any]


class Handler(BaseModel):
    """Which handler serves the calls: ``built-in`` (Table Storage, the default) or ``null`` (no-op),
    with its options (``lockSeconds``, ``retentionSeconds`` / ``retentionDays``)."""

    model_config = ConfigDict(frozen=True)

    key: str = "built-in"
    options: dict[str, int] = Field(default_factory=dict)


class Record(_Wire):
    """A record (the current version) or one version of its history.

    ``data`` is what the caller stored (the ``data`` of Settle's envelope); ``envelope`` is the whole
    stored envelope (``metadata``, ``idempotencyInfo``, ``data``) as the wire's ``data`` field carries it.
    """

    tenant_id: int
    scope_id: int
    scope: str
    entity_id: int
    entity_execution_id: int | None = None
    source_app_id: int | None = None
    item_key: str
    item_entity_key: str
    sub_item_key: str = ""
    sub_item_entity_key: str = ""
    status: str
    status_code: int
    original_status: str | None = None
    substatus: str | None = None
    error: str | None = None
    note: str | None = None
    envelope: Any = Field(default=None, alias="data")
    version: int
    handler_key: str | None = None
    locked_at: datetime | None = None
    locked_until: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    superseded_at: datetime | None = None

    @property
    def data(self) -> Any:
        """What the caller stored with the outcome (``None`` when nothing was)."""
        return self.envelope.get("data") if isinstance(self.envelope, dict) else None

    @property
    def metadata(self) -> dict[str, Any]:
        """The envelope's ``metadata`` (node type, run, handler...)."""
        meta = self.envelope.get("metadata") if isinstance(self.envelope, dict) else None
        return meta if isinstance(meta, dict) else {}


class RecordPage(_Wire):
    items: list[Record]
    continuation_token: str | None = None


class PreviousAttempt(_Wire):
    """How the attempt before this lock ended (the version the lock replaced).

    ``lock_expired``: that attempt's lock expired before its holder recorded an outcome (it crashed, was
    stopped, or lost its lock), whether this lock took it over (``status`` Processing) or catch-up had
    already concluded it (``status`` Failed, ``error`` "The lock expired ..."): the previous holder may
    have done part of the work. ``error``: its error text (a Failed attempt)."""

    status: str
    error: str | None = None
    lock_expired: bool = False
    version: int | None = None


class LockResult(_Wire):
    """The answer of ``lock``. ``replayed``: a retry with the same ``requestId`` got the lock it had taken.
    ``previous_attempt``: how the attempt before this lock ended (``None`` for a new record)."""

    acquired: bool
    lock_token: str | None = None
    locked_until: datetime | None = None
    reason: str | None = None
    status: str
    takeover: bool = False
    replayed: bool = False
    previous_attempt: PreviousAttempt | None = None


class ExtendResult(_Wire):
    lock_token: str
    locked_until: datetime


class Coordinates(_Wire):
    """The six coordinates of a parked event (NimBus ``HandoffSettlement``)."""

    event_id: str
    session_id: str | None = None
    message_id: str | None = None
    event_type_id: str | None = None
    correlation_id: str | None = None
    originating_message_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class _HandoffMarks(_Wire):
    """What NimBus marks a parked hand-off with (on its event row and on the message that parked it): why
    it was parked, the external job doing the work, and when that job is expected to be done."""

    handoff_reason: str | None = None
    external_job_id: str | None = None
    expected_by: datetime | None = None


class Lease(_Wire):
    """A lease on a parked hand-off from a leased receive: its settlement is fenced by ``token``."""

    token: str
    expires_at: datetime
    lease_seconds: int
    leased_by: str | None = None


class HandoffView(_HandoffMarks):
    """A parked hand-off (Pending + Handoff) as ``next``, ``receive`` and ``job`` answer it."""

    endpoint_id: str
    event_type_id: str | None = None
    payload: str | None = None
    coordinates: Coordinates
    parked_at: datetime | None = None
    # Settle stored the parked body truncated (too large for a row): ``payload`` is not the whole body.
    content_truncated: bool = False
    # Leased receive only: the lease this agent holds on it (``None`` from ``next`` and ``job``).
    lease: Lease | None = None

    def payload_json(self) -> Any:
        """The parked event's body (EventJson) parsed as JSON (``None`` when absent).

        Raises :class:`ContentTruncated` when Settle stored the body truncated: read it from its source
        (or fail the hand-off) rather than act on a body that is not there."""
        if self.content_truncated:
            raise ContentTruncated(
                f"The body of event {self.coordinates.event_id} was too large for Settle to store whole; "
                "it is not available here."
            )
        return json.loads(self.payload) if self.payload else None


class _ControlMessageAccepted(_Wire):
    """202: one control message (``message_type``) for an event is Settle's to deliver: it was sent
    (``confirmed``) or will be confirmed or re-sent by Settle's reconciler (``confirmed`` false), claimed at
    ``claimed_at``. ``replayed``: the answer to an earlier identical request, from its claim."""

    endpoint_id: str
    event_id: str
    message_type: str
    control_message_id: str
    transport: str | None = None
    confirmed: bool = True
    state: str | None = None
    replayed: bool = False
    claimed_at: datetime | None = None


class SettlementAccepted(_ControlMessageAccepted):
    """202: Settle owns the settlement now: its one control message was sent (``confirmed``) or will be
    confirmed or re-sent by Settle's reconciler (``confirmed`` false; ``follow_up`` then says what Settle does
    about it and where an operator sees it). ``replayed``: the answer to an earlier identical request."""

    parked_message_id: str | None = None
    settled_by: str | None = None
    follow_up: str | None = None


class HistoryEntry(_HandoffMarks):
    """One message of an event's history (NimBus ``MessageEntity``)."""

    message_id: str
    message_type: str
    event_type_id: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    parent_message_id: str | None = None
    originating_message_id: str | None = None
    enqueued_time_utc: datetime | None = None
    message_content: Any = None
    content_truncated: bool = False  # ``message_content`` is not the whole message
    pending_sub_status: str | None = None


class AuditEntry(_Wire):
    """One audit row (NimBus ``MessageAuditEntity``): who did what to the event."""

    auditor_name: str
    audit_timestamp: datetime
    audit_type: str
    comment: str | None = None
    data: str | None = None


class _EventSummary(_Wire):
    """The columns of an endpoint's event row (NimBus ``UnresolvedEvent``) that say where it stands."""

    endpoint_id: str
    event_id: str
    event_type_id: str | None = None
    resolution_status: str
    pending_sub_status: str | None = None
    message_type: str | None = None
    last_message_id: str | None = None
    session_id: str | None = None
    updated_at: datetime | None = None
    reason: str | None = None


class Event(_HandoffMarks, _EventSummary):
    """An endpoint's event row (NimBus ``UnresolvedEvent``) with its history and audits."""

    correlation_id: str | None = None
    message_content: Any = None
    content_truncated: bool = False  # ``message_content`` is not the whole message
    history: list[HistoryEntry] = Field(default_factory=list)
    audits: list[AuditEntry] = Field(default_factory=list)

    @property
    def is_pending_handoff(self) -> bool:
        return self.resolution_status == "Pending" and self.pending_sub_status == "Handoff"


class NamedScope(_Wire):
    id: int
    name: str


class NamedStatus(_Wire):
    code: int
    name: str


class Meta(_Wire):
    """``GET /api/v1/state/meta``: the server's scopes, statuses and handlers."""

    scopes: list[NamedScope]
    statuses: list[NamedStatus]
    handlers: list[str]
    exists_statuses: list[str]
    settable_statuses: list[str]
