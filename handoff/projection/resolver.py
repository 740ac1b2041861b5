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
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from common import telemetry
from common import transactions as tx
from common.beside import Beside
from common.clock import utcnow
from common.errors import KeyTooLong, is_transient_storage_fault
from handoff.messages.contract import (
    RESOLVER_ID,
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
from handoff.projection.rules import ProjectionRefused, plan_projection, project, projection_refused
from handoff.storage import ids
from handoff.storage.records import (
    EventRow,
    PoisonRow,
)
from handoff.storage.store import HandoffStore

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

    kind = MessageType.parse(props.get(Prop.MESSAGE_TYPE))
    to = str(props.get(Prop.TO) or "") or None
    from_ = str(props.get(Prop.FROM) or "") or None
    if kind is not None and kind.is_request:
        return to
    if kind is not None:
        return from_
    return from_ if (to is None or to == RESOLVER_ID) else to


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
        # The operator overview, the sweeper and the reconciler walk the listed endpoints: an endpoint new
        # to this process is listed beside the event's read, and the projection is written only once it
        # is (a cold instance's first message must not leave its endpoint unlisted).
        listing: Beside[None] | None = None
        if endpoint not in self._registered:
            listing = Beside(lambda: self.store.register_endpoint(endpoint), name="settle-endpoint-listing")
        # The lookup index (hoids) is written beside the read too; the transaction waits for it and carries
        # the rows whose insert failed to the reconciler.
        indexed = self.ids.send(ids.refs_of(m))
        try:
            return self._project(m, listing, indexed)
        finally:
            indexed()
            if listing is not None:
                listing.wait()

    def _project(
        self,
        m: InboundMessage,
        listing: Beside[None] | None,
        indexed: ids.SentIds,
    ) -> Outcome:
        endpoint = m.endpoint_id
        for _ in range(_ETAG_ATTEMPTS):
            pk, entity = self.store.locate_event(endpoint, m.event_id)  # every row of the event: one EGT
            current = EventRow.from_entity(entity) if entity is not None else None
            fence = self.store.event_fence(endpoint, m.event_id) if current is None else None
            if fence is not None and self.store.claim_earlier(fence, m.event_id):
                continue  # the event was created in an earlier layout (common/fence.py): read it there
            now = self.clock()
            decision = project(m, current, now=now)
            if decision.applied and listing is not None:
                listing.result()  # what it raised is raised: the event is not written unlisted
                self._registered.add(endpoint)
            ops = plan_projection(pk, m, current, decision, now=now)
            lost = indexed()
            job_error = indexed.error_of("externalJobId")
            if decision.row is not None and decision.row.is_pending_handoff and job_error is not None:
                # The job lookup reads only the index: a park is never written before its job's row.
                raise TransientProjectionError(
                    f"the job id index row of {m.message_id} was not written: {job_error}"
                ) from job_error
            if lost:
                ops.append(tx.insert(ids.repair_entity(pk, m, lost, now)))
            try:
                self.store.submit(ops)
            except Exception as exc:
                verdict = projection_refused(tx.refusal(exc))
                if verdict is ProjectionRefused.DUPLICATE:
                    log.info("duplicate %s %s ignored", m.message_type.name, m.message_id)
                    return Outcome.DUPLICATE
                if verdict is ProjectionRefused.RACED:
                    if current is None:  # an older layout's claim where the event goes is cleared
                        self.store.clear_claim_at_home(endpoint, m.event_id, fence)
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
