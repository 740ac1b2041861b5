"""Settlement of a parked hand-off: check → claim → send exactly one control message (202).

Closes the double-settle window NimBus documents (its tracker is per process): the claim is a Table row
keyed (endpoint, event id, parked message id), so two settlements of one hand-off can never both be sent,
on any number of instances. The claim, its audit row and the queue index's ``ClaimedUntil`` mark change
in one transaction before the send; a failed send releases all three in one transaction. So a 202 always
leaves exactly one audit row, and a 503 none. A claim expires after five minutes, so a settlement the
resolver never projects cannot hide the hand-off forever.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from common.clock import iso, utcnow
from common.errors import Conflict, NotFound, PayloadTooLarge
from handoff import keys, store
from handoff.contract import (
    Coordinates,
    MessageType,
    build_control_message,
    control_message_id,
    settlement_content,
)
from handoff.models import SettlementAccepted
from handoff.records import AuditRow, ClaimRow, EventRow
from handoff.store import HandoffStore, Operation
from handoff.transport import Transport

log = logging.getLogger("settle.settlement")

CLAIM_TTL = timedelta(minutes=5)
# Service Bus Standard caps a message at 256 KB; leave room for the properties and the envelope.
MAX_RESULT_BYTES = 192 * 1024
UNCLAIMED = "0"


@dataclass(frozen=True)
class Settlement:
    """One settle request, transport-neutral."""

    kind: MessageType  # HandoffCompletedRequest or HandoffFailedRequest
    endpoint_id: str
    coordinates: Coordinates
    settled_by: str
    result: Any = None
    error_text: str | None = None
    error_type: str | None = None

    @property
    def audit_type(self) -> str:
        return "CompleteHandoff" if self.kind is MessageType.HandoffCompletedRequest else "FailHandoff"


def result_json(result: Any) -> str | None:
    """NimBus ``CompleteAsync``: a string passes verbatim, other values become JSON, null is no payload."""
    if result is None:
        return None
    if isinstance(result, str):
        return result
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False)


class SettlementService:
    """Settles parked hand-offs through a :class:`~handoff.transport.Transport`."""

    def __init__(
        self, store_: HandoffStore, transport: Transport, *, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.store = store_
        self.transport = transport
        self.clock = clock

    def settle(self, s: Settlement, *, take_over_expired: bool = True) -> SettlementAccepted:
        """Send exactly one control message for a Pending + Handoff row; 404 / 409 / 503 otherwise."""
        payload = result_json(s.result)
        if payload is not None and len(payload.encode("utf-8")) > MAX_RESULT_BYTES:
            raise PayloadTooLarge(f"result is larger than {MAX_RESULT_BYTES} bytes as JSON.", field="result")
        row = self.store.get_event(s.endpoint_id, s.coordinates.event_id)
        if row is None:
            raise NotFound(f"Event {s.coordinates.event_id!r} is unknown on endpoint {s.endpoint_id!r}.")
        parked = self._check(row, s.coordinates)
        coords = self._complete_coordinates(s.coordinates, row)
        content = settlement_content(
            s.kind,
            coords,
            result_json=payload,
            error_text=s.error_text,
            error_type=s.error_type,
        )
        message = build_control_message(
            s.kind,
            s.endpoint_id,
            coords,
            content,
            message_id=control_message_id(s.endpoint_id, row.event_id, parked),
        )
        claim = self._claim(s, row, parked, str(message.message_id), take_over_expired=take_over_expired)
        try:
            self.transport.send(s.endpoint_id, message)
        except Exception:
            self._release(s.endpoint_id, row, claim)
            raise
        log.info("%s sent for %s/%s by %s", s.kind.name, s.endpoint_id, row.event_id, s.settled_by)
        return SettlementAccepted(
            endpoint_id=s.endpoint_id,
            event_id=row.event_id,
            message_type=s.kind.name,
            control_message_id=str(message.message_id),
            parked_message_id=parked,
            settled_by=s.settled_by,
            transport=self.transport.name,
            claim_expires_at=claim.expires_at,
        )

    @staticmethod
    def _check(row: EventRow, coords: Coordinates) -> str:
        """The parked message id, if the row is a pending hand-off these coordinates address."""
        if not row.is_pending_handoff:
            raise Conflict(
                f"Event {row.event_id!r} is not a pending hand-off "
                f"(it is {row.resolution_status.name}"
                + (f" + {row.pending_sub_status}" if row.pending_sub_status else "")
                + f", last written by {row.message_type.name}).",
                field="coordinates.eventId",
            )
        if coords.session_id != (row.session_id or ""):
            raise Conflict(
                "coordinates.sessionId does not match the parked event.", field="coordinates.sessionId"
            )
        # The agent path passes the row's lastMessageId (the PendingHandoffResponse); an adapter may pass
        # the request it parked (the response's ParentMessageId). Either addresses this hand-off.
        if coords.message_id not in (row.last_message_id, row.parent_message_id):
            raise Conflict(
                "coordinates.messageId does not address the parked message (a newer park replaced it?).",
                field="coordinates.messageId",
            )
        assert row.last_message_id is not None
        return row.last_message_id

    @staticmethod
    def _complete_coordinates(coords: Coordinates, row: EventRow) -> Coordinates:
        """Lineage fields the caller left out come from the row (legacy callers may omit them)."""
        return coords.model_copy(
            update={
                "event_type_id": coords.event_type_id or row.event_type_id,
                "correlation_id": coords.correlation_id or row.correlation_id,
                "originating_message_id": coords.originating_message_id or row.originating_message_id,
            }
        )

    def _claim(
        self, s: Settlement, row: EventRow, parked: str, control_message_id: str, *, take_over_expired: bool
    ) -> ClaimRow:
        from azure.data.tables import TableTransactionError

        pk = keys.partition(s.endpoint_id)
        claim_key = keys.claim_row(row.event_id, parked)
        now = self.clock()
        audit_key = keys.audit_row(row.event_id, now, uuid.uuid4().hex)
        claim = ClaimRow(
            event_id=row.event_id,
            parked_message_id=parked,
            claimed_at=now,
            expires_at=now + CLAIM_TTL,
            control_message_id=control_message_id,
            message_type=s.kind,
            settled_by=s.settled_by,
            audit_key=audit_key,
        )
        audit = AuditRow(
            auditor_name=s.settled_by,
            audit_timestamp=now,
            audit_type=s.audit_type,
            data=json.dumps(
                {
                    "controlMessageId": control_message_id,
                    "parkedMessageId": parked,
                    "result": result_json(s.result),
                    "errorText": s.error_text,
                    "errorType": s.error_type,
                },
                ensure_ascii=False,
            )[:4000],
            event_id=row.event_id,
            endpoint_id=s.endpoint_id,
            event_type_id=row.event_type_id,
        )
        tail: list[Operation] = [store.insert(audit.to_entity(pk, audit_key))]
        if row.queue_key:
            # If-Match *: the index row must still exist, i.e. the hand-off was not projected away.
            mark = {"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": iso(claim.expires_at)}
            tail.append(store.merge(mark))
        try:
            etags = self.store.submit([store.insert(claim.to_entity(pk, claim_key)), *tail])
        except TableTransactionError as exc:
            if exc.index != 0 or exc.status_code != 409:
                if exc.status_code == 404:
                    raise Conflict(f"Event {row.event_id!r} is no longer a pending hand-off.") from exc
                raise
            existing = self.store.get_claim(s.endpoint_id, row.event_id, parked)
            if existing is None or existing.expires_at > now or not take_over_expired:
                raise Conflict(
                    f"A settlement of event {row.event_id!r} is already in flight.",
                    field="coordinates.messageId",
                ) from exc
            # The earlier settlement expired unprojected: take its claim over (ETag-conditional).
            try:
                etags = self.store.submit(
                    [store.replace(claim.to_entity(pk, claim_key), existing.etag or ""), *tail]
                )
            except TableTransactionError as lost:
                raise Conflict(
                    f"A settlement of event {row.event_id!r} is already in flight.",
                    field="coordinates.messageId",
                ) from lost
        claim.etag = etags[0].get("etag") if etags else None
        return claim

    def _release(self, endpoint_id: str, row: EventRow, claim: ClaimRow) -> None:
        """Undo the claim after a failed send (best effort; an unreleased claim expires anyway)."""
        from azure.data.tables import TableTransactionError

        pk = keys.partition(endpoint_id)
        ops: list[Operation] = [
            store.delete(pk, keys.claim_row(row.event_id, claim.parked_message_id), claim.etag),
            store.delete(pk, claim.audit_key),
        ]
        if row.queue_key:
            ops.append(store.merge({"PartitionKey": pk, "RowKey": row.queue_key, "ClaimedUntil": UNCLAIMED}))
        try:
            try:
                self.store.submit(ops)
            except TableTransactionError as exc:
                if exc.index == 2 and exc.status_code == 404:
                    self.store.submit(ops[:2])  # the index row is gone: release the claim alone
                else:
                    raise
        except Exception:
            log.warning(
                "could not release the claim on %s/%s; it expires by itself",
                endpoint_id,
                row.event_id,
                exc_info=True,
            )
