"""Backpressure, never loss, in the resolver: with storage beyond its budget (bench/throttle.py in front
of Azurite, answering 503 ServerBusy / 500 OperationTimedOut as Azure does), every message is either
projected or rescheduled (a later copy), never poisoned; re-delivering the copies projects every event,
read back from storage."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from bench.proxy import CountingProxy
from bench.throttle import Budget, VirtualClock
from common import runtime
from handoff import service
from handoff.messages.contract import MessageType
from handoff.projection.resolver import Outcome
from tests.support.handoff_flows import Flow


class Copies:
    """The resolver's redelivery: keeps the copies it schedules (the broker would deliver them later)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.scheduled: list[tuple[str, int]] = []
        self.clock = clock

    def schedule_copy(self, msg: Any, *, delay_s: float, throttle_retry_count: int) -> None:
        self.scheduled.append((str(msg.message_id), throttle_retry_count))
        self.clock.now += delay_s  # the copy is delivered after its delay: storage's budget refills meanwhile


@pytest.fixture
def throttled(
    azurite_connection: str, fresh_tables: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Budget]:
    endpoint = next(
        p.split("=", 1)[1] for p in azurite_connection.split(";") if p.startswith("TableEndpoint")
    )
    # Virtual time (10 ms per request): the same throttling on a fast or a loaded machine.
    budget = Budget(partition_per_s=20, account_per_s=60, timeout_every=5, clock=VirtualClock(0.01))
    with CountingProxy(endpoint.rsplit("/", 1)[0], budget=budget) as proxy:
        monkeypatch.setenv("SETTLE_TABLES", proxy.connection_string(azurite_connection))
        runtime.reset(client_options={"retry_total": 0})
        service.reset()
        yield budget
    monkeypatch.setenv("SETTLE_TABLES", azurite_connection)
    runtime.reset()
    service.reset()


def test_beyond_the_budget_the_resolver_reschedules_and_every_event_is_projected(
    throttled: Budget, azurite_connection: str
) -> None:
    resolver = service.resolver_service()
    assert isinstance(throttled.clock, VirtualClock)
    copies = Copies(throttled.clock)
    resolver.redelivery = lambda: copies
    endpoint = "Hot-" + uuid.uuid4().hex[:8]
    flows = [Flow(endpoint=endpoint, event_id=str(uuid.uuid4()), request_id=f"req-{n}") for n in range(12)]
    outcomes: Counter[Outcome] = Counter()

    def deliver(build: Any) -> None:
        """Deliver a message, then its rescheduled copies, until it is projected."""
        attempt = 0
        for _ in range(60):
            outcome = resolver.handle(build(attempt))
            outcomes[outcome] += 1
            assert outcome is not Outcome.POISONED
            if outcome is not Outcome.RESCHEDULED:
                return
            attempt = copies.scheduled[-1][1]
        raise AssertionError("never projected")

    # Given 12 events, each a request then its resolution, sent as fast as one thread goes
    for f in flows:
        deliver(lambda n, f=f: f.request(message_id=f.request_id, ThrottleRetryCount=n))
        deliver(
            lambda n, f=f: f.response(
                MessageType.ResolutionResponse, message_id=f"res-{f.event_id}", ThrottleRetryCount=n
            )
        )
    # Then storage throttled and the resolver rescheduled, never poisoned
    assert throttled.refusals() > 0 and outcomes[Outcome.RESCHEDULED] > 0
    # And, read from storage without the throttle, every event is Completed with its two history rows
    from azure.data.tables import TableServiceClient

    from handoff.storage import keys

    name = runtime.tables().settings.table_name(keys.EVENTS_TABLE)
    table = TableServiceClient.from_connection_string(azurite_connection).get_table_client(name)
    for f in flows:
        rows = list(
            table.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={
                    "pk": service.layout()
                    .now()
                    .event_partition(endpoint, f.event_id),  # the endpoint itself when S = 1
                    "low": f"ev|{f.event_id}|",
                    "high": f"ev|{f.event_id}}}",
                },
            )
        )
        event = [r for r in rows if str(r["RowKey"]).endswith("|e")]
        history = [r for r in rows if "|m|" in str(r["RowKey"])]
        assert len(event) == 1 and len(history) == 2, rows
        assert event[0]["ResolutionStatus"] == "Completed", event[0]
