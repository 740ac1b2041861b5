"""Full hand-offs per second on **one** endpoint partition under the storage budget (issue 46's ratio).

:mod:`bench.handoff_scaleout` drives the resolver's four messages; a real hand-off also has its settlement
(the claim transaction and what follows the send) and the timer's tick (the reconciler and the counts'
fold), and they are charged to the same partition. Here each session (a worker thread) runs whole
hand-offs through the app's own services, behind :class:`bench.throttle.Budget` in front of Azurite, SDK
retries off:

1. EventRequest and PendingHandoffResponse through :meth:`ResolverService.handle` (a refused message comes
   back ``RESCHEDULED`` and its copy is delivered after the resolver's back-off x 0.1, as in
   :mod:`bench.handoff_scaleout`);
2. the settlement through :meth:`SettlementService.settle` (``complete``), retried as an agent retries a
   503: the same request after 0.5 s, 1 s, 2 s, ... (capped at 4 s); the control message it sends is
   captured (a loopback transport);
3. that HandoffCompletedRequest, then the endpoint's ResolutionResponse, through the resolver.

A timer thread runs the ``handoff_sweeper`` tick (:func:`handoff.service.timer_tick`, no timeout sweep)
every 5 s. The figure is full hand-offs completed per second in the window (S = 1: one partition's budget,
10 entities/s at :data:`bench.throttle.SCALE`; ``--scale 40``: 50 entities/s, more hand-offs per window).
It uses only the service entry points, so the same file
runs on an earlier commit for a before/after ratio: ``python -m bench.handoff_full --seconds 60`` in each
checkout (each starts its own Azurite), medians over runs taken in turn.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench.handoff_scaleout import _Broker, _resolver, handoff, message
from bench.throttle import SCALE, Budget
from devtools.azurite import Azurite
from handoff import service
from handoff.messages.contract import Coordinates, MessageType
from handoff.messages.transport import LoopbackTransport
from handoff.projection.resolver import Outcome
from handoff.settlement.settler import Settlement

SESSIONS = 24
TICK_S = 5.0


@dataclass
class _Run:
    done: list[float] = field(default_factory=list)  # monotonic instants a hand-off's last message applied
    settle_retries: int = 0
    rescheduled: int = 0
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def _deliver(resolver: Any, broker: _Broker, msg: Any, run: _Run, stop: threading.Event) -> bool:
    """Deliver ``msg`` until applied (the resolver's copy re-delivered after its back-off); False: stopped."""
    while True:
        outcome = resolver.handle(msg)
        if outcome is not Outcome.RESCHEDULED:
            if outcome not in (Outcome.APPLIED, Outcome.DUPLICATE):
                raise RuntimeError(f"{msg.message_id}: {outcome.name}")
            return True
        msg, pause = broker.take()
        with run.lock:
            run.rescheduled += 1
        if stop.wait(pause):
            return False


def _session(
    resolver: Any,
    settlement: Any,
    sent: dict[str, Any],
    broker: _Broker,
    endpoint: str,
    run: _Run,
    stop: threading.Event,
) -> None:
    try:
        while not stop.is_set():
            event_id = uuid.uuid4().hex
            request, park, _, _ = handoff(endpoint, event_id)
            if not (
                _deliver(resolver, broker, request, run, stop) and _deliver(resolver, broker, park, run, stop)
            ):
                return
            order = Settlement(
                kind=MessageType.HandoffCompletedRequest,
                endpoint_id=endpoint,
                coordinates=Coordinates(event_id=event_id, message_id=park.message_id),
                settled_by="bench",
                result={"erp": "ok"},
            )
            pause = 0.5
            while event_id not in sent:
                try:
                    settlement.settle(order)
                except (
                    Exception
                ):  # a refusal of storage (503 to the agent): the agent retries the same request
                    with run.lock:
                        run.settle_retries += 1
                    if stop.wait(pause):
                        return
                    pause = min(pause * 2, 4.0)
            completed = sent[event_id]  # as the resolver's trigger receives it (the loopback converted it)
            if not _deliver(resolver, broker, completed, run, stop):
                return
            # the endpoint's answer to the control message Settle sent
            resolution = message("ResolutionResponse", endpoint, event_id, "ok", str(completed.message_id))
            if not _deliver(resolver, broker, resolution, run, stop):
                return
            with run.lock:
                run.done.append(time.monotonic())
    except BaseException as exc:
        with run.lock:
            run.error = exc
        stop.set()


def _ticks(stop: threading.Event) -> None:
    while not stop.wait(TICK_S):
        try:
            service.timer_tick(sweeping=False, gauges=False)
        except Exception:  # a throttled tick: the next one folds what it left
            logging.getLogger("bench").debug("tick refused", exc_info=True)


def measure(
    connection: str, table_endpoint: str, *, seconds: float, scale: float = SCALE, warmup_s: float = 5.0
) -> dict[str, Any]:
    """Full hand-offs/s on one endpoint (S = 1) under Azure's budget / ``scale``, over ``seconds``."""
    budget = Budget.scaled(scale)
    with _resolver(connection, table_endpoint, budget, 1) as (resolver, broker, _prefix):
        sent: dict[str, Any] = {}

        def capture(msg: Any) -> None:
            event_id = str(msg.application_properties["EventId"])
            sent.setdefault(event_id, msg)

        service.use_transport(LoopbackTransport(capture))
        settlement = service.settlement_service()
        endpoint = "Full-" + uuid.uuid4().hex[:6]
        for msg in handoff(endpoint)[:1]:  # tables created, endpoint registered (once per instance)
            while resolver.handle(msg).name == "RESCHEDULED":
                time.sleep(0.2)
        run, stop = _Run(), threading.Event()
        threads = [
            threading.Thread(
                target=_session, args=(resolver, settlement, sent, broker, endpoint, run, stop), daemon=True
            )
            for _ in range(SESSIONS)
        ]
        threads.append(threading.Thread(target=_ticks, args=(stop,), daemon=True))
        opened = time.monotonic()
        for n, t in enumerate(threads):
            stop.wait(max(0.0, opened + warmup_s * n / len(threads) - time.monotonic()))
            t.start()
        stop.wait(max(0.0, opened + warmup_s - time.monotonic()))
        t0 = time.monotonic()
        stop.wait(seconds)
        t1 = time.monotonic()
        stop.set()
        for t in threads:
            t.join(timeout=60)
        if run.error is not None:
            raise RuntimeError(f"a session failed: {run.error!r}") from run.error
    done = sum(1 for at in run.done if t0 <= at < t1)
    return {
        "handoffs_per_s": done / (t1 - t0),
        "handoffs": done,
        "window_s": t1 - t0,
        "settle_retries": run.settle_retries,
        "rescheduled": run.rescheduled,
        "partition_per_s": budget.partition_per_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff_full", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="window per run (default %(default)s)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--scale", type=float, default=SCALE, help="Azure's targets divided by this (default %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with Azurite(services=("table",)) as azurite:
        connection = azurite.connection_string
        endpoint = next(
            p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint")
        ).rsplit("/", 1)[0]
        results = [
            measure(connection, endpoint, seconds=args.seconds, scale=args.scale) for _ in range(args.runs)
        ]
    rates = [r["handoffs_per_s"] for r in results]
    print(json.dumps({"median_handoffs_per_s": statistics.median(rates), "runs": results}), flush=True)


if __name__ == "__main__":
    main()
