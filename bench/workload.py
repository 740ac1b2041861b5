"""What the benchmark sends: state keys and calls, raw entities of the same size, NimBus messages.

The raw baseline entities carry the same key fields and data as the Settle rows they stand beside, so
a ratio compares the function layer and the algorithm, not the payload size.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

from bench.harness import App, HttpAnswer

_counter = itertools.count(1)
_counter_lock = threading.Lock()

DATA = {"dispatchedAt": "2026-05-31T14:32:11Z", "apiResponse": {"id": "INV-2024-00892", "ok": True}}


class Unexpected(Exception):
    """A Settle call answered something the benchmark did not expect (reported, never hidden)."""


def new_key(tenant: int = 1, prefix: str = "item") -> dict[str, Any]:
    """A state key no other call in this run uses."""
    with _counter_lock:
        n = next(_counter)
    return {
        "tenantId": tenant,
        "scopeId": 4,
        "entityId": 42,
        "itemKey": f"{prefix}-{n}-{uuid.uuid4().hex[:8]}",
        "itemEntityKey": "invoice",
    }


def expect(answer: HttpAnswer, *statuses: int, what: str) -> HttpAnswer:
    if answer.status not in statuses:
        raise Unexpected(f"{what} answered {answer.status}: {answer.body[:300]!r}")
    return answer


class State:
    """The state operations through the function entry points."""

    def __init__(self, app: App) -> None:
        self.app = app

    def lock(self, key: dict[str, Any]) -> HttpAnswer:
        return self.app.http("state_lock", {"key": key})

    def acquire(self, key: dict[str, Any]) -> str:
        """Lock ``key`` (which must be free) and return the lock token."""
        answer = expect(self.lock(key), 200, what="state_lock")
        body = answer.json
        if not body.get("acquired"):
            raise Unexpected(f"state_lock on a free key did not acquire: {body}")
        return str(body["lockToken"])

    def set(self, key: dict[str, Any], token: str | None) -> HttpAnswer:
        body: dict[str, Any] = {"key": key, "status": "Processed", "data": DATA}
        if token is not None:
            body["lockToken"] = token
        return self.app.http("state_set", body)

    def release(self, key: dict[str, Any], token: str | None) -> HttpAnswer:
        body: dict[str, Any] = {"key": key, "error": "benchmark failure"}
        if token is not None:
            body["lockToken"] = token
        return self.app.http("state_release", body)

    def extend(self, key: dict[str, Any], token: str) -> HttpAnswer:
        return self.app.http("state_lock_extend", {"key": key, "lockToken": token})

    def upsert(self, key: dict[str, Any]) -> HttpAnswer:
        return self.app.http("state_upsert", {"key": key, "data": DATA})

    def exists(self, key: dict[str, Any]) -> HttpAnswer:
        return self.app.http("state_exists", {"key": key})

    def get(self, key: dict[str, Any]) -> HttpAnswer:
        return self.app.http("state_get", {"key": key})

    def query(self, tenant: int) -> HttpAnswer:
        return self.app.http("state_query", {"tenantId": tenant, "pageSize": 10})

    def history(self, key: dict[str, Any]) -> HttpAnswer:
        return self.app.http("state_history", {"key": key})

    def processed(self, key: dict[str, Any]) -> None:
        """Bring ``key`` to Processed (lock, then fenced set)."""
        token = self.acquire(key)
        expect(self.set(key, token), 200, 204, what="state_set")


def raw_entity(partition: str, row: str) -> dict[str, Any]:
    """A raw row as large as a Settle state row (key fields, status, data, lock fields, timestamps)."""
    now = datetime.now(UTC)
    return {
        "PartitionKey": partition,
        "RowKey": row,
        "TenantId": 1,
        "ScopeId": 4,
        "EntityId": 42,
        "ItemKey": row,
        "ItemEntityKey": "invoice",
        "SubItemKey": "",
        "SubItemEntityKey": "",
        "Status": "Processing",
        "StatusCode": 2,
        "Data": json.dumps(DATA),
        "LockToken": uuid.uuid4().hex,
        "LockedUntil": now + timedelta(minutes=30),
        "CreatedAt": now,
        "UpdatedAt": now,
    }


def unique_row() -> str:
    return uuid.uuid4().hex


# ------------------------------------------------------------------------------------------- NimBus


def nimbus_message(
    message_type: str,
    *,
    event_id: str,
    message_id: str,
    endpoint: str,
    session_id: str,
    parent_message_id: str = "self",
    extra: dict[str, Any] | None = None,
) -> Any:
    """An ``azure.functions`` Service Bus message shaped as NimBus sends it to the Resolver topic."""

    is_request = message_type.endswith("Request")
    props: dict[str, Any] = {
        "MessageType": message_type,
        "EventId": event_id,
        "To": endpoint if is_request else "Resolver",
        "OriginatingMessageId": "self",
        "ParentMessageId": parent_message_id,
        "RetryCount": 0,
        "OriginatingFrom": "self",
        "EventTypeId": "InvoiceCreated",
    }
    if is_request:
        props["From"] = "Manager" if message_type.startswith("Handoff") else "Billing-producer"
    else:
        props["From"] = endpoint
    props.update(extra or {})
    body = {
        "EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": json.dumps({"invoice": event_id})},
        "ErrorContent": None,
    }
    return ServiceBusMessage(
        body=json.dumps(body).encode(),
        message_id=message_id,
        session_id=session_id,
        correlation_id=event_id,
        enqueued_time_utc=datetime.now(UTC),
        delivery_count=1,
        application_properties=props,
        user_properties={},
    )


def event_messages(endpoint: str, n: int) -> list[tuple[str, Any]]:
    """One event's life: request, park (hand-off), settlement, terminal response."""
    event_id = f"evt-{n}-{uuid.uuid4().hex[:8]}"
    session = f"session-{n % 50}"
    request_id = f"InvoiceCreated-{uuid.uuid4().hex}"
    park_id = uuid.uuid4().hex
    settle_id = uuid.uuid4().hex
    expected = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.0000000Z")
    return [
        (
            "EventRequest",
            nimbus_message(
                "EventRequest",
                event_id=event_id,
                message_id=request_id,
                endpoint=endpoint,
                session_id=session,
            ),
        ),
        (
            "PendingHandoffResponse",
            nimbus_message(
                "PendingHandoffResponse",
                event_id=event_id,
                message_id=park_id,
                endpoint=endpoint,
                session_id=session,
                parent_message_id=request_id,
                extra={"HandoffReason": "awaiting ERP", "ExternalJobId": f"job-{n}", "ExpectedBy": expected},
            ),
        ),
        (
            "HandoffCompletedRequest",
            nimbus_message(
                "HandoffCompletedRequest",
                event_id=event_id,
                message_id=settle_id,
                endpoint=endpoint,
                session_id=session,
                parent_message_id=park_id,
            ),
        ),
        (
            "ResolutionResponse",
            nimbus_message(
                "ResolutionResponse",
                event_id=event_id,
                message_id=uuid.uuid4().hex,
                endpoint=endpoint,
                session_id=session,
                parent_message_id=settle_id,
            ),
        ),
    ]
