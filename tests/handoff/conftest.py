"""Hand-off fixtures: NimBus message builders, the resolver function, a capturing transport."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from azure.functions.servicebus import ServiceBusMessage

from handoff import service
from tests.support.handoff_flows import Flow

from .broker import Broker, BrokerTransport

if TYPE_CHECKING:
    from handoff.settlement.settler import SettlementService


@pytest.fixture
def flow() -> Flow:
    return Flow(endpoint="Billing-" + uuid.uuid4().hex[:8], event_id=str(uuid.uuid4()))


@pytest.fixture
def resolve(functions: dict[str, Any], settle_tables: str) -> Callable[[ServiceBusMessage], None]:
    """Run the ``resolver`` function exactly as the host would for one delivered message."""
    fn = functions["resolver"].get_user_function()
    return lambda msg: fn(msg)


@dataclass
class CaptureTransport:
    """Records every control message; ``fail`` refuses sends (nothing sent); ``forward`` projects them."""

    name: str = "capture"
    sent: list[Any] = field(default_factory=list)
    fail: bool = False
    forward: bool = False
    duplicate_window: timedelta | None = None

    def send(self, topic: str, message: Any) -> None:
        from handoff.messages.transport import SendRefused, to_trigger_message

        if self.fail:
            raise SendRefused("Service Bus is down (test)")
        self.sent.append((topic, message))
        if self.forward:
            service.resolver_service().handle(to_trigger_message(message, enqueued=datetime.now(UTC)))


@pytest.fixture
def transport() -> Iterator[CaptureTransport]:
    capture = CaptureTransport()
    service.use_transport(capture)
    yield capture
    service.reset()


@pytest.fixture
def delivered_then_raised() -> Iterator[Broker]:
    """The first send reaches the broker and is projected at once (as by the loopback), then raises; the
    sends after it are ``ok``."""
    broker = Broker(forward=True)
    service.use_transport(BrokerTransport(broker).then(["deliver-then-raise"]))
    yield broker
    service.reset()


@pytest.fixture
def other_instance(delivered_then_raised: Broker) -> SettlementService:
    """A second instance's settlement service: its own objects on the same tables and transport."""
    from common import runtime
    from handoff.settlement.settler import SettlementService
    from handoff.storage.store import HandoffStore

    return SettlementService(HandoffStore(runtime.tables(), service.layout()), service.transport)


@pytest.fixture
def no_sleep() -> Iterator[list[float]]:
    slept: list[float] = []
    resolver = service.resolver_service()
    original = resolver.sleep
    resolver.sleep = slept.append
    yield slept
    resolver.sleep = original


@pytest.fixture
def loopback(monkeypatch) -> Iterator[None]:
    """Settlements go through the in-process loopback transport (no Service Bus connection set)."""
    for name in ("ServiceBusConnection", "ServiceBusConnection__fullyQualifiedNamespace"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SETTLE_LOOPBACK", "true")
    service.reset()
    yield
    service.reset()
