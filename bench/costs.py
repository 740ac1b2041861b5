"""Storage cost at the wire: one full hand-off and one state item, step by step.

What a team pays for is the entities written (a partition's budget is entities per second,
reference/scale-targets.md), the requests (transactions) and the bytes. Counted by the counting proxy
(``bench.proxy``) between the app and Azurite, never by Settle's own word: every request of every thread,
each ``$batch`` split into its operations, the entities a write applied (by kind), the entities read from
the answers, the bytes sent and received. Each step runs alone between two quiet waits, through the app's
entry points (the resolver function, the HTTP functions, the sweeper timer).

**One full hand-off** (:data:`HANDOFF`): an EventRequest projected, its PendingHandoffResponse projected,
an agent's ``next``, the HTTP settle ``complete`` (its control message captured, not projected), that
HandoffCompletedRequest projected, the endpoint's ResolutionResponse projected, then the next sweeper
tick (which folds the hand-off's count deltas). Measured on a warm process: the same endpoint's first
hand-off (tables created, layouts read, the endpoint registered) runs first and is reported beside it.

**One state item** (:data:`STATE_ITEM`): a lock on a new key, the fenced set to Processed, a second
caller's ``exists``. The item is alone in a new partition, so its lock also prepares the expiry minute
there (:data:`STATE_PREPARATION`, shared by every item of that instance, partition and minute); the rows of
that preparation are told apart by their keys and shown as their own row.

The documented entity writes per step are kept here, once: the figures are judged against them,
``tests/bench/test_costs.py`` asserts them on a full hand-off run against Azurite, and docs/benchmark.md
renders them (``python -m bench.report``). A change that adds a write fails that test until this table,
and the reason for the row, change with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness import App, Environment, Figure, missing, verdict_equal
from bench.proxy import CountingProxy, Seen, Tally, Write, tally
from bench.workload import State, event_messages, expect, new_key, nimbus_message

SECTION = "wire cost"
ENDPOINT = "Billing"


@dataclass(frozen=True)
class Step:
    """One step and the entity writes it is documented to cost, with the rows that make them."""

    name: str
    writes: int
    rows: str


HANDOFF: tuple[Step, ...] = (
    Step(
        "EventRequest projected",
        6,
        "one transaction: `ev|…|m` history row, `ev|…|e` event row, `sd|Pending|` listing row (3; Pending "
        "is counted from it, no delta, ADR-0022); `hoids` find index: event, session and message id (3 "
        "inserts; find by session reads them, ADR-0022)",
    ),
    Step(
        "PendingHandoffResponse projected",
        7,
        "one transaction: history row, event row replaced, `hq|` queue (carrying ExpectedBy: overdue reads "
        "it, no `ex|` row, ADR-0022), the `sd|` listing row moved (delete, insert) (5); `hoids`: message "
        "and job id (2; the job lookup reads them, ADR-0022)",
    ),
    Step("an agent's next", 0, "reads only: the queue's first row, the event row"),
    Step(
        "HTTP settle complete",
        3,
        "the claim transaction: `ev|…|c` claim (the outbox; the audit is rendered from it, no `ev|…|a` row, "
        "ADR-0022), `hq|` marked (merge; its `ReconcileAt` is when the reconciler first looks, no `rc|` "
        "row, ADR-0022) (2); after the send: the claim marked sent (merge) (1)",
    ),
    Step(
        "HandoffCompletedRequest projected",
        6,
        "one transaction: history row, event row replaced, `hq|` deleted, the `sd|` listing row moved (5); "
        "`hoids`: message id (1)",
    ),
    Step(
        "ResolutionResponse projected",
        6,
        "one transaction: history row, event row replaced, the listing row moved from `sd|Pending|` to "
        "`sd|Completed|`, the `ct|d|` delta `+1 Completed` (5); `hoids`: message id (1)",
    ),
    Step(
        "the next sweeper tick",
        2,
        "the fold: the hand-off's `ct|d|` delta deleted and the `ct|0` snapshot replaced, one "
        "transaction (the snapshot's write is shared by every hand-off folded in the same tick)",
    ),
)
STATE_ITEM: tuple[Step, ...] = (
    Step(
        "lock (new key)",
        2,
        "one transaction: the head, the minute marker merged with the lock's entry `L{lockId}` (ADR-0021)",
    ),
    Step(
        "set Processed with the token",
        2,
        "one transaction: the head replaced, the history row of the version it replaced (ADR-0021)",
    ),
    Step("exists (a second caller)", 0, "one point read of the head"),
)
STATE_PREPARATION = Step(
    "the lock's expiry minute prepared (once per instance, partition and minute)",
    2,
    "the minute's marker inserted in the record's partition, its level-1 row in `statelocks` written",
)
# Context beside the hand-off's total (documented, not measured here): NimBus on Cosmos DB keeps a hand-off
# in about 9 documents, the floor of a design that keeps the messages, the event and exactly-once
# settlement in Table Storage, and the bound of one that also keeps every feature issue 46 lists.
NIMBUS_DOCUMENTS = Step(
    "NimBus on Cosmos DB: documents per hand-off",
    9,
    "a message and an event document per message (4 + 4), one audit; no claim (two concurrent "
    "settlements can both publish), listings from Cosmos's automatic index",
)
FLOOR = Step(
    "floor: entity writes per hand-off",
    9,
    "a history row per message, whose insert is the duplicate check (4); the event row inserted, then "
    "replaced per message (4); the claim, the outbox that makes the control message exactly once, its "
    "audit rendered from it (1); every listing, count and lookup served by reads",
)
FEATURE_BOUND = Step(
    "lower bound with every feature kept: entity writes per hand-off",
    25,
    "the floor (9) + find by any id, 7 ids each in a partition chosen by the id (7) + the listing by "
    "change, inserted and moved at each of 3 changes because a key cannot change (7) + the oldest-first "
    "agent queue, inserted and deleted (2); before exact closed counts, the queue's claim mark and the "
    '`sent` mark (ADR-0022, "The lower bound")',
)


@dataclass(frozen=True)
class Measured:
    """What each step cost at the wire, in order."""

    steps: tuple[tuple[str, Tally], ...]

    def total(self, names: tuple[str, ...] | None = None) -> Tally:
        out = Tally()
        for name, cost in self.steps:
            if names is None or name in names:
                out = out.add(cost)
        return out

    def writes(self) -> dict[str, int]:
        return {name: cost.writes for name, cost in self.steps}


def _window(proxy: CountingProxy, quiet_s: float, call: Callable[[], Any]) -> list[Seen]:
    """The requests one call causes: drain, run it, drain again (its background work counted)."""
    proxy.wait_quiet(quiet_s)
    start = proxy.count
    call()
    proxy.wait_quiet(quiet_s)
    return proxy.since(start)


def _counted(proxy: CountingProxy, quiet_s: float, steps: list[tuple[str, Callable[[], Any]]]) -> Measured:
    """Each step alone, tallied."""
    return Measured(tuple((name, tally(_window(proxy, quiet_s, call))) for name, call in steps))


def handoff(app: App, proxy: CountingProxy, *, quiet_s: float, endpoint: str = ENDPOINT) -> Measured:
    """One full hand-off on ``endpoint`` (nothing else parked there), step by step (:data:`HANDOFF`)."""
    from handoff import service
    from handoff.messages.transport import LoopbackTransport

    sent: list[Any] = []
    service.use_transport(LoopbackTransport(sent.append))  # the control message is captured, not projected
    messages = [m for _, m in event_messages(endpoint, int(uuid.uuid4().int % 90_000))]
    request, park = messages[0], messages[1]
    event_id = request.application_properties["EventId"]

    def next_() -> None:
        answer = expect(app.http("handoff_next", route={"endpointId": endpoint}), 200, what="handoff_next")
        if answer.json["coordinates"]["eventId"] != event_id:
            raise RuntimeError(f"next answered another hand-off: {answer.json['coordinates']}")

    def complete() -> None:
        body = {
            "endpointId": endpoint,
            "coordinates": {"eventId": event_id, "messageId": park.message_id},
            "result": {"erp": "ok"},
            "settledBy": "bench",
        }
        expect(app.http("handoff_complete", body), 202, what="handoff_complete")
        if len(sent) != 1:
            raise RuntimeError(f"the settlement sent {len(sent)} control messages")

    def resolution() -> Any:
        return nimbus_message(
            "ResolutionResponse",
            event_id=event_id,
            message_id=uuid.uuid4().hex,
            endpoint=endpoint,
            session_id=request.session_id,
            parent_message_id=sent[0].message_id,
        )

    calls: list[Callable[[], Any]] = [
        lambda: app.message("resolver", request),
        lambda: app.message("resolver", park),
        next_,
        complete,
        lambda: app.message("resolver", sent[0]),
        lambda: app.message("resolver", resolution()),
        lambda: app.timer("handoff_sweeper"),
    ]
    return _counted(proxy, quiet_s, [(s.name, c) for s, c in zip(HANDOFF, calls, strict=True)])


def is_preparation(write: Write) -> bool:
    """A row of an expiry minute's preparation: its level-1 row, or its marker's insert."""
    from state.keys import is_marker

    return write.table.endswith("statelocks") or (write.kind == "insert" and is_marker(write.row_key))


def state_item(app: App, proxy: CountingProxy, *, quiet_s: float, entity_id: int) -> Measured:
    """Lock a new key of node ``entity_id``, set it Processed with the token, then ``exists``
    (:data:`STATE_ITEM`); the requests that only prepare the lock's expiry minute are counted apart, as
    :data:`STATE_PREPARATION`."""
    state = State(app)
    key = dict(new_key(prefix="cost"), entityId=entity_id)
    token: list[str] = []
    lock = _window(proxy, quiet_s, lambda: token.append(state.acquire(key)))
    preparing = [r for r in lock if r.written and all(is_preparation(w) for w in r.written)]
    rest = _counted(
        proxy,
        quiet_s,
        [
            (STATE_ITEM[1].name, lambda: expect(state.set(key, token[0]), 200, what="state_set")),
            (STATE_ITEM[2].name, lambda: expect(state.exists(key), 200, what="state_exists")),
        ],
    )
    return Measured(
        (
            (STATE_ITEM[0].name, tally([r for r in lock if r not in preparing])),
            *rest.steps,
            (STATE_PREPARATION.name, tally(preparing)),
        )
    )


def _describe(cost: Tally) -> str:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(cost.written.items())) or "none"
    return (
        f"{cost.requests} requests, {cost.writes} entities written ({kinds}), {cost.read} read, "
        f"{cost.sent:,} bytes sent, {cost.received:,} received"
    )


def _step_figure(prefix: str, step: Step, cost: Tally) -> Figure:
    return Figure(
        section=SECTION,
        name=f"{prefix}: {step.name}",
        settle=cost.writes,
        baseline=step.writes,
        ratio=None,
        target=f"= {step.writes} documented",
        verdict=verdict_equal(cost.writes, step.writes),
        unit="entities",
        note=_describe(cost),
    )


def _total_figure(name: str, cost: Tally, documented: int, note: str = "") -> Figure:
    return Figure(
        section=SECTION,
        name=name,
        settle=cost.writes,
        baseline=documented,
        ratio=None,
        target=f"= {documented} documented",
        verdict=verdict_equal(cost.writes, documented),
        unit="entities",
        note="; ".join(x for x in (_describe(cost), note) if x),
    )


def _context(step: Step, measured: Tally) -> Figure:
    return Figure(
        section=SECTION,
        name=step.name,
        settle=measured.writes,
        baseline=step.writes,
        ratio=measured.writes / step.writes,
        target="(context)",
        verdict="info",
        unit="entities",
        note=f"Settle's entity writes per full hand-off (sweeper tick included) beside {step.rows}",
    )


def run(env: Environment) -> list[Figure]:
    needed = ("resolver", "handoff_next", "handoff_complete", "handoff_sweeper", "state_lock", "state_set")
    if not all(env.app.has(f) for f in needed):
        return [missing(SECTION, "full hand-off", "", "a hand-off or state function is not registered")]
    quiet_s = env.sizes.roundtrip_quiet_s
    with CountingProxy(env.table_endpoint()) as proxy:
        env.use_fresh_prefix(connection=proxy.connection_string(env.connection))
        first = handoff(env.app, proxy, quiet_s=quiet_s)  # the process's first: tables, layouts, endpoint
        warm = handoff(env.app, proxy, quiet_s=quiet_s)
        state_item(env.app, proxy, quiet_s=quiet_s, entity_id=4_200)  # first use of the state tables
        item = state_item(env.app, proxy, quiet_s=quiet_s, entity_id=4_201)  # a new partition
        env.use_fresh_prefix()
    handoff_steps = tuple(s.name for s in HANDOFF[:-1])
    figures = [
        _step_figure("hand-off", step, cost) for step, (_, cost) in zip(HANDOFF, warm.steps, strict=True)
    ]
    figures += [
        _total_figure(
            "full hand-off (6 steps)",
            warm.total(handoff_steps),
            sum(s.writes for s in HANDOFF[:-1]),
        ),
        _total_figure(
            "full hand-off + the next sweeper tick",
            warm.total(),
            sum(s.writes for s in HANDOFF),
            note=f"the process's first hand-off: {_describe(first.total())}",
        ),
        _context(NIMBUS_DOCUMENTS, warm.total()),
        _context(FLOOR, warm.total()),
        _context(FEATURE_BOUND, warm.total()),
    ]
    documented_state = (*STATE_ITEM, STATE_PREPARATION)
    figures += [
        _step_figure("state item", step, cost)
        for step, (_, cost) in zip(documented_state, item.steps, strict=True)
    ]
    figures.append(
        _total_figure(
            "state item (lock, set, exists), its minute's preparation included",
            item.total(),
            sum(s.writes for s in documented_state),
        )
    )
    env.details["wire_cost"] = {
        "handoff": {name: cost.as_dict() for name, cost in warm.steps},
        "first_handoff": {name: cost.as_dict() for name, cost in first.steps},
        "state_item": {name: cost.as_dict() for name, cost in item.steps},
    }
    return figures
