"""The exact control message a settlement sends, storable in its claim row and re-sendable byte for byte.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusMessage


@dataclass(frozen=True)
class OutboxMessage:
    """The exact control message, storable and re-sendable byte for byte."""

    message_id: str
    body: str
    session_id: str | None
    correlation_id: str | None
    properties: dict[str, Any]

    def to_service_bus(self) -> ServiceBusMessage:
        """A new SDK message (each send gets its own object: the SDK may annotate the one it sends)."""
        from azure.servicebus import ServiceBusMessage

        return ServiceBusMessage(
            self.body,
            message_id=self.message_id,
            session_id=self.session_id,
            correlation_id=self.correlation_id,
            application_properties=cast(Any, dict(self.properties)),
        )

    def properties_json(self) -> str:
        return json.dumps(self.properties, ensure_ascii=False, separators=(",", ":"))

    def envelope_json(self) -> str:
        """Everything but the body (kept in its own column, unescaped)."""
        return json.dumps(
            {
                "messageId": self.message_id,
                "sessionId": self.session_id,
                "correlationId": self.correlation_id,
                "properties": self.properties,
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )

    @classmethod
    def from_stored(cls, envelope: str, body: str) -> OutboxMessage:
        data = json.loads(envelope)
        return cls(
            message_id=str(data["messageId"]),
            body=body,
            session_id=data.get("sessionId"),
            correlation_id=data.get("correlationId"),
            properties=dict(data.get("properties") or {}),
        )
