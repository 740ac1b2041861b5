"""Resolver hand-offs/s on **one** endpoint under the storage budget, for S = 1 (unsharded) and S = 4 shards
(``SETTLE_HANDOFF_SHARDS``).

Everything goes through :class:`bench.throttle.Budget` (Azure's targets divided by ``bench.throttle.SCALE``)
in front of Azurite, like ``bench/scaleout.py``. A hand-off here is the four messages the resolver projects
in its life (EventRequest, PendingHandoffResponse, HandoffCompletedRequest, ResolutionResponse), driven as
``azure.functions`` Service Bus messages through ``ResolverService.handle``. A message the resolver
reschedules (storage refused it) is delivered again after a short random back-off, as the broker delivers
the scheduled copy. The figure: hand-offs fully projected per second, and the entity writes per second as a
multiple of one partition's budget.

Run: ``.venv/bin/python -m bench.handoff_scaleout [seconds] [threads]`` (own Azurite).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.proxy import CountingProxy
from bench.throttle import SCALE, Budget


@dataclass
class _Run:
    handoffs: int = 0
    rescheduled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Copies:
    def schedule_copy(self, msg: Any, *, delay_s: float, throttle_retry_count: int) -> None:
        """The broker's scheduled copy: the bench delivers the message again itself."""


def _message(kind: str, endpoint: str, event_id: str, message_id: str, parent: str, **props: Any) -> Any:
    from azure.functions.servicebus import ServiceBusMessage

    request = kind in ("EventRequest", "HandoffCompletedRequest")
    application: dict[str, Any] = {
        "MessageType": kind,
        "EventId": event_id,
        "OriginatingMessageId": "self",
        "ParentMessageId": parent,
        "RetryCount": 0,
        "OriginatingFrom": "self",
        "To": endpoint if request else "Resolver",
        "From": ("Storefront" if kind == "EventRequest" else "Manager") if request else endpoint,
        "EventTypeId": "Billing.InvoiceCreated",
        **props,
    }
    body = {"EventContent": {"EventTypeId": "Billing.InvoiceCreated", "EventJson": '{"invoice": 42}'}}
    return ServiceBusMessage(
        body=json.dumps({**body, "ErrorContent": None}).encode(),
        message_id=message_id,
        application_properties=application,
        user_properties={},
        session_id="session-" + event_id[:4],
        correlation_id=parent,
        enqueued_time_utc=datetime.now(UTC),
        delivery_count=1,
    )


def _handoff(endpoint: str) -> list[Any]:
    event_id = uuid.uuid4().hex
    return [
        _message("EventRequest", endpoint, event_id, "req", "self"),
        _message(
            "PendingHandoffResponse",
            endpoint,
            event_id,
            "park",
            "req",
            HandoffReason="bench",
            ExternalJobId="job-" + event_id,
        ),
        _message("HandoffCompletedRequest", endpoint, event_id, "done", "park"),
        _message("ResolutionResponse", endpoint, event_id, "ok", "done"),
    ]


def _sustain(resolver: Any, endpoint: str, threads: int, seconds: float) -> _Run:
    from handoff.resolver import Outcome

    run = _Run()
    end = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < end:
            for msg in _handoff(endpoint):
                for _ in range(500):
                    outcome = resolver.handle(msg)
                    if outcome is Outcome.POISONED:
                        raise RuntimeError(f"poisoned {msg.message_id}")
                    if outcome is not Outcome.RESCHEDULED:
                        break
                    with run.lock:
                        run.rescheduled += 1
                    # The broker delivers the resolver's copy after a delay (production: 5 s); a short
                    # one here, still long enough that retries do not eat the budget they wait for.
                    time.sleep(random.uniform(0.5, 1.5))
            with run.lock:
                run.handoffs += 1

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return run


def measure(
    connection: str, table_endpoint: str, shards: int, seconds: float, threads: int
) -> dict[str, Any]:
    from common import runtime
    from handoff import service

    budget = Budget.scaled()
    proxy = CountingProxy(table_endpoint, budget=budget).start()
    os.environ["SETTLE_TABLES"] = proxy.connection_string(connection)
    os.environ["SETTLE_TABLE_PREFIX"] = "h" + uuid.uuid4().hex[:10]
    os.environ["SETTLE_HANDOFF_SHARDS"] = str(shards)
    runtime.reset(client_options={"retry_total": 0})
    service.reset()
    try:
        resolver = service.resolver_service()
        copies = _Copies()
        resolver.redelivery = lambda: copies
        endpoint = "Bench-" + uuid.uuid4().hex[:6]
        resolver.handle(_handoff(endpoint)[0])  # tables exist, endpoint registered (not timed)
        time.sleep(1.5)  # the budget's burst refills
        writes_before, started = budget.writes(), time.monotonic()
        run = _sustain(resolver, endpoint, threads, seconds)
        elapsed = time.monotonic() - started
        written = budget.writes() - writes_before
    finally:
        service.reset()
        runtime.reset()
        proxy.stop()
    return {
        "shards": shards,
        "handoffs_per_s": run.handoffs / elapsed,
        "x_partition": written / elapsed / budget.partition_per_s,
        "writes_per_handoff": written / max(1, run.handoffs),
        "rescheduled": run.rescheduled,
        "partition_budget": budget.partition_per_s,
        "account_budget": budget.account_per_s,
    }


def main() -> None:
    from devtools.azurite import Azurite

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    with Azurite(services=("table",)) as azurite:
        connection = azurite.connection_string
        table_endpoint = next(
            p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint")
        ).rsplit("/", 1)[0]
        for shards in (1, 4):
            r = measure(connection, table_endpoint, shards, seconds, threads)
            print(
                f"resolver on one endpoint, S={shards}: {r['handoffs_per_s']:.2f} hand-offs/s, "
                f"{r['x_partition']:.2f}x a partition's budget, {r['writes_per_handoff']:.1f} entity writes/"
                f"hand-off, {r['rescheduled']} reschedules; budget {r['partition_budget']:.0f}/"
                f"{r['account_budget']:.0f} entities/s (Azure's targets / {SCALE}); {threads} threads, "
                f"{seconds:.0f} s"
            )


if __name__ == "__main__":
    main()
