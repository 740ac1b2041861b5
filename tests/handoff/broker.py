"""A model of the Service Bus side of settlement, for counting what really reached an endpoint.

``Broker`` stands for a namespace: each endpoint topic accepts a message or, with duplicate detection on,
drops a copy whose MessageId it accepted within the window. Accepted copies wait in ``pending`` until
``pump()`` forwards them to the resolver, as NimBus's fan-out rule does (``forward=True`` does that at once,
on the sender's thread, like the loopback transport).

``BrokerTransport`` is how settlement talks to it, with a script of behaviours per send, the failure modes
the issue names: ``ok``; ``refuse`` (nothing reached the broker: cannot connect, auth refused...);
``deliver-then-raise`` (the broker accepted the message, then the sender saw an error: the ambiguous case);
``lost-before`` (an error the sender cannot classify, and the broker never got the message).

The counting rule of the issue: messages that reached the endpoint topic (``delivered``), audits (as the
event view shows them), history rows of control messages, final row state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from handoff.messages.transport import SendRefused, message_body, to_trigger_message

DETECTION_WINDOW = timedelta(minutes=10)


@dataclass
class Copy:
    topic: str
    at: datetime
    message_id: str
    event_id: str
    message_type: str
    body: bytes
    properties: dict[str, Any]
    message: Any


@dataclass
class Broker:
    """Endpoint topics with (or without) duplicate detection, and the fan-out to the resolver."""

    window: timedelta | None = DETECTION_WINDOW
    forward: bool = False
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    delivered: list[Copy] = field(default_factory=list)
    dropped: list[Copy] = field(default_factory=list)
    pending: list[Copy] = field(default_factory=list)
    _first_seen: dict[tuple[str, str], datetime] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def receive(self, topic: str, message: Any, *, at: datetime | None = None) -> bool:
        """The broker gets one copy; True when it is kept (not a duplicate within the window)."""
        at = at or self.clock()
        props = {str(k): v for k, v in (message.application_properties or {}).items()}
        copy = Copy(
            topic=topic,
            at=at,
            message_id=str(message.message_id),
            event_id=str(props.get("EventId")),
            message_type=str(props.get("MessageType")),
            body=message_body(message),
            properties=props,
            message=message,
        )
        with self._lock:
            first = self._first_seen.get((topic, copy.message_id))
            if self.window is not None and first is not None and at - first < self.window:
                self.dropped.append(copy)
                return False
            self._first_seen[(topic, copy.message_id)] = at
            self.delivered.append(copy)
            self.pending.append(copy)
        if self.forward:
            self.pump()
        return True

    def pump(self) -> int:
        """Forward every accepted copy not yet forwarded to the resolver; how many."""
        from handoff import service

        with self._lock:
            batch, self.pending = self.pending, []
        for copy in batch:
            service.resolver_service().handle(to_trigger_message(copy.message, enqueued=copy.at))
        return len(batch)

    def for_event(self, event_id: str) -> list[Copy]:
        with self._lock:
            return [c for c in self.delivered if c.event_id == event_id]


@dataclass
class BrokerTransport:
    """Settlement's transport onto a :class:`Broker`, failing as the script says (then ``ok``)."""

    broker: Broker
    script: list[str] = field(default_factory=list)
    # Picks the behaviour of a send once the script is used up (default: ``ok``).
    chooser: Callable[[], str] | None = None
    name: str = "broker"
    attempts: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def duplicate_window(self) -> timedelta | None:
        return self.broker.window

    def then(self, behaviours: Iterable[str]) -> BrokerTransport:
        self.script.extend(behaviours)
        return self

    def send(self, topic: str, message: Any) -> None:
        with self._lock:
            behaviour = self.script.pop(0) if self.script else (self.chooser() if self.chooser else "ok")
            self.attempts.append(behaviour)
        if behaviour == "refuse":
            raise SendRefused("Service Bus refused the connection (test): nothing was sent")
        if behaviour == "lost-before":
            raise TimeoutError("send timed out before the broker got the message (test)")
        self.broker.receive(topic, message)
        if behaviour == "deliver-then-raise":
            raise ConnectionError("link detached after the broker accepted the message (test)")
        if behaviour != "ok":
            raise ValueError(f"unknown behaviour {behaviour!r}")
