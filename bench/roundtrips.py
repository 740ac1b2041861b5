"""Figure 1: Table round trips of every state operation, resolver message type and settlement.

Counted at the wire: the app talks to Azurite through a counting proxy (``bench.proxy``), so every
request an operation causes is seen, on any thread (work left to a background thread included), retries
included. For each case N fresh records are prepared (not counted), background work is drained, the N
operations run back to back, background work is drained again, and what Azurite received is divided by
N: work that is batched across operations is amortised over them. The median over the rounds is shown
beside the documented minimum (the table below is the one place it is kept; docs/benchmark.md renders
it from here). "Other instance" cases run on a process-wide state rebuilt after the preparation (no
cached heads), after one uncounted operation of the same kind has created the clients and tables.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness import Environment, Figure, Verdict, median, missing, ratio, verdict_at_most
from bench.proxy import CountingProxy, Seen
from bench.workload import State, Unexpected, event_messages, expect, new_key
from common import runtime

SECTION = "round trips"

# The documented minimum Table requests per operation (docs/tables.md): the one table the figures and
# the docs use. A lock's expiry-index write is part of what an operation causes, so it is not excused.
MINIMUM: dict[str, int] = {
    "exists": 1,
    "get": 1,
    "lock (new key)": 1,
    # Known to this instance (it wrote the head): a refusal needs only the read that confirms it, a
    # re-acquisition only its transaction (docs/tables.md).
    "lock (refused: held)": 1,
    "lock (refused: held, other instance)": 2,
    "lock (Failed key)": 1,
    "lock (Failed key, other instance)": 2,
    "set (fenced, with token)": 1,
    "set (without token)": 2,
    "release (fenced, with token)": 1,
    "release (without token)": 2,
    "upsert": 2,
    "lock/extend (with token)": 1,
    # The resolver reads the event row once and writes history + event row in one transaction; beside the
    # read, one insert into the lookup index (hoids) per id this process has not indexed yet: the message
    # id, and the event id and session id with the first message, the job id with the park.
    "resolver: EventRequest": 5,
    "resolver: PendingHandoffResponse": 4,
    "resolver: HandoffCompletedRequest": 3,
    "resolver: ResolutionResponse": 3,
    # Read the event row 1 + one transaction (the claim, its own audit; the queue mark, which says when the
    # reconciler first looks) 1, then the send; over SETTLE_LOOPBACK=true the send is the in-process
    # projection's 3 (with its message id's index insert).
    "settlement (handoff_complete, loopback)": 6,
}
WHY = {
    "exists": "one point read of the head",
    "get": "one point read of the head",
    "lock (new key)": "one insert of the head",
    "lock (refused: held)": "the head is known to this instance: one read that confirms the refusal",
    "lock (refused: held, other instance)": "one insert that conflicts, one read that says why",
    "lock (Failed key)": "the head is known to this instance: one conditional transaction",
    "lock (Failed key, other instance)": "one read of the head, one conditional replace",
    "set (fenced, with token)": "one transaction (head + history row) conditional on the token's ETag",
    "set (without token)": "one read of the head, one transaction (head + history row)",
    "release (fenced, with token)": "one transaction conditional on the token's ETag",
    "release (without token)": "one read of the head, one transaction",
    "upsert": "one read of the head, one transaction",
    "lock/extend (with token)": "one transaction conditional on the token's ETag",
    "resolver: EventRequest": (
        "one point read, one transaction (history row + event row); beside the read, the index inserts of "
        "its message, event and session id"
    ),
    "resolver: PendingHandoffResponse": (
        "one point read, one transaction (+ queue and job index rows); the index inserts of its message "
        "and job id"
    ),
    "resolver: HandoffCompletedRequest": (
        "one point read, one transaction (+ index rows removed); the index insert of its message id"
    ),
    "resolver: ResolutionResponse": "one point read, one transaction; the index insert of its message id",
    "settlement (handoff_complete, loopback)": (
        "read, the claim transaction (outbox + audit), the loopback projection's 2, "
        "the transaction that marks the claim sent"
    ),
}
# The key fence (ADR-0020): a key created while an earlier layout is listed is first claimed in that layout's
# partition (one insert per earlier partition), in place of the probe read such a creation made before.
FENCED: dict[str, int] = {
    "lock (new key), an earlier layout listed": 3,
    "resolver: EventRequest, an earlier layout listed": 7,
    "lock (refused: held, other instance), an earlier layout listed": 1,
}
FENCED_WHY = {
    "lock (refused: held, other instance), an earlier layout listed": (
        "a key created after the change, locked by another instance: one read where it is created now "
        "finds it (no claim, no probe); before the fence (dbde0bc): the same read"
    ),
    "lock (new key), an earlier layout listed": (
        "a read where the key is created now (a key already there costs nothing more), the claim in the "
        "earlier layout's partition (insert-only), the head's insert; before the fence (dbde0bc): 3, a "
        "probe read of both partitions and the insert"
    ),
    "resolver: EventRequest, an earlier layout listed": (
        "the EventRequest's 5, the event row looked for in the earlier partition (a miss), and the claim "
        "there; before the fence (dbde0bc): 8, both partitions probed twice and no claim"
    ),
}
# Reads of the layout row and the expiry index's level 1 (``statelocks``, GET): the layouts of the fenced
# figures refresh every 0.2 s in the background, which would land inside the counted window.
LAYOUT_READS = "statelocks"
LAYOUT_REREADS = "layout re-reads (background, kept out of the figures above)"


def is_layout_read(request: Seen) -> bool:
    """The background re-read of the recorded layouts (``common/layouts.py``): every instance makes one
    once its copy is ``RefreshSeconds`` old, whatever operation it happens to run beside, so it is counted
    as its own figure, never inside an operation's window."""
    return request.method == "GET" and "~layout" in request.query


RESOLVER_TYPES = ("EventRequest", "PendingHandoffResponse", "HandoffCompletedRequest", "ResolutionResponse")
PACED_INTERVAL_S = 0.3


@dataclass(frozen=True)
class Case:
    """One operation: ``prepare`` sets up one record (not counted) and returns the call that is counted."""

    name: str
    function: str
    prepare: Callable[[], Callable[[], Any]]
    other_instance: bool = False


def _state_cases(state: State) -> list[Case]:
    def processed_key() -> dict[str, Any]:
        key = new_key(prefix="rt")
        state.processed(key)
        return key

    def exists() -> Callable[[], Any]:
        key = processed_key()
        return lambda: expect(state.exists(key), 200, what="state_exists")

    def get() -> Callable[[], Any]:
        key = processed_key()
        return lambda: expect(state.get(key), 200, what="state_get")

    def lock_new() -> Callable[[], Any]:
        key = new_key(prefix="rt")
        return lambda: expect(state.lock(key), 200, what="state_lock")

    def lock_held() -> Callable[[], Any]:
        key = new_key(prefix="rt")
        state.acquire(key)
        return lambda: expect(state.lock(key), 200, 409, 423, what="state_lock (held)")

    def lock_failed() -> Callable[[], Any]:
        key = new_key(prefix="rt")
        expect(state.release(key, state.acquire(key)), 200, 204, what="state_release")
        return lambda: expect(state.lock(key), 200, what="state_lock (Failed)")

    def fenced(op: Callable[[dict[str, Any], str | None], Any], with_token: bool) -> Callable[[], Any]:
        key = new_key(prefix="rt")
        token = state.acquire(key)
        return lambda: expect(op(key, token if with_token else None), 200, 204, what=op.__name__)

    def upsert() -> Callable[[], Any]:
        key = processed_key()
        return lambda: expect(state.upsert(key), 200, 204, what="state_upsert")

    def extend() -> Callable[[], Any]:
        key = new_key(prefix="rt")
        token = state.acquire(key)
        return lambda: expect(state.extend(key, token), 200, 204, what="state_lock_extend")

    return [
        Case("exists", "state_exists", exists),
        Case("get", "state_get", get),
        Case("lock (new key)", "state_lock", lock_new),
        Case("lock (refused: held)", "state_lock", lock_held),
        Case("lock (refused: held, other instance)", "state_lock", lock_held, other_instance=True),
        Case("lock (Failed key)", "state_lock", lock_failed),
        Case("lock (Failed key, other instance)", "state_lock", lock_failed, other_instance=True),
        Case("set (fenced, with token)", "state_set", lambda: fenced(state.set, True)),
        Case("set (without token)", "state_set", lambda: fenced(state.set, False)),
        Case("release (fenced, with token)", "state_release", lambda: fenced(state.release, True)),
        Case("release (without token)", "state_release", lambda: fenced(state.release, False)),
        Case("upsert", "state_upsert", upsert),
        Case("lock/extend (with token)", "state_lock_extend", extend),
    ]


def _resolver_cases(env: Environment) -> list[Case]:
    """Each message type on events whose earlier messages were delivered in preparation."""

    def prepared(position: int) -> Callable[[], Callable[[], Any]]:
        def prepare() -> Callable[[], Any]:
            messages = event_messages("Billing", 900_000 + int(uuid.uuid4().int % 90_000))
            for _, message in messages[:position]:
                env.app.message("resolver", message)
            return lambda: env.app.message("resolver", messages[position][1])

        return prepare

    return [Case(f"resolver: {t}", "resolver", prepared(i)) for i, t in enumerate(RESOLVER_TYPES)]


def _settlement_case(env: Environment) -> Case:
    def prepare() -> Callable[[], Any]:
        messages = event_messages("Billing", 950_000 + int(uuid.uuid4().int % 40_000))
        for _, message in messages[:2]:  # request, then park
            env.app.message("resolver", message)
        park = messages[1][1]
        props = park.application_properties
        body = {
            "endpointId": "Billing",
            "coordinates": {
                "eventId": props["EventId"],
                "sessionId": park.session_id,
                "messageId": park.message_id,
                "eventTypeId": props["EventTypeId"],
                "correlationId": park.correlation_id,
                "originatingMessageId": messages[0][1].message_id,
            },
            "result": {"erp": "ok", "ref": uuid.uuid4().hex[:6]},
            "settledBy": "bench",
        }
        return lambda: expect(env.app.http("handoff_complete", body), 202, what="handoff_complete")

    return Case("settlement (handoff_complete, loopback)", "handoff_complete", prepare)


class WireCount:
    """Runs cases through the proxy: prepare, drain, count N operations, drain, divide."""

    def __init__(self, env: Environment, proxy: CountingProxy) -> None:
        self.env = env
        self.proxy = proxy
        self.quiet_s = env.sizes.roundtrip_quiet_s
        self.seen: dict[str, dict[str, int]] = {}
        self.layout_reads = 0  # background layout re-reads that landed in a counted window (left out)
        self.windows = 0
        self.window_s = 0.0

    def per_operation(self, case: Case, n: int, *, ignore: str | None = None) -> float:
        """Requests per operation (``ignore``: leave out reads of the table whose name ends so)."""
        calls = [case.prepare() for _ in range(n + 1)]
        if case.other_instance:
            runtime.reset()  # another instance: none of the prepared heads is known to it
        calls[0]()  # uncounted: the first use of clients and tables in this process state
        self.proxy.wait_quiet(self.quiet_s)
        start, began = self.proxy.count, time.monotonic()
        for call in calls[1:]:
            call()
        self.proxy.wait_quiet(self.quiet_s)
        window = self.proxy.since(start)
        self.windows += 1
        self.window_s += time.monotonic() - began
        self.layout_reads += sum(1 for r in window if is_layout_read(r))
        received = [
            r
            for r in window
            if not is_layout_read(r)
            and (ignore is None or not (r.method == "GET" and _table_of(r.path).endswith(ignore)))
        ]
        self.seen[case.name] = dict(Counter(f"{r.method} {_table_of(r.path)}" for r in received))
        return len(received) / n


def _table_of(path: str) -> str:
    """``/devstoreaccount1/<table>(PK,RK)`` → a label without keys (prefix kept short)."""
    name = path.split("/", 2)[-1]
    return name.split("(", 1)[0]


def _requests(
    name: str, settle: float, minimum: int | None, *, target: str, verdict: Verdict, note: str = ""
) -> Figure:
    """Storage requests per operation beside the operation's minimum (``None``: no minimum set)."""
    return Figure(
        section=SECTION,
        name=name,
        settle=settle,
        baseline=None if minimum is None else float(minimum),
        ratio=ratio(settle, minimum),
        target=target,
        verdict=verdict,
        unit="requests",
        note=note,
    )


def _figure(name: str, per_round: list[float], minimum: int) -> Figure:
    settle = median(per_round)
    per_round_note = f"per round: {', '.join(f'{v:.2f}' for v in per_round)}"
    target = f"<= {minimum} requests"
    return _requests(
        name, settle, minimum, target=target, verdict=verdict_at_most(settle, minimum), note=per_round_note
    )


def _paced(env: Environment, state: State, proxy: CountingProxy, cycles: int) -> Figure:
    """Context: lock + fenced set cycles at one call per 0.3 s (the once-per-minute index preparation is
    shared by fewer operations), against the two cycles' minimum."""
    name = f"lock + fenced set, one call per {PACED_INTERVAL_S} s"
    minimum = MINIMUM["lock (new key)"] + MINIMUM["set (fenced, with token)"]
    proxy.wait_quiet(env.sizes.roundtrip_quiet_s)
    start = proxy.count
    for _ in range(cycles):
        key = new_key(prefix="paced")
        token = state.acquire(key)
        time.sleep(PACED_INTERVAL_S)
        expect(state.set(key, token), 200, what="state_set")
        time.sleep(PACED_INTERVAL_S)
    proxy.wait_quiet(env.sizes.roundtrip_quiet_s)
    per_cycle = len(proxy.since(start)) / cycles
    note = f"{cycles} cycles; requests per cycle (lock + set) against the two operations' minimum"
    return _requests(name, per_cycle, minimum, target="(context)", verdict="info", note=note)


def _fenced(env: Environment, proxy: CountingProxy, counter: WireCount, state: State) -> list[Figure]:
    """The cost of the key fence: a state layout and a hand-off layout changed 1 -> 4 (in fresh tables whose
    layouts refresh every 0.2 s, so the change is in force within seconds; the change itself not counted),
    then new keys locked and new events' first messages projected, against the documented requests."""
    from datetime import timedelta

    from common import layouts
    from common.clock import earliest_now

    before = os.environ.get(layouts.REFRESH_SETTING)
    env.use_fresh_prefix(
        connection=proxy.connection_string(env.connection),
        SETTLE_LOOPBACK="true",
        **{layouts.REFRESH_SETTING: "0.2"},
    )
    try:
        state.acquire(new_key(prefix="fence"))  # both layouts recorded at S = 1
        env.app.message("resolver", event_messages("Billing", 990_000)[0][1])
        changed = [
            layouts.change(runtime.tables(), family, 4, actor="bench", reason="the fence's cost")
            for family in (layouts.STATE, layouts.HANDOFF)
        ]
        since = max(c.eras[-1].since for c in changed)
        while earliest_now() < since + timedelta(seconds=0.5):
            time.sleep(0.05)
        layouts.book().invalidate()
        state.acquire(new_key(prefix="fence"))  # the copy read again, outside the counted window

        def lock_new() -> Callable[[], Any]:
            key = new_key(prefix="fence")
            return lambda: state.acquire(key)

        def first_message() -> Callable[[], Any]:
            message = event_messages("Billing", 991_000 + int(uuid.uuid4().int % 8_000))[0][1]
            return lambda: env.app.message("resolver", message)

        def lock_held() -> Callable[[], Any]:
            key = new_key(prefix="fence")
            state.acquire(key)
            return lambda: expect(state.lock(key), 200, what="state_lock")

        figures = []
        for name, prepare, other in (
            ("lock (new key), an earlier layout listed", lock_new, False),
            ("resolver: EventRequest, an earlier layout listed", first_message, False),
            ("lock (refused: held, other instance), an earlier layout listed", lock_held, True),
        ):
            case = Case(name, "state_lock", prepare, other_instance=other)
            per_round = [
                counter.per_operation(case, env.sizes.roundtrip_ops, ignore=LAYOUT_READS) for _ in range(3)
            ]
            figure = _figure(name, per_round, FENCED[name])
            seen = ", ".join(f"{k} x{v}" for k, v in sorted(counter.seen[name].items()))
            note = f"{figure.note}; requests seen: {seen}; {FENCED_WHY[name]}"
            figures.append(figure.model_copy(update={"note": note}))
        return figures
    except (Unexpected, TimeoutError) as exc:
        return [missing(SECTION, name, f"<= {n} requests", str(exc)) for name, n in FENCED.items()]
    finally:  # later sections (and a test process running the bench) record layouts at their own pace
        if before is None:
            os.environ.pop(layouts.REFRESH_SETTING, None)
        else:
            os.environ[layouts.REFRESH_SETTING] = before


def run(env: Environment) -> list[Figure]:
    upstream = env.table_endpoint()
    figures: list[Figure] = []
    with CountingProxy(upstream) as proxy:
        env.use_fresh_prefix(connection=proxy.connection_string(env.connection), SETTLE_LOOPBACK="true")
        counter = WireCount(env, proxy)
        state = State(env.app)
        cases = _state_cases(state) + _resolver_cases(env) + [_settlement_case(env)]
        n, rounds = env.sizes.roundtrip_ops, env.sizes.roundtrip_rounds
        for case in cases:
            minimum = MINIMUM[case.name]
            target = f"<= {minimum} requests"
            if not all(env.app.has(f) for f in (case.function, "state_lock", "resolver")):
                figures.append(missing(SECTION, case.name, target, "function not registered"))
                continue
            try:
                per_round = [counter.per_operation(case, n) for _ in range(rounds)]
            except (Unexpected, TimeoutError) as exc:
                figures.append(missing(SECTION, case.name, target, str(exc)))
                continue
            except Exception as exc:  # a crash in the code under test is a finding, not a benchmark crash
                figures.append(missing(SECTION, case.name, target, f"raised {exc!r}"))
                continue
            figures.append(_figure(case.name, per_round, minimum))
        for name, function, call in (
            ("query (one page)", "state_query", lambda: state.query(1)),
            ("history (one page)", "state_history", lambda: state.history(new_key(prefix="rt"))),
        ):
            if env.app.has(function):
                info = Case(name, function, lambda call=call: call)  # type: ignore[misc]
                value = counter.per_operation(info, n)
                figures.append(_requests(name, value, None, target="(no minimum set)", verdict="info"))
        figures.append(
            _requests(
                LAYOUT_REREADS,
                counter.layout_reads,
                None,
                target="(context)",
                verdict="info",
                note=(
                    f"{counter.layout_reads} over {counter.windows} counted windows "
                    f"({counter.window_s:.0f} s); "
                    "an instance re-reads the recorded layouts in the background once its copy is "
                    "RefreshSeconds old (30 s by default), one request, whatever operation it runs beside"
                ),
            )
        )
        figures += _fenced(env, proxy, counter, state)
        if env.sizes.roundtrip_paced_cycles and env.app.has("state_set"):
            figures.append(_paced(env, state, proxy, env.sizes.roundtrip_paced_cycles))
        env.details["round_trips"] = {
            "operations_per_round": n,
            "rounds": rounds,
            "quiet_s": counter.quiet_s,
            "requests_seen_in_last_round": counter.seen,
            # layout re-reads left out of every window, the fenced figures' 0.2 s refresh included
            "layout_rereads_left_out": counter.layout_reads,
            "minimum": MINIMUM,
        }
        env.use_fresh_prefix(SETTLE_LOOPBACK="false")
    return figures
