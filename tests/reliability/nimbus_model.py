"""An independent model of the resolver's reference rules (nimbus-contract.md §2.2, §2.5, §2.7).

Written from the contract text, not from ``handoff/``: the status map, the Spec 030 stale-write guard
(ancestor check first, then by incoming type), and idempotency per (EventId, MessageId). The suite
compares Settle's resolver with it after every delivery.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

TERMINAL = {"Completed", "Skipped", "Failed", "DeadLettered", "Unsupported"}
# "Settled" for the invariant: the statuses not even a late PendingHandoffResponse may reopen (§2.7).
SETTLED = {"Completed", "Skipped"}
STATUS = {
    "EventRequest": "Pending",
    "ResubmissionRequest": "Pending",
    "RetryRequest": "Pending",
    "SkipRequest": "Pending",
    "ContinuationRequest": "Pending",
    "PendingHandoffResponse": "Pending",
    "HandoffCompletedRequest": "Pending",
    "HandoffFailedRequest": "Pending",
    "ErrorResponse": "Failed",
    "ResolutionResponse": "Completed",
    "DeferralResponse": "Deferred",
    "SkipResponse": "Skipped",
    "UnsupportedResponse": "Unsupported",
}
REQUESTS = {
    "EventRequest",
    "ResubmissionRequest",
    "RetryRequest",
    "SkipRequest",
    "ContinuationRequest",
    "HandoffCompletedRequest",
    "HandoffFailedRequest",
}
CONTROL = REQUESTS - {"EventRequest"}
REQUEST_STAGE = {"EventRequest", "DeferralResponse", "Unknown"}
GUARDED_TYPES = {"EventRequest", "DeferralResponse", "PendingHandoffResponse"} | CONTROL


@dataclass(frozen=True)
class Msg:
    """One NimBus message of an event's causal chain (its lineage: ``parent`` is what it answers)."""

    kind: str
    message_id: str
    parent: str = "self"
    dead_letter: str | None = None


@dataclass
class Row:
    status: str
    message_type: str
    parent: str
    last_message_id: str

    @property
    def sub_status(self) -> str | None:
        return "Handoff" if self.message_type == "PendingHandoffResponse" else None


def allows(status: str, msg: Msg, current: Row | None) -> bool:
    """Spec 030 ``StaleWriteGuard.Allows`` as the contract states it."""
    if current is None or status in TERMINAL or msg.kind not in GUARDED_TYPES:
        return True
    if current.parent and current.parent == msg.message_id:
        return False
    if msg.kind in ("EventRequest", "DeferralResponse"):
        return current.status not in TERMINAL and current.message_type in REQUEST_STAGE
    if msg.kind == "PendingHandoffResponse":
        return current.status not in SETTLED
    return True


@dataclass
class EventModel:
    row: Row | None = None
    history: list[str] = field(default_factory=list)
    refused: int = 0

    def deliver(self, msg: Msg) -> str:
        """``applied``, ``refused`` or ``duplicate`` (the history row of this message exists)."""
        if msg.message_id in self.history:
            return "duplicate"
        self.history.append(msg.message_id)
        status = "DeadLettered" if msg.dead_letter else STATUS[msg.kind]
        if allows(status, msg, self.row):
            self.row = Row(status, msg.kind, msg.parent, msg.message_id)
            return "applied"
        self.refused += 1
        return "refused"


def chain(flow: str) -> list[Msg]:
    """The messages of one event, in causal order, with NimBus lineage."""
    ids = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in ("req", "park", "ctl", "out", "extra")}
    req = Msg("EventRequest", ids["req"])
    if flow == "complete":
        park = Msg("PendingHandoffResponse", ids["park"], req.message_id)
        ctl = Msg("HandoffCompletedRequest", ids["ctl"], park.message_id)
        return [req, park, ctl, Msg("ResolutionResponse", ids["out"], ctl.message_id)]
    if flow == "fail":
        park = Msg("PendingHandoffResponse", ids["park"], req.message_id)
        ctl = Msg("HandoffFailedRequest", ids["ctl"], park.message_id)
        return [req, park, ctl, Msg("ErrorResponse", ids["out"], ctl.message_id)]
    if flow == "skip":
        err = Msg("ErrorResponse", ids["park"], req.message_id)
        skip = Msg("SkipRequest", ids["ctl"], err.message_id)
        return [req, err, skip, Msg("SkipResponse", ids["out"], skip.message_id)]
    if flow == "defer":
        deferral = Msg("DeferralResponse", ids["park"], req.message_id)
        drained = Msg("EventRequest", ids["ctl"], "self")
        return [req, deferral, drained, Msg("ResolutionResponse", ids["out"], drained.message_id)]
    if flow == "deadletter":
        return [req, Msg("ResolutionResponse", ids["out"], req.message_id, dead_letter="Lock lost")]
    raise ValueError(flow)


FLOWS = ("complete", "fail", "skip", "defer", "deadletter")


def service_bus_message(
    msg: Msg, *, endpoint: str, event_id: str, delivery_count: int = 1, enqueued: datetime | None = None
) -> ServiceBusMessage:
    """The copy the Resolver subscription delivers (requests attributed by To, responses by From)."""
    is_request = msg.kind in REQUESTS
    props: dict[str, Any] = {
        "MessageType": msg.kind,
        "EventId": event_id,
        "To": endpoint if is_request else "Resolver",
        "From": ("Manager" if msg.kind in CONTROL else "Storefront") if is_request else endpoint,
        "ParentMessageId": msg.parent,
        "OriginatingMessageId": "self",
        "OriginatingFrom": "self",
        "RetryCount": 0,
        "EventTypeId": "Billing.InvoiceCreated",
    }
    if msg.kind == "PendingHandoffResponse":
        props.update(HandoffReason="Awaiting import", ExternalJobId=f"job-{msg.message_id}")
    if msg.dead_letter:
        props.update(DeadLetterReason="MaxDeliveryCountExceeded", DeadLetterErrorDescription=msg.dead_letter)
    content: dict[str, Any] = {
        "EventContent": {"EventTypeId": "Billing.InvoiceCreated", "EventJson": '{"invoice": 1}'},
        "ErrorContent": None,
    }
    if msg.kind in ("ErrorResponse", "HandoffFailedRequest"):
        content["ErrorContent"] = {"ErrorText": "boom", "ErrorType": "Exception"}
    return ServiceBusMessage(
        body=json.dumps(content).encode(),
        message_id=msg.message_id,
        session_id=event_id,
        correlation_id=event_id,
        application_properties=props,
        user_properties={},
        enqueued_time_utc=enqueued or datetime.now(UTC),
        delivery_count=delivery_count,
    )
