"""The resolver: project each NimBus message into the endpoint's event row, history and index rows.

One message costs one read (the event row) and one write (an entity-group transaction holding the
history row, the event row and its index rows), because all of them live in the endpoint's partition.
The history insert comes first in the transaction: if it already exists the message was projected
before (the transaction is atomic), so a duplicate changes nothing. A lost ETag race is retried; the
failure policy (poison vs transient) is in ``docs/adr/0002-resolver-poison-and-retry.md``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from common import telemetry
from common.beside import Beside
from common.clock import utcnow
from common.errors import KeyTooLong, is_transient_storage_fault
from handoff import counts, ids, keys, store
from handoff.contract import (
    MANAGER_ID,
    InboundMessage,
    MessageType,
    PoisonMessage,
    Prop,
    event_type_of,
    is_heartbeat,
    parse_int,
    parse_message,
    properties_of,
)
from handoff.projection import RESOLVER_AUDITOR, history_row, project, stale_comment
from handoff.records import (
    AuditRow,
    EventRow,
    ExpiryRow,
    JobRow,
    ListingRow,
    PoisonRow,
    QueueRow,
    SinceRow,
    TableRecord,
    int64,
)
from handoff.store import HandoffStore, Operation

if TYPE_CHECKING:
    import azure.functions as func

log = logging.getLogger("settle.resolver")

# Logical attempts (scheduled copies + broker deliveries) before the resolver stops rescheduling and lets
# the broker dead-letter (NimBus's budget). 5 s doubling, capped at 300 s: about 21 minutes in all.
RETRY_BUDGET = 10
_BASE_DELAY_S = 5.0
_MAX_DELAY_S = 300.0
# When no copy can be scheduled, back off inside the invocation before the host abandons the message
# (Service Bus redelivers an abandoned message at once); the session lock is renewed meanwhile.
_MAX_INLINE_DELAY_S = 60.0
_ETAG_ATTEMPTS = 4


class Outcome(Enum):
    """What the resolver did with one message (logged; returned for tests and the benchmark)."""

    APPLIED = "applied"
    REFUSED = "refused"
    DUPLICATE = "duplicate"
    HEARTBEAT = "heartbeat"
    POISONED = "poisoned"
    RESCHEDULED = "rescheduled"


class TransientProjectionError(Exception):
    """Storage failed or kept racing; the message must be delivered again later."""


class Redelivery(Protocol):
    """Schedules a copy of a resolver message on the Resolver topic (NimBus ``ScheduleRedelivery``)."""

    def schedule_copy(
        self, msg: func.ServiceBusMessage, *, delay_s: float, throttle_retry_count: int
    ) -> None: ...


def is_transient(exc: BaseException) -> bool:
    """Storage unreachable, throttling, failing server-side, an answer we could not read, or storage
    refusing Settle's identity (:func:`~common.errors.is_transient_storage_fault`): try again.

    Deterministic failures (another 4xx with a status, a bug) are not: they go to poison with their cause.
    """
    return isinstance(exc, TransientProjectionError) or is_transient_storage_fault(exc)


# The outcome as telemetry names it (docs/observability.md).
_OUTCOME_NAMES = {
    Outcome.APPLIED: "applied",
    Outcome.REFUSED: "refused-stale",
    Outcome.DUPLICATE: "duplicate",
    Outcome.HEARTBEAT: "heartbeat",
    Outcome.POISONED: "poison",
    Outcome.RESCHEDULED: "rescheduled",
}


def _text_of(value: object) -> str | None:
    return None if value is None else str(value)


def _status_of(row: EventRow | None) -> str:
    """``Pending+Handoff``, ``Completed``, ... or ``None`` (no row yet)."""
    if row is None:
        return "None"
    sub = f"+{row.pending_sub_status}" if row.pending_sub_status else ""
    return row.resolution_status.name + sub


def _span_attributes(msg: func.ServiceBusMessage, props: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The message type's name and the span's attributes; never raises (it runs before the poison handling,
    so a value it could not read must not fail the delivery: ``parse_message`` says why, as poison)."""
    try:
        parsed = MessageType.parse(props.get(Prop.MESSAGE_TYPE))
        message_type = parsed.name if parsed is not None else "Unparsed"
        return message_type, {
            "messaging.system": "servicebus",
            "nimbus.message_type": message_type,
            "nimbus.message_id": _text_of(msg.message_id),
            "nimbus.session_id": _text_of(msg.session_id),
            "nimbus.event_id": _text_of(props.get(Prop.EVENT_ID)),
            "nimbus.event_type_id": _text_of(props.get(Prop.EVENT_TYPE_ID)),
            "messaging.servicebus.message.delivery_count": parse_int(msg.delivery_count),
        }
    except Exception:
        log.warning("could not read the span attributes of a resolver message", exc_info=True)
        return "Unparsed", {"messaging.system": "servicebus", "nimbus.message_type": "Unparsed"}


def poison_endpoint(props: dict[str, Any]) -> str | None:
    """The endpoint a poison message names, by NimBus's attribution where its type is known."""
    from handoff.contract import RESOLVER_ID

    kind = MessageType.parse(props.get(Prop.MESSAGE_TYPE))
    to = str(props.get(Prop.TO) or "") or None
    from_ = str(props.get(Prop.FROM) or "") or None
    if kind is not None and kind.is_request:
        return to
    if kind is not None:
        return from_
    return from_ if (to is None or to == RESOLVER_ID) else to


def delta_entity(pk: str, at: datetime, change: dict[str, int]) -> dict[str, Any]:
    """A counts delta row (insert-only; see :mod:`handoff.counts`)."""
    entity: dict[str, Any] = {"PartitionKey": pk, "RowKey": keys.delta_row(at, uuid.uuid4().hex)}
    entity.update({counts.column(bucket): value for bucket, value in change.items()})
    return entity


def _error_text(message_content: str | None) -> str | None:
    """``ErrorContent.ErrorText`` of a stored body, if it has one."""
    if not message_content:
        return None
    try:
        data = json.loads(message_content)
    except ValueError:
        return None
    error = data.get("ErrorContent") if isinstance(data, dict) else None
    text = error.get("ErrorText") if isinstance(error, dict) else None
    return text if isinstance(text, str) else None


def _short(text: str | None, limit: int = 300) -> str | None:
    if text is None:
        return None
    return text if len(text) <= limit else text[: limit - 1] + "…"


def retry_delay(attempt: int) -> float:
    """5 s, 10 s, 20 s, ... capped at 300 s, for logical attempt ``attempt`` (1-based)."""
    return float(min(_BASE_DELAY_S * 2 ** max(0, attempt - 1), _MAX_DELAY_S))


class ResolverService:
    """Projects resolver messages (``handle``) into the hand-off tables."""

    def __init__(
        self,
        store_: HandoffStore,
        *,
        redelivery: Callable[[], Redelivery | None] = lambda: None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store_
        # Looked up when a copy is needed, so a transport change reaches the resolver too.
        self.redelivery = redelivery
        self.clock = clock
        self.sleep = sleep
        self._registered: set[str] = set()
        self.ids = ids.IdsIndex(store_)

    # -- entry point -------------------------------------------------------------------------------

    def handle(self, msg: func.ServiceBusMessage) -> Outcome:
        """Project one message. Returns normally to complete it; raises to have the host retry it.

        Its span (``settle.resolver.project``) is a child of the host's invocation context, which the host
        makes a child of the message's trace; called without one, it continues the trace of the message
        (``traceparent``, else ``Diagnostic-Id``). Either way a settlement and the projection of its
        control message are one trace.
        """
        props = properties_of(msg)
        message_type, attributes = _span_attributes(msg, props)
        # Inside the host's invocation context (in Azure, already a child of the message's trace) that
        # context is the parent; called without one, the message's own trace is continued.
        with telemetry.span(
            "settle.resolver.project",
            attributes,
            carrier=props,
            continue_carrier=not telemetry.host_invocation_current(),
        ) as span:
            try:
                outcome = self._handle(msg, props)
            except Exception as exc:
                span.failed(exc, slug="retry")  # raised to the host: the message comes again
                telemetry.add("settle.resolver.messages", message_type=message_type, outcome="retry")
                raise
            span.set_outcome(_OUTCOME_NAMES[outcome])
            telemetry.add(
                "settle.resolver.messages", message_type=message_type, outcome=_OUTCOME_NAMES[outcome]
            )
            return outcome

    def _handle(self, msg: func.ServiceBusMessage, props: dict[str, Any]) -> Outcome:
        if is_heartbeat(event_type_of(props, msg.get_body())):
            log.debug("heartbeat %s bypassed", msg.message_id)
            return Outcome.HEARTBEAT
        try:
            try:
                inbound = parse_message(msg, now=self.clock())
                return self.project(inbound)
            except PoisonMessage as poison:
                reason = poison.reason
            except KeyTooLong as too_long:
                reason = too_long.detail
            except Exception as exc:
                if is_transient(exc):
                    raise
                # NimBus dead-letters "Failed to handle message."; retrying a deterministic failure ten
                # times helps no one, so it goes where the other poison goes, with the cause.
                log.exception("resolver could not handle %s", msg.message_id)
                reason = f"Failed to handle message: {type(exc).__name__}: {exc}"
            self._store_poison(msg, props, reason)
            return Outcome.POISONED
        except Exception as exc:
            if not is_transient(exc):
                raise
            return self._retry_later(msg, props, exc)

    # -- projection --------------------------------------------------------------------------------

    def project(self, m: InboundMessage) -> Outcome:
        """Read the event row once, write everything in one transaction; retry a lost ETag race."""
        endpoint = m.endpoint_id
        pk = self.store.event_partition(endpoint, m.event_id)  # every row of the event: one EGT
        # The operator overview, the sweeper and the reconciler walk the listed endpoints: an endpoint new
        # to this process is listed beside the event's read, and the projection is written only once it
        # is (issue 21: a cold instance's first message).
        listing: Beside[None] | None = None
        if endpoint not in self._registered:
            listing = Beside(lambda: self.store.register_endpoint(endpoint), name="settle-endpoint-listing")
        # The lookup index (hoids) is written beside the read too; the transaction waits for it and carries
        # the rows whose insert failed to the reconciler.
        indexed = self.ids.send(ids.refs_of(m))
        try:
            return self._project(m, pk, listing, indexed)
        finally:
            indexed()
            if listing is not None:
                listing.wait()

    def _project(
        self,
        m: InboundMessage,
        pk: str,
        listing: Beside[None] | None,
        indexed: Callable[[], list[dict[str, Any]]],
    ) -> Outcome:
        from azure.data.tables import TableTransactionError

        endpoint = m.endpoint_id
        for _ in range(_ETAG_ATTEMPTS):
            current = self.store.get_event(endpoint, m.event_id)
            now = self.clock()
            decision = project(m, current, now=now)
            sequence = (current.history_count if current else 0) + 1
            history = history_row(m, now=now, sequence=sequence)
            ops: list[Operation] = [
                store.insert(history.to_entity(pk, keys.history_row(m.event_id, m.message_id)))
            ]
            if decision.applied:
                assert decision.row is not None
                if listing is not None:
                    listing.result()  # what it raised is raised: the event is not written unlisted
                    self._registered.add(endpoint)
                ops += self._applied_ops(pk, decision.row, current)
            else:
                ops += self._refused_ops(
                    pk,
                    m,
                    current,
                    decision.request_enqueued_at,
                    decision.handoff_seen,
                    sequence,
                    comment=decision.refusal,
                )
            if m.message_type is MessageType.RetryRequest:
                ops.append(self._retry_audit(pk, m, now))
            lost = indexed()
            if lost:
                ops.append(store.insert(ids.repair_entity(pk, m, lost, now)))
            try:
                self.store.submit(ops)
            except TableTransactionError as exc:
                if exc.index == 0 and exc.status_code == 409:
                    log.info("duplicate %s %s ignored", m.message_type.name, m.message_id)
                    return Outcome.DUPLICATE
                if exc.status_code in (404, 409, 412):
                    continue  # another writer changed the row between our read and write: re-decide
                raise
            telemetry.annotate(
                {
                    "nimbus.endpoint": endpoint,
                    "settle.status_before": _status_of(current),
                    "settle.status_after": _status_of(decision.row if decision.applied else current),
                }
            )
            if decision.applied:
                log.info("projected %s %s on %s/%s", m.message_type.name, m.message_id, endpoint, m.event_id)
                return Outcome.APPLIED
            log.warning(
                "refused stale %s %s on %s/%s (delivery %s, throttle retries %s)",
                m.message_type.name,
                m.message_id,
                endpoint,
                m.event_id,
                m.delivery_count,
                m.throttle_retry_count,
            )
            return Outcome.REFUSED
        raise TransientProjectionError(f"event {m.event_id} kept changing during projection")

    def _applied_ops(self, pk: str, row: EventRow, current: EventRow | None) -> list[Operation]:
        entity = row.to_entity(pk, keys.event_row(row.event_id))
        ops = [store.insert(entity) if current is None else store.replace(entity, current.etag or "*")]
        # Index rows change with the event row in the same transaction. The event row's ETag check makes
        # the index keys read from it current, so deleting them by key (If-Match *) cannot miss.
        wanted: list[tuple[str | None, str | None, TableRecord | None]] = [
            (
                current.queue_key if current else None,
                row.queue_key,
                QueueRow(
                    event_id=row.event_id,
                    event_type_id=row.event_type_id,
                    parked_message_id=row.last_message_id or "",
                ),
            ),
            (
                current.job_key if current else None,
                row.job_key,
                JobRow(event_id=row.event_id, external_job_id=row.external_job_id)
                if row.external_job_id
                else None,
            ),
            (
                current.expiry_key if current else None,
                row.expiry_key,
                ExpiryRow(event_id=row.event_id, expected_by=row.expected_by) if row.expected_by else None,
            ),
        ]
        for before, after, index_row in wanted:
            if before == after:
                continue  # same hand-off, same index row (it may carry a settlement's ClaimedUntil)
            if before:
                ops.append(store.delete(pk, before))
            if after and index_row is not None:
                ops.append(store.insert(index_row.to_entity(pk, after)))
        if current is None and row.session_id:  # the session index (operators' find), insert-only
            key = keys.session_row(row.session_id, row.event_id)
            ops.append(store.insert({"PartitionKey": pk, "RowKey": key, "EventId": row.event_id}))
        return ops + self._operator_ops(pk, row, current)

    def _operator_ops(self, pk: str, row: EventRow, current: EventRow | None) -> list[Operation]:
        """Listing rows, the oldest-first row and the counts delta, in the event row's transaction."""
        ops: list[Operation] = []
        counted = current is not None and current.counted
        old_keys = current.listing_keys if current and counted else []
        summary = ListingRow(
            event_id=row.event_id,
            event_type_id=row.event_type_id,
            resolution_status=row.resolution_status,
            pending_sub_status=row.pending_sub_status,
            message_type=row.message_type,
            last_message_id=row.last_message_id,
            session_id=row.session_id,
            updated_at=row.updated_at,
            enqueued_time_utc=row.enqueued_time_utc,
            reason=_short(row.reason or _error_text(row.message_content)),
            external_job_id=row.external_job_id,
        )
        for key in old_keys:
            if key not in row.listing_keys:
                ops.append(store.delete(pk, key))
        for key in row.listing_keys:
            entity = summary.to_entity(pk, key)
            ops.append(store.replace(entity, "*") if key in old_keys else store.insert(entity))
        old_since = current.since_key if current and counted else None
        if old_since != row.since_key:
            if old_since:
                ops.append(store.delete(pk, old_since))
            if row.since_key and row.since_at:
                ops.append(
                    store.insert(
                        SinceRow(event_id=row.event_id, since_at=row.since_at).to_entity(pk, row.since_key)
                    )
                )
        before = (
            counts.buckets_of(current.resolution_status, current.pending_sub_status)
            if current and counted
            else ()
        )
        change = counts.delta(before, counts.buckets_of(row.resolution_status, row.pending_sub_status))
        if change:
            ops.append(store.insert(delta_entity(pk, row.updated_at, change)))
        return ops

    @staticmethod
    def _retry_audit(pk: str, m: InboundMessage, now: datetime) -> Operation:
        """NimBus audits a RetryRequest (Manager / Retry); in the transaction, so a copy cannot repeat it."""
        audit = AuditRow(
            auditor_name=MANAGER_ID,
            audit_timestamp=now,
            audit_type="Retry",
            data=f"RetryRequest {m.message_id}",
            event_id=m.event_id,
            endpoint_id=m.endpoint_id,
            event_type_id=m.event_type_id,
        )
        return store.insert(audit.to_entity(pk, keys.audit_row(m.event_id, now, uuid.uuid4().hex)))

    def _refused_ops(
        self,
        pk: str,
        m: InboundMessage,
        current: EventRow | None,
        request_at: datetime | None,
        seen: bool,
        sequence: int,
        *,
        comment: str | None = None,
    ) -> list[Operation]:
        assert current is not None  # only an existing row can refuse
        now = self.clock()
        audit = AuditRow(
            auditor_name=RESOLVER_AUDITOR,
            audit_timestamp=now,
            audit_type="Comment",
            data=comment or stale_comment(m),
            event_id=m.event_id,
            endpoint_id=m.endpoint_id,
            event_type_id=m.event_type_id,
        )
        # The row's projection stays as it is; only the bookkeeping columns move (ETag-conditional, so a
        # concurrent projection makes this transaction fail and re-decide).
        bookkeeping: dict[str, Any] = {
            "PartitionKey": pk,
            "RowKey": keys.event_row(m.event_id),
            "HandoffSeen": seen,
            "HistoryCount": int64(sequence),
        }
        if request_at is not None:
            bookkeeping["RequestEnqueuedAt"] = request_at
        return [
            store.insert(audit.to_entity(pk, keys.audit_row(m.event_id, now, uuid.uuid4().hex))),
            store.merge(bookkeeping, current.etag),
        ]

    # -- failure paths -----------------------------------------------------------------------------

    def _store_poison(
        self, msg: func.ServiceBusMessage, props: dict[str, Any], reason: str, *, final: bool = False
    ) -> None:
        now = self.clock()
        body = msg.get_body() or b""
        row = PoisonRow(
            reason=reason,
            message_id=msg.message_id,
            session_id=msg.session_id,
            correlation_id=msg.correlation_id,
            delivery_count=msg.delivery_count,
            enqueued_time_utc=msg.enqueued_time_utc or now,
            recorded_at=now,
            # Whole, so a replay can re-send it (the row splits long text across properties).
            application_properties=json.dumps(props, default=str, ensure_ascii=False),
            endpoint_id=poison_endpoint(props),
            **PoisonRow.body_columns(body),
        )
        self.store.store_poison(row, msg.message_id, count_or_raise=not final)
        log.error("poison resolver message %s stored for operators: %s", msg.message_id, reason)

    def _retry_later(self, msg: func.ServiceBusMessage, props: dict[str, Any], exc: BaseException) -> Outcome:
        # NimBus reads a missing or malformed count as 0.
        throttle = max(0, parse_int(props.get(Prop.THROTTLE_RETRY_COUNT)) or 0)
        attempt = throttle + max(1, parse_int(msg.delivery_count) or 1)
        if attempt >= RETRY_BUDGET:
            # Where operators look (NimBus dead-letters with a reason); a replay re-projects it later.
            try:
                self._store_poison(
                    msg,
                    props,
                    f"retry budget exhausted after {attempt} attempts: {type(exc).__name__}: {exc}",
                    final=True,
                )
            except Exception:
                log.warning("could not store %s after its retry budget", msg.message_id, exc_info=True)
            else:
                return Outcome.POISONED
        redelivery = self.redelivery()
        if redelivery is not None and attempt < RETRY_BUDGET:
            delay = retry_delay(attempt)
            try:
                redelivery.schedule_copy(msg, delay_s=delay, throttle_retry_count=throttle + 1)
            except Exception:
                log.warning(
                    "could not schedule a copy of %s; abandoning it instead", msg.message_id, exc_info=True
                )
            else:
                log.warning("storage unavailable (%s); %s rescheduled in %.0f s", exc, msg.message_id, delay)
                return Outcome.RESCHEDULED
        delay = min(retry_delay(attempt), _MAX_INLINE_DELAY_S)
        log.warning("storage unavailable (%s); retrying %s after %.0f s", exc, msg.message_id, delay)
        self.sleep(delay)
        raise TransientProjectionError(f"projection of {msg.message_id} failed transiently: {exc}") from exc
