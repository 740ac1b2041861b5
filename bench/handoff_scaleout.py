"""Scale-out of the resolver: hand-offs/s on **one** endpoint under the storage budget, for S = 1
(unsharded), 4 and 16 hand-off shards (``SETTLE_HANDOFF_SHARDS``). Part of the ``scaleout`` section.

Everything goes through :class:`bench.throttle.Budget` (Azure's per-partition and per-account targets
divided by ``bench.throttle.SCALE``) in front of Azurite, like the state figure in ``bench/scaleout.py``.
A hand-off is the four messages the resolver projects in its life (EventRequest, PendingHandoffResponse,
HandoffCompletedRequest, ResolutionResponse), driven as ``azure.functions`` Service Bus messages through
:meth:`ResolverService.handle`, the resolver function's entry point, with the SDK's own retries off. Each
worker thread is one session: it projects its hand-offs' messages in order. A message storage refused
(503 ``ServerBusy`` / 500 ``OperationTimedOut``) comes back as ``RESCHEDULED``: the resolver scheduled a
copy (``ThrottleRetryCount`` + 1) after its back-off (5 s, 10 s, 20 s, ...). The bench is the broker: the
session delivers that copy after the resolver's delay x :data:`REDELIVERY_TIME_SCALE`.

The figure: hand-offs/s as a multiple of **one partition's budget in hand-offs/s**, that is the partition
budget divided by what one hand-off costs in the budget's currency (entities read and written, measured
once with nothing refused, :func:`handoff_cost`). A read admitted before a transaction storage then
refuses is budget spent for nothing: it lowers the hand-offs/s, it is not hidden in a larger price.
Target ≥ 0.8 x S, capped by the account budget; :func:`judge` computes the verdict and names the bound
(the S partitions' budgets, the account's, or this machine when storage refused almost nothing).

Why the first version of this bench (4 threads, its own 0.5-1.5 s re-delivery) showed no scaling, measured
with ``--fixed`` (docs/benchmark.md, "Hand-off scale-out"): 4 sessions cannot keep 4 partitions busy (a
session waits for its copy > 90 % of the time; Little's law: sessions ≈ rate x time per message, waits
included); and more sessions re-delivering on a fixed short delay spend the partition's budget on the event
row reads of messages whose transaction is then refused (S = 1: the partition's whole budget admitted, a
third of it hand-offs). The resolver's own exponential back-off, honoured here, is what keeps the budget
for transactions. Every S is offered the same load per partition (:func:`sessions_for`: 24 sessions a
shard, at most 96, which keep the account's budget busy): overload costs a partition budget on reads of
messages refused afterwards (S = 1 with 64 sessions: 0.82-0.86 x, with 24: 0.94 x), so one load for all S
would make S = 1 look worse and the scaling better than it is.

Run alone: ``.venv/bin/python -m bench.handoff_scaleout [--seconds N] [--sessions N] [--shards S ...]
[--fixed LOW HIGH]`` (own Azurite), or in ``make bench BENCH_ARGS="--only scaleout"``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import resource
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

from bench.harness import Environment, Figure, log
from bench.proxy import CountingProxy
from bench.throttle import SCALE, Budget
from common import runtime
from devtools.azurite import Azurite
from handoff import service
from handoff.messages.contract import Prop, properties_of
from handoff.projection.resolver import Outcome
from handoff.storage.keys import EVENTS_TABLE, shard_of

SECTION = "scaleout"
SHARD_COUNTS = (1, 4, 16)
SESSIONS_PER_SHARD = 24  # concurrent sessions (worker threads) per shard: the same overload on each partition
MAX_SESSIONS = 96  # enough to keep the account's budget (10 partitions' worth) busy
REDELIVERY_TIME_SCALE = 0.1  # the broker delivers a scheduled copy after the resolver's delay x this
WINDOW_S = 25.0  # measured per S, after the warm-up
WARMUP_S = 3.0  # sessions run this long before the window opens (steady state, the burst spent)
MESSAGES_PER_HANDOFF = 4
TARGET_SHARE = 0.8  # of the ceiling: min(S x partition budget, account budget)
MACHINE_REFUSED = 0.01  # below this share of refused requests, storage was not what held the run back


# ------------------------------------------------------------------------------------------ verdict


def sessions_for(shards: int) -> int:
    """Sessions offered to an endpoint of ``shards`` shards: the same per partition, up to the account's."""
    return min(SESSIONS_PER_SHARD * shards, MAX_SESSIONS)


@dataclass(frozen=True)
class Judgement:
    target: float  # x one partition's budget
    verdict: str  # "met" / "missed"
    bound: str  # what limits this S: the budgets, or this machine


def judge(
    shards: int, multiple: float, refused_share: float, partition_budget: float, account_budget: float
) -> Judgement:
    """The verdict of one S, computed from what was measured: ``multiple`` (hand-offs/s as a multiple of
    one partition's budget) against 0.8 x min(S, account / partition); the bound is the account's budget
    when S partitions exceed it, else the S partition budgets, unless storage refused (almost) nothing and
    the run still fell short: then this machine's own limit held it back (the verdict stays missed)."""
    ceiling = min(shards * partition_budget, account_budget) / partition_budget
    target = TARGET_SHARE * ceiling
    if shards * partition_budget > account_budget:
        bound = f"account budget ({account_budget / partition_budget:g} partitions' worth)"
    else:
        bound = f"{shards} partition budget{'s' if shards > 1 else ''}"
    met = multiple >= target - 1e-9
    if not met and refused_share < MACHINE_REFUSED:
        bound = f"this machine (storage refused {refused_share:.1%} of requests)"
    return Judgement(round(target, 2), "met" if met else "missed", bound)


# -------------------------------------------------------------------------------------------- messages


def message(kind: str, endpoint: str, event_id: str, message_id: str, parent: str, **props: Any) -> Any:
    """One resolver message as the Functions host hands it over."""

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
        message_id=f"{message_id}-{event_id}",
        application_properties=application,
        user_properties={},
        session_id="session-" + event_id[:4],
        correlation_id=parent,
        enqueued_time_utc=datetime.now(UTC),
        delivery_count=1,
    )


def handoff(endpoint: str, event_id: str | None = None) -> list[Any]:
    """The four messages of one hand-off's life, in order."""
    event_id = event_id or uuid.uuid4().hex
    return [
        message("EventRequest", endpoint, event_id, "req", "self"),
        message(
            "PendingHandoffResponse",
            endpoint,
            event_id,
            "park",
            "req",
            HandoffReason="bench",
            ExternalJobId="job-" + event_id,
        ),
        message("HandoffCompletedRequest", endpoint, event_id, "done", "park"),
        message("ResolutionResponse", endpoint, event_id, "ok", "done"),
    ]


class _Broker:
    """The resolver's ``Redelivery``, played by the bench: the copy the resolver schedules (same message,
    ``ThrottleRetryCount`` + 1) is handed to the session that was delivering it, which delivers it after the
    delay the resolver asked for times :data:`REDELIVERY_TIME_SCALE` (5 s, 10 s, 20 s, ... become 0.5 s,
    1 s, 2 s, ...): the back-off the resolver asks for is what keeps an overloaded partition's budget for
    the transactions rather than for reads of messages that will be refused again."""

    def __init__(self) -> None:
        self.scheduled = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def schedule_copy(self, msg: Any, *, delay_s: float, throttle_retry_count: int) -> None:

        props = dict(properties_of(msg))
        props[Prop.THROTTLE_RETRY_COUNT] = throttle_retry_count
        copy = ServiceBusMessage(
            body=msg.get_body(),
            message_id=msg.message_id,
            application_properties=props,
            user_properties={},
            session_id=msg.session_id,
            correlation_id=msg.correlation_id,
            enqueued_time_utc=datetime.now(UTC),
            delivery_count=1,
        )
        self._local.copy = (copy, delay_s * REDELIVERY_TIME_SCALE)
        with self._lock:
            self.scheduled += 1

    def take(self) -> tuple[Any, float]:
        """The copy this thread's last rescheduled message left, and when (seconds) it is delivered."""
        copy: tuple[Any, float] = self._local.copy
        del self._local.copy
        return copy


# ------------------------------------------------------------------------------------------ the run


@dataclass
class _Sessions:
    """What the worker threads did: messages applied (with when), hand-off latencies, time spent."""

    applied: list[float] = field(default_factory=list)  # monotonic instants a message was applied
    handoffs: list[tuple[float, float]] = field(default_factory=list)  # (done at, first delivery -> done)
    rescheduled: int = 0
    poisoned: int = 0
    handling_s: float = 0.0  # inside ResolverService.handle
    waiting_s: float = 0.0  # waiting for the broker's copy
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def event_on(shard: int, shards: int) -> str:
    """A fresh event id whose rows live in ``shard`` of ``shards`` (drawn until one lands there)."""
    while True:
        event_id = uuid.uuid4().hex
        if shards == 1 or shard_of(event_id, shards) == shard:
            return event_id


def _session(
    resolver: Any,
    broker: _Broker,
    endpoint: str,
    home: tuple[int, int],
    run: _Sessions,
    stop: threading.Event,
    fixed: tuple[float, float] | None,
) -> None:
    """One session's hand-offs, one after another, every event in the session's ``home`` (shard, shards):
    the sessions are dealt to the shards in turn, so each partition is offered the same load every run
    (drawn at random, a short run could leave a shard with none)."""
    try:
        while not stop.is_set():
            started = time.monotonic()
            for msg in handoff(endpoint, event_on(*home)):
                while True:
                    t0 = time.monotonic()
                    outcome = resolver.handle(msg)
                    t1 = time.monotonic()
                    if outcome is not Outcome.RESCHEDULED:
                        break
                    copy, pause = broker.take()
                    if fixed is None:
                        msg = copy
                    else:  # the first version of this bench: the same message again, its own short wait
                        pause = random.uniform(*fixed)
                    with run.lock:
                        run.rescheduled += 1
                        run.handling_s += t1 - t0
                        run.waiting_s += pause
                    if stop.wait(pause):
                        return
                with run.lock:
                    run.handling_s += t1 - t0
                if outcome is Outcome.POISONED:  # its retry budget spent: stored in hopoison (counted)
                    with run.lock:
                        run.poisoned += 1
                    break
                if outcome is not Outcome.APPLIED:
                    raise RuntimeError(f"{msg.message_id}: {outcome.name}, expected APPLIED")
                with run.lock:
                    run.applied.append(t1)
            else:
                done = time.monotonic()
                with run.lock:
                    run.handoffs.append((done, done - started))
    except BaseException as exc:  # reported by the caller: a bench that hides a failure measures nothing
        with run.lock:
            run.error = exc
        stop.set()


@contextmanager
def _resolver(
    env_connection: str, table_endpoint: str, budget: Budget, shards: int
) -> Iterator[tuple[Any, _Broker, str]]:
    """The app's resolver on fresh tables behind the throttle, with ``shards`` hand-off shards and the SDK's
    own retries off (every refusal reaches the resolver, which reschedules, as deployed)."""

    saved = {k: os.environ.get(k) for k in ("SETTLE_TABLES", "SETTLE_TABLE_PREFIX", "SETTLE_HANDOFF_SHARDS")}
    proxy = CountingProxy(table_endpoint, budget=budget).start()
    os.environ["SETTLE_TABLES"] = proxy.connection_string(env_connection)
    prefix = os.environ["SETTLE_TABLE_PREFIX"] = "h" + uuid.uuid4().hex[:10]
    os.environ["SETTLE_HANDOFF_SHARDS"] = str(shards)
    os.environ.pop("SETTLE_HANDOFF_SHARDS_PREVIOUS", None)
    runtime.reset(client_options={"retry_total": 0})
    service.reset()
    broker = _Broker()
    try:
        resolver = service.resolver_service()
        resolver.redelivery = lambda: broker
        yield resolver, broker, prefix
    finally:
        service.reset()
        runtime.reset()
        proxy.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _events_entities(budget: Budget) -> Counter[str]:
    """Entities admitted so far per partition of the hand-off events table."""

    with budget._lock:
        return Counter(
            {pk: n for (_, table, pk), n in budget.admitted.items() if table.endswith(EVENTS_TABLE)}
        )


def handoff_cost(connection: str, table_endpoint: str, handoffs: int = 4) -> float:
    """Entities (read + written) one hand-off charges to the budget, with nothing refused: its price."""
    budget = Budget(partition_per_s=1e9, account_per_s=1e9, timeout_every=0)
    with _resolver(connection, table_endpoint, budget, 1) as (resolver, _, _):
        endpoint = "Bench-" + uuid.uuid4().hex[:6]
        for msg in handoff(endpoint):  # tables created, endpoint registered: once per instance
            resolver.handle(msg)
        before = sum(_events_entities(budget).values())
        for _ in range(handoffs):
            for msg in handoff(endpoint):
                resolver.handle(msg)
        return (sum(_events_entities(budget).values()) - before) / handoffs


@dataclass(frozen=True)
class Sample:
    """One S, measured over a window of steady state."""

    shards: int
    sessions: int
    prefix: str  # the tables' (straight on Azurite: what the run left in storage)
    endpoint: str
    window_s: float
    handoffs_per_s: float  # messages applied in the window / 4
    multiple: float  # hand-offs/s / (partition budget / cost)
    entities_per_s: float  # admitted in the endpoint's partitions
    partition_rates: tuple[float, ...]  # entities/s admitted per partition, highest first
    requests: int
    refused_503: int
    refused_500: int
    refused_scope: dict[str, int]
    p99_handoff_s: float | None
    rescheduled: int
    poisoned: int  # messages whose retry budget ran out (stored in hopoison, not projected)
    waiting_share: float  # of session time, waiting for the broker's copy
    cpu_cores: float  # this process's CPU seconds per second of the window


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(
    connection: str,
    table_endpoint: str,
    shards: int,
    *,
    seconds: float,
    sessions: int | None = None,
    cost: float,
    budget: Budget | None = None,
    warmup_s: float = WARMUP_S,
    fixed_redelivery: tuple[float, float] | None = None,
) -> Sample:
    """Drive ``sessions`` sessions on one endpoint for ``warmup_s`` + ``seconds``; figures from the window.

    ``fixed_redelivery`` (seconds, uniform) replaces the resolver's requested back-off: how this bench first
    re-delivered, kept to show what ignoring the back-off costs (``main``'s ``--fixed``)."""
    budget = budget or Budget.scaled()
    sessions = sessions or sessions_for(shards)
    with _resolver(connection, table_endpoint, budget, shards) as (resolver, broker, prefix):
        endpoint = "Bench-" + uuid.uuid4().hex[:6]
        # Tables created and the endpoint registered (once per instance, not part of the figure).
        for msg in handoff(endpoint)[:1]:
            while resolver.handle(msg).name == "RESCHEDULED":
                time.sleep(0.2)
        run, stop = _Sessions(), threading.Event()
        pool = [
            threading.Thread(
                target=_session,
                args=(resolver, broker, endpoint, (n % shards, shards), run, stop, fixed_redelivery),
                daemon=True,
            )
            for n in range(sessions)
        ]
        # Sessions start spread over the warm-up: started at one instant, the resolver's back-off
        # (the same 5 s, 10 s, ... for all) would keep them in step, refused together in waves.
        opened = time.monotonic()
        for n, t in enumerate(pool):
            stop.wait(max(0.0, opened + warmup_s * n / sessions - time.monotonic()))
            t.start()
        stop.wait(max(0.0, opened + warmup_s - time.monotonic()))

        def snapshot() -> tuple[float, float, Counter[str], int, Counter[str], int, float, float]:
            with run.lock:
                spent = (run.handling_s, run.waiting_s)
            with budget._lock:
                refused, requests = Counter(budget.refused), budget.requests
            return (time.monotonic(), _cpu(), _events_entities(budget), requests, refused, 0, *spent)

        t0, cpu0, ent0, req0, ref0, _, hand0, wait0 = snapshot()
        resched0 = run.rescheduled
        stop.wait(seconds)
        t1, cpu1, ent1, req1, ref1, _, hand1, wait1 = snapshot()
        resched1 = run.rescheduled
        stop.set()
        for t in pool:
            t.join(timeout=60)
        if run.error is not None:
            raise RuntimeError(f"a session failed: {run.error!r}") from run.error
    window = t1 - t0
    applied = sum(1 for at in run.applied if t0 <= at < t1)
    handoffs_per_s = applied / MESSAGES_PER_HANDOFF / window
    rates = sorted(((ent1[pk] - ent0[pk]) / window for pk in ent1), reverse=True)
    refused = ref1 - ref0
    total_refused = sum(refused.values())
    every = budget.timeout_every
    # every n-th refusal (counted over the budget's life) is a 500 OperationTimedOut
    timeouts = (sum(ref1.values()) // every - sum(ref0.values()) // every) if every else 0
    busy = (hand1 - hand0) + (wait1 - wait0)
    return Sample(
        shards=shards,
        sessions=sessions,
        prefix=prefix,
        endpoint=endpoint,
        window_s=window,
        handoffs_per_s=handoffs_per_s,
        multiple=handoffs_per_s * cost / budget.partition_per_s,
        entities_per_s=sum(rates),
        partition_rates=tuple(rates),
        requests=req1 - req0,
        refused_503=total_refused - int(timeouts),
        refused_500=int(timeouts),
        refused_scope=dict(refused),
        p99_handoff_s=_p99([d for at, d in run.handoffs if t0 <= at < t1]),
        rescheduled=resched1 - resched0,
        poisoned=run.poisoned,
        waiting_share=(wait1 - wait0) / busy if busy else 0.0,
        cpu_cores=(cpu1 - cpu0) / window,
    )


def figure(sample: Sample, cost: float, partition_budget: float, account_budget: float) -> Figure:
    refused_share = (sample.refused_503 + sample.refused_500) / sample.requests if sample.requests else 0.0
    judged = judge(sample.shards, sample.multiple, refused_share, partition_budget, account_budget)
    rates = sample.partition_rates
    spread = f"{rates[0]:.1f}-{rates[-1]:.1f}" if rates else "-"
    p99 = "-" if sample.p99_handoff_s is None else f"{sample.p99_handoff_s:.1f} s"
    suffix = " (unsharded baseline)" if sample.shards == 1 else ""
    return Figure(
        section=SECTION,
        name=f"resolver hand-offs on one endpoint, S={sample.shards}{suffix}",
        settle=round(sample.multiple, 2),
        baseline=judged.target,
        ratio=None,
        target=f"≥ {judged.target:g}x one partition's budget",
        verdict="met" if judged.verdict == "met" else "missed",
        unit="x partition",
        note=(
            f"{sample.handoffs_per_s:.2f} hand-offs/s (one partition's budget = "
            f"{partition_budget / cost:.2f}/s at {cost:.1f} entities a hand-off); "
            f"{sample.entities_per_s:.1f} entities/s over {len(rates)} partition(s), {spread}/s each; "
            f"p99 hand-off {p99} (4 messages, "
            f"re-deliveries at {REDELIVERY_TIME_SCALE:g} x the resolver's delays); "
            f"{refused_share:.1%} of {sample.requests} requests refused "
            f"({sample.refused_503} x 503 ServerBusy, {sample.refused_500} x 500 OperationTimedOut; "
            f"scope {sample.refused_scope}); {sample.rescheduled} reschedules, {sample.poisoned} poisoned; "
            f"sessions waited for a copy {sample.waiting_share:.0%} of the time; "
            f"bench process {sample.cpu_cores:.2f} CPU cores; "
            f"bound: {judged.bound}; {sample.sessions} sessions, {sample.window_s:.0f} s window; budget "
            f"{partition_budget:g}/{account_budget:g} entities/s (Azure's targets / {SCALE})"
        ),
    )


def figures(
    connection: str,
    table_endpoint: str,
    *,
    seconds: float,
    shard_counts: tuple[int, ...] = SHARD_COUNTS,
    sessions: int | None = None,
    warmup_s: float = WARMUP_S,
    fixed_redelivery: tuple[float, float] | None = None,
    report: Callable[[str], None] = log,
) -> list[Figure]:
    """One figure per S, measured one after the other against the same Azurite and budget."""
    budget = Budget.scaled()
    cost = handoff_cost(connection, table_endpoint)
    out = []
    for shards in shard_counts:
        sample = measure(
            connection,
            table_endpoint,
            shards,
            seconds=seconds,
            sessions=sessions,
            cost=cost,
            warmup_s=warmup_s,
            fixed_redelivery=fixed_redelivery,
        )
        out.append(figure(sample, cost, budget.partition_per_s, budget.account_per_s))
        report(
            f"scaleout hand-offs S={shards}: {sample.handoffs_per_s:.2f}/s = {sample.multiple:.2f}x a "
            f"partition; {sample.entities_per_s:.1f} entities/s; refused "
            f"{sample.refused_503 + sample.refused_500}/{sample.requests}; cpu {sample.cpu_cores:.2f}"
        )
    return out


def run(env: Environment) -> list[Figure]:
    """The hand-off half of the ``scaleout`` section (about 2 minutes; the smoke run about 15 s)."""
    if env.smoke:
        return figures(env.connection, env.table_endpoint(), seconds=2.0, shard_counts=(1, 4), warmup_s=1.0)
    return figures(env.connection, env.table_endpoint(), seconds=WINDOW_S)


def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(prog="python -m bench.handoff_scaleout", description=__doc__)
    parser.add_argument("--seconds", type=float, default=WINDOW_S, help="window per S (default %(default)s)")
    parser.add_argument("--sessions", type=int, help="for every S (default: 24 a shard, at most 96)")
    parser.add_argument("--shards", type=int, nargs="*", default=list(SHARD_COUNTS))
    parser.add_argument(
        "--fixed", type=float, nargs=2, metavar=("LOW", "HIGH"), help="re-deliver after LOW-HIGH s instead"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the resolver's warning for each reschedule
    with Azurite(services=("table",)) as azurite:
        connection = azurite.connection_string
        endpoint = next(
            p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint")
        ).rsplit("/", 1)[0]
        found = figures(
            connection,
            endpoint,
            seconds=args.seconds,
            shard_counts=tuple(args.shards),
            sessions=args.sessions,
            fixed_redelivery=tuple(args.fixed) if args.fixed else None,
            report=lambda m: print(m, flush=True),
        )
        for f in found:
            print(f"{f.name}: {f.settle}x (target {f.target}) {f.verdict}\n  {f.note}", flush=True)


if __name__ == "__main__":
    main()
