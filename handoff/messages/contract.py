"""The NimBus wire contract: message types, statuses, properties, the body, parsing, control messages.

Names are NimBus's own (``reference/nimbus-contract.md`` §1): enum members are sent and stored by name,
application properties are PascalCase, and the body is the Newtonsoft-default ``MessageContent`` JSON
(PascalCase, nulls included, ``EventJson`` a JSON *string*). Pure: no I/O here.

The outbox is imported inside the function that builds a control message, so the worker's indexing of the app
does not load it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    import azure.functions as func
    from azure.servicebus import ServiceBusMessage as OutboundMessage

    from handoff.messages.outbound import OutboxMessage

RESOLVER_ID = "Resolver"
MANAGER_ID = "Manager"
SELF = "self"
HEARTBEAT_EVENT_TYPE = "NimBus.Platform.Heartbeat"
HANDOFF_SUB_STATUS = "Handoff"


def _ordinal_upper(text: str) -> str:
    """Per-character simple upper case, as .NET's ``OrdinalIgnoreCase`` compares (ß stays ß)."""
    return "".join(u if len(u := c.upper()) == 1 else c for c in text)


def is_heartbeat(event_type_id: str | None) -> bool:
    """NimBus diverts heartbeats by event type, compared ``OrdinalIgnoreCase``."""
    return event_type_id is not None and _ordinal_upper(event_type_id) == _ordinal_upper(HEARTBEAT_EVENT_TYPE)


class MessageType(Enum):
    """``NimBus.Core.Messages.MessageType``; the value is NimBus's numeric value."""

    Unknown = 0
    EventRequest = 1
    ErrorResponse = 2
    ResolutionResponse = 3
    DeferralResponse = 4
    SkipResponse = 5
    ResubmissionRequest = 6
    SkipRequest = 7
    RetryRequest = 8
    ContinuationRequest = 9
    UnsupportedResponse = 10
    ProcessDeferredRequest = 11
    PendingHandoffResponse = 12
    HandoffCompletedRequest = 13
    HandoffFailedRequest = 14

    @property
    def is_request(self) -> bool:
        """Requests are attributed to their ``To`` endpoint, everything else to ``From``."""
        return self in _REQUESTS

    @classmethod
    def parse(cls, raw: object) -> MessageType | None:
        """Like .NET ``Enum.TryParse``: the exact (case-sensitive) name, or a numeric string.

        Numbers as .NET reads an Int32: ASCII digits only (``²``, ``①``, ``١٢`` are not numbers there),
        one optional sign, surrounding white space; anything else, or out of range, is no type. Never raises.
        """
        if isinstance(raw, int) and not isinstance(raw, bool):
            return next((m for m in cls if m.value == raw), None)
        if not isinstance(raw, str):
            return None
        if raw in cls.__members__:
            return cls[raw]
        number = ascii_int(raw)
        return next((m for m in cls if m.value == number), None) if number is not None else None


_REQUESTS = frozenset(
    {
        MessageType.EventRequest,
        MessageType.ContinuationRequest,
        MessageType.RetryRequest,
        MessageType.ResubmissionRequest,
        MessageType.SkipRequest,
        MessageType.HandoffCompletedRequest,
        MessageType.HandoffFailedRequest,
    }
)


class ResolutionStatus(Enum):
    """``NimBus.MessageStore.ResolutionStatus`` (stored and answered by name)."""

    Pending = 0
    Deferred = 1
    Failed = 2
    TooManyRequests = 3
    DeadLettered = 4
    Unsupported = 5
    Published = 6
    Completed = 7
    Skipped = 8


class Prop:
    """Application property names (``NimBus.Core.Messages.UserPropertyName``)."""

    FROM = "From"
    TO = "To"
    MESSAGE_TYPE = "MessageType"
    EVENT_ID = "EventId"
    ORIGINATING_MESSAGE_ID = "OriginatingMessageId"
    PARENT_MESSAGE_ID = "ParentMessageId"
    RETRY_LIMIT = "RetryLimit"
    RETRY_COUNT = "RetryCount"
    ORIGINATING_FROM = "OriginatingFrom"
    DEAD_LETTER_ERROR_DESCRIPTION = "DeadLetterErrorDescription"
    DEAD_LETTER_REASON = "DeadLetterReason"
    EVENT_TYPE_ID = "EventTypeId"
    QUEUE_TIME_MS = "QueueTimeMs"
    PROCESSING_TIME_MS = "ProcessingTimeMs"
    HANDOFF_REASON = "HandoffReason"
    EXTERNAL_JOB_ID = "ExternalJobId"
    EXPECTED_BY = "ExpectedBy"
    THROTTLE_RETRY_COUNT = "ThrottleRetryCount"


class _Pascal(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)


class EventPart(_Pascal):
    """``EventContent``: the event type and its JSON (a string)."""

    EventTypeId: str | None = None
    EventJson: str | None = None


class ErrorPart(_Pascal):
    """``ErrorContent``: what went wrong."""

    ErrorText: str | None = None
    ErrorType: str | None = None
    ExceptionStackTrace: str | None = None
    ExceptionSource: str | None = None


class MessageContent(_Pascal):
    """The body: ``{"EventContent": ..., "ErrorContent": ...}`` (PascalCase, nulls included)."""

    EventContent: EventPart | None = None
    ErrorContent: ErrorPart | None = None

    def to_wire(self) -> str:
        """Newtonsoft default serialisation: every field present, nulls included."""
        return self.model_dump_json()


class PoisonMessage(Exception):
    """The message can never be projected (retrying cannot help); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InboundMessage(BaseModel):
    """A resolver input, typed: what NimBus's ``MessageEntity`` copies from the Service Bus message."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    message_id: str
    message_type: MessageType
    event_id: str
    session_id: str | None
    correlation_id: str | None
    to: str | None
    from_: str | None
    originating_from: str | None
    originating_message_id: str | None
    parent_message_id: str | None
    event_type_id: str | None
    enqueued_time_utc: datetime
    delivery_count: int
    throttle_retry_count: int
    retry_count: int | None
    retry_limit: int | None
    dead_letter_reason: str | None
    dead_letter_error_description: str | None
    queue_time_ms: int | None
    processing_time_ms: int | None
    handoff_reason: str | None
    external_job_id: str | None
    expected_by: datetime | None
    content: MessageContent
    body_text: str
    # What Settle had to change to store a header (kept on the rows as ``InputNotes``).
    input_notes: tuple[str, ...] = ()

    @property
    def endpoint_id(self) -> str:
        """Attribution (``DetermineEndpoint``): requests by ``To``, responses by ``From``."""
        endpoint = self.to if self.message_type.is_request else self.from_
        assert endpoint  # parse() refuses messages without it
        return endpoint


# .NET ``int.Parse`` with the invariant culture: white space, one sign, ASCII digits (``str.isdigit`` and
# ``int()`` also take superscripts and other scripts' digits, which .NET refuses).
_ASCII_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]{1,19})[ \t\n\v\f\r]*\Z")
_INT64_RANGE = range(-(2**63), 2**63)


def ascii_int(text: str) -> int | None:
    """``text`` as .NET reads an integer (within Int64), else None; never raises."""
    match = _ASCII_INT.match(text)
    if match is None:
        return None
    value = int(match.group(1))
    return value if value in _INT64_RANGE else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value)
    return text if text != "" else None


def _optional(value: object) -> str | None:
    """An optional text property as sent: absent is None and ``""`` stays ``""`` (NimBus keeps them apart)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def parse_int(value: object) -> int | None:
    """An integer property, or None when absent or not a number (NimBus reads those as unset)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return ascii_int(str(value))
    except Exception:  # a property whose str() fails is as unset as one that is not a number
        return None


# Table Storage's DateTime range (``reference/idempotency-anchors.md`` §4.1: "DateTime (UTC, ≥ 1601-01-01)")
# up to the last instant Python (and .NET) can hold.
STORABLE_FROM = datetime(1601, 1, 1, tzinfo=UTC)
STORABLE_UNTIL = datetime.max.replace(tzinfo=UTC)


def parse_expected_by(value: object) -> datetime | None:
    """ISO-8601 round-trip (``2026-06-01T09:00:00.0000000Z``) or a datetime; a bad format gives None."""
    return storable_expected_by(value)[0]


def storable_expected_by(value: object) -> tuple[datetime | None, str | None]:
    """``ExpectedBy`` in UTC as Table Storage can store it, and a note when the header had to be changed.

    Before 1601 (.NET ``DateTime.MinValue`` is what an unset DateTime serialises to) it is dropped: no
    deadline, as an unset one. Past the last storable instant (year 9999 with a negative offset is in year
    10000 as UTC) it is clamped to that instant: a deadline that never comes. The park is kept either way.
    """
    raw: datetime | None
    if isinstance(value, datetime):
        raw = value
    else:
        text = _text(value)
        if text is None:
            return None, None
        try:
            raw = datetime.fromisoformat(text)
        except ValueError:
            return None, None
    if raw.tzinfo is None:
        raw = raw.replace(tzinfo=UTC)
    try:
        utc = raw.astimezone(UTC)
    except OverflowError:  # beyond year 1 or 9999 once in UTC
        utc = None
    if utc is None and raw.year > 1:
        return STORABLE_UNTIL, (
            f"ExpectedBy {value!s} is after the last instant Table Storage stores; "
            f"clamped to {STORABLE_UNTIL.isoformat()}."
        )
    if utc is None or utc < STORABLE_FROM:
        return None, (
            f"ExpectedBy {value!s} is before 1601-01-01, the earliest DateTime Table Storage stores; "
            "dropped (no deadline, as an unset ExpectedBy)."
        )
    return utc, None


def parse_body(body: bytes) -> tuple[MessageContent, str]:
    """The ``MessageContent`` and its text; an empty body is empty content, anything unreadable is poison."""
    if not body or not body.strip():
        return MessageContent(), ""
    try:
        text = body.decode("utf-8-sig")
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PoisonMessage(f"Unreadable body: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict):
        raise PoisonMessage("Unreadable body: the MessageContent must be a JSON object.")
    try:
        return MessageContent.model_validate(data), text
    except ValidationError as exc:
        raise PoisonMessage(f"Unreadable body: {exc.errors()[0]['msg']}") from exc


def properties_of(msg: func.ServiceBusMessage) -> dict[str, Any]:
    """Application properties (the worker fills both dicts; application properties win)."""
    merged: dict[str, Any] = {}
    merged.update(getattr(msg, "user_properties", None) or {})
    merged.update(getattr(msg, "application_properties", None) or {})
    return merged


def event_type_of(props: Mapping[str, Any], body: bytes) -> str | None:
    """``EventTypeId`` property, else the body's ``EventContent.EventTypeId`` (unreadable body → None)."""
    value = _text(props.get(Prop.EVENT_TYPE_ID))
    if value is not None:
        return value
    try:
        content, _ = parse_body(body)
    except PoisonMessage:
        return None
    return content.EventContent.EventTypeId if content.EventContent else None


def parse_message(msg: func.ServiceBusMessage, *, now: datetime) -> InboundMessage:
    """Type a trigger message, or raise :class:`PoisonMessage` saying why it can never be projected."""
    props = properties_of(msg)
    raw_type = props.get(Prop.MESSAGE_TYPE)
    message_type = MessageType.parse(raw_type)
    if message_type is None:
        raise PoisonMessage(f"Unknown MessageType {raw_type!r}.")
    if message_type in (MessageType.Unknown, MessageType.ProcessDeferredRequest):
        raise PoisonMessage(f"MessageType {message_type.name} has no projection.")
    message_id = _text(msg.message_id)
    if message_id is None:
        raise PoisonMessage("The message has no MessageId.")
    event_id = _text(props.get(Prop.EVENT_ID))
    if event_id is None:
        raise PoisonMessage("The message has no EventId.")
    to = _text(props.get(Prop.TO))
    from_ = _text(props.get(Prop.FROM))
    originating_from = _optional(props.get(Prop.ORIGINATING_FROM))
    if message_type.is_request:
        if to is None:
            raise PoisonMessage(f"A {message_type.name} without To cannot be attributed to an endpoint.")
        # NimBus records a request lacking From with From = OriginatingFrom ?? "self".
        from_ = from_ or originating_from or SELF
    elif from_ is None:
        raise PoisonMessage(f"A {message_type.name} without From cannot be attributed to an endpoint.")
    content, text = parse_body(msg.get_body())
    event_type_id = _optional(props.get(Prop.EVENT_TYPE_ID))
    if event_type_id is None and content.EventContent:
        event_type_id = content.EventContent.EventTypeId
    expected_by, expected_by_note = storable_expected_by(props.get(Prop.EXPECTED_BY))
    enqueued = msg.enqueued_time_utc or now
    if enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    return InboundMessage(
        message_id=message_id,
        message_type=message_type,
        event_id=event_id,
        session_id=_optional(msg.session_id),
        correlation_id=_optional(msg.correlation_id),
        to=to,
        from_=from_,
        originating_from=originating_from,
        originating_message_id=_optional(props.get(Prop.ORIGINATING_MESSAGE_ID)),
        parent_message_id=_optional(props.get(Prop.PARENT_MESSAGE_ID)),
        event_type_id=event_type_id,
        enqueued_time_utc=enqueued.astimezone(UTC),
        delivery_count=parse_int(msg.delivery_count) or 1,
        throttle_retry_count=parse_int(props.get(Prop.THROTTLE_RETRY_COUNT)) or 0,
        retry_count=parse_int(props.get(Prop.RETRY_COUNT)),
        retry_limit=parse_int(props.get(Prop.RETRY_LIMIT)),
        dead_letter_reason=_optional(props.get(Prop.DEAD_LETTER_REASON)),
        dead_letter_error_description=_optional(props.get(Prop.DEAD_LETTER_ERROR_DESCRIPTION)),
        queue_time_ms=parse_int(props.get(Prop.QUEUE_TIME_MS)),
        processing_time_ms=parse_int(props.get(Prop.PROCESSING_TIME_MS)),
        handoff_reason=_optional(props.get(Prop.HANDOFF_REASON)),
        external_job_id=_optional(props.get(Prop.EXTERNAL_JOB_ID)),
        expected_by=expected_by,
        content=content,
        body_text=text,
        input_notes=(expected_by_note,) if expected_by_note else (),
    )


class Coordinates(BaseModel):
    """The six audit-row coordinates NimBus's ``HandoffSettlement`` carries.

    Only the event and the parked message are needed to address a hand-off (NimBus's WebApp settles by
    endpoint/event/message); the others are taken from the event row when left out.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    event_id: str
    message_id: str
    session_id: str | None = None
    event_type_id: str | None = None
    correlation_id: str | None = None
    originating_message_id: str | None = None


def settlement_content(
    message_type: MessageType,
    coords: Coordinates,
    *,
    result_json: str | None = None,
    error_text: str | None = None,
    error_type: str | None = None,
) -> MessageContent:
    """The body ``HandoffControlMessageFactory`` builds (§1.5 of the contract)."""
    if message_type is MessageType.HandoffFailedRequest:
        return MessageContent(ErrorContent=ErrorPart(ErrorText=error_text, ErrorType=error_type))
    if result_json:
        return MessageContent(EventContent=EventPart(EventTypeId=coords.event_type_id, EventJson=result_json))
    return MessageContent()


def control_message(
    message_type: MessageType,
    endpoint_id: str,
    coords: Coordinates,
    content: MessageContent,
    *,
    message_id: str | None = None,
) -> OutboxMessage:
    """A ``HandoffCompletedRequest`` / ``HandoffFailedRequest`` with the pinned NimBus wire shape.

    Each settlement gets a new MessageId (NimBus: a new GUID): different messages never share one, so
    duplicate detection can only ever drop a copy of the same message.
    """
    from handoff.messages.outbound import OutboxMessage

    properties: dict[str, Any] = {
        Prop.TO: endpoint_id,
        Prop.FROM: MANAGER_ID,
        Prop.MESSAGE_TYPE: message_type.name,
        Prop.EVENT_ID: coords.event_id,
        # HandoffControlMessageFactory: OriginatingMessageId = coords.OriginatingMessageId ?? ParentMessageId.
        Prop.ORIGINATING_MESSAGE_ID: coords.originating_message_id or coords.message_id,
        Prop.PARENT_MESSAGE_ID: coords.message_id,
        Prop.RETRY_COUNT: 0,
        Prop.ORIGINATING_FROM: SELF,
    }
    if coords.event_type_id:
        properties[Prop.EVENT_TYPE_ID] = coords.event_type_id
    return OutboxMessage(
        message_id=message_id or str(uuid.uuid4()),
        body=content.to_wire(),
        session_id=coords.session_id,
        correlation_id=coords.correlation_id,
        properties=properties,
    )


def build_control_message(
    message_type: MessageType,
    endpoint_id: str,
    coords: Coordinates,
    content: MessageContent,
    *,
    message_id: str | None = None,
) -> OutboundMessage:
    """:func:`control_message` as an ``azure.servicebus.ServiceBusMessage``."""
    return control_message(message_type, endpoint_id, coords, content, message_id=message_id).to_service_bus()
