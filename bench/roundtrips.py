"""Figure 1: Table round trips of every state operation, resolver message type and settlement.

Counted by the azure-core policy every Settle table client carries (``common.roundtrips``), around one
call of the function entry point, beside the documented minimum. The median over the rounds is shown
(the counts are normally identical every round).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.harness import (
    REQUEST_LOG,
    Environment,
    Figure,
    count_requests,
    median,
    missing,
    ratio,
    verdict_at_most,
)
from bench.workload import State, Unexpected, event_messages, expect, new_key
from common import runtime

SECTION = "round trips"

# Documented minimum Table requests of each state operation (docs/ and issue 2's targets).
STATE_MINIMUM: dict[str, int] = {
    "exists": 1,
    "get": 1,
    "lock (new key)": 1,
    "lock (refused: held)": 2,
    "lock (refused: held, other instance)": 2,
    "lock (Failed key)": 2,
    "lock (Failed key, other instance)": 2,
    "set (fenced, with token)": 1,
    "set (without token)": 2,
    "release (fenced, with token)": 1,
    "release (without token)": 2,
    "upsert": 2,
    "lock/extend (with token)": 1,
}

# The resolver reads the event row once and writes history + event row in one transaction.
RESOLVER_MINIMUM = 2
RESOLVER_TYPES = ("EventRequest", "PendingHandoffResponse", "HandoffCompletedRequest", "ResolutionResponse")


def other_instance(state: State) -> None:
    """Forget every process-local cache (as another Function instance would not have them), then warm
    the table clients on an unrelated key so table creation is not counted."""
    runtime.reset()
    state.exists(new_key(prefix="warm"))


def _state_cases(state: State) -> dict[str, Callable[[], Callable[[], Any]]]:
    """Each case sets its key up (uncounted) and returns the one call that is counted."""

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

    def lock_held_elsewhere() -> Callable[[], Any]:
        key = new_key(prefix="rt")
        state.acquire(key)
        other_instance(state)
        return lambda: expect(state.lock(key), 200, 409, 423, what="state_lock (held)")

    def lock_failed(elsewhere: bool) -> Callable[[], Any]:
        key = new_key(prefix="rt")
        expect(state.release(key, state.acquire(key)), 200, 204, what="state_release")
        if elsewhere:
            other_instance(state)
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

    return {
        "exists": exists,
        "get": get,
        "lock (new key)": lock_new,
        "lock (refused: held)": lock_held,
        "lock (refused: held, other instance)": lock_held_elsewhere,
        "lock (Failed key)": lambda: lock_failed(False),
        "lock (Failed key, other instance)": lambda: lock_failed(True),
        "set (fenced, with token)": lambda: fenced(state.set, True),
        "set (without token)": lambda: fenced(state.set, False),
        "release (fenced, with token)": lambda: fenced(state.release, True),
        "release (without token)": lambda: fenced(state.release, False),
        "upsert": upsert,
        "lock/extend (with token)": extend,
    }


_FUNCTION_OF = {
    "exists": "state_exists",
    "get": "state_get",
    "lock (new key)": "state_lock",
    "lock (refused: held)": "state_lock",
    "lock (refused: held, other instance)": "state_lock",
    "lock (Failed key)": "state_lock",
    "lock (Failed key, other instance)": "state_lock",
    "set (fenced, with token)": "state_set",
    "set (without token)": "state_set",
    "release (fenced, with token)": "state_release",
    "release (without token)": "state_release",
    "upsert": "state_upsert",
    "lock/extend (with token)": "state_lock_extend",
}


def _figure(name: str, counts: list[int], minimum: int, note: str = "") -> Figure:
    settle = median(counts)
    return Figure(
        section=SECTION,
        name=name,
        settle=settle,
        baseline=float(minimum),
        ratio=ratio(settle, minimum),
        target=f"<= {minimum} requests",
        verdict=verdict_at_most(settle, minimum),
        unit="requests",
        note=note or ("" if len(set(counts)) == 1 else f"varied between rounds: {counts}"),
    )


def state_figures(env: Environment) -> list[Figure]:
    state = State(env.app)
    figures: list[Figure] = []
    for name, prepare in _state_cases(state).items():
        minimum = STATE_MINIMUM[name]
        if not env.app.has(_FUNCTION_OF[name]) or not env.app.has("state_lock"):
            figures.append(missing(SECTION, name, f"<= {minimum} requests", "function not registered"))
            continue
        try:
            # One extra round first, dropped: the first use of a table in a process creates it.
            counts = [count_requests(prepare(), name)[0] for _ in range(env.sizes.rounds + 1)][1:]
        except Unexpected as exc:
            figures.append(missing(SECTION, name, f"<= {minimum} requests", str(exc)))
            continue
        figures.append(_figure(name, counts, minimum))
    for name, fn, call in (
        ("query (one page)", "state_query", lambda: state.query(1)),
        ("history (one page)", "state_history", lambda: state.history(new_key(prefix="rt"))),
    ):
        if env.app.has(fn):
            count, answer = count_requests(call)
            figures.append(
                Figure(
                    section=SECTION,
                    name=name,
                    settle=float(count),
                    baseline=None,
                    ratio=None,
                    target="(no minimum set)",
                    verdict="info",
                    unit="requests",
                    note=f"status {answer.status}",
                )
            )
    return figures


def resolver_figures(env: Environment) -> list[Figure]:
    """Requests per projected message, by type (a fresh event per round)."""
    target = f"<= {RESOLVER_MINIMUM} requests"
    if not env.app.has("resolver"):
        return [missing(SECTION, f"resolver: {t}", target, "function not registered") for t in RESOLVER_TYPES]
    counts: dict[str, list[int]] = {t: [] for t in RESOLVER_TYPES}
    try:
        for _, message in event_messages("Billing", 900_000):  # tables, endpoint registration: not counted
            env.app.message("resolver", message)
        for n in range(env.sizes.rounds):
            for message_type, message in event_messages("Billing", 900_001 + n):
                counts[message_type].append(
                    count_requests(
                        partial(env.app.message, "resolver", message), f"resolver: {message_type}"
                    )[0]
                )
    except Exception as exc:  # a crash in the code under test is a finding, not a benchmark crash
        return [
            missing(SECTION, f"resolver: {t}", target, f"resolver raised {exc!r}") for t in RESOLVER_TYPES
        ]
    return [_figure(f"resolver: {t}", counts[t], RESOLVER_MINIMUM) for t in RESOLVER_TYPES]


def settlement_figure(env: Environment) -> list[Figure]:
    """``handoff_complete`` on a parked event: claim + send + audit (send goes through the loopback).

    With ``SETTLE_LOOPBACK=true`` the control message is projected in-process on the same thread, so its
    projection (2 requests) is counted too. Documented minimum (docs/tables.md): read the event
    row 1 + one transaction holding claim + audit + queue mark 1, then the send; over the loopback the
    send is the projection's 2: in all 4.
    """
    name = "settlement (handoff_complete, loopback)"
    minimum = 4
    target = f"<= {minimum} requests"
    if not (env.app.has("handoff_complete") and env.app.has("resolver")):
        return [missing(SECTION, name, target, "handoff_complete or resolver not registered")]
    env.use_fresh_prefix(SETTLE_LOOPBACK="true")
    counts: list[int] = []
    try:
        for n in range(env.sizes.rounds + 1):
            messages = event_messages("Billing", 950_000 + n)
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
            count, answer = count_requests(partial(env.app.http, "handoff_complete", body), name)
            expect(answer, 202, what="handoff_complete")
            if n > 0:  # the first settlement creates the claim and audit tables: not counted
                counts.append(count)
    except Exception as exc:
        return [missing(SECTION, name, target, f"settlement failed: {exc}")]
    finally:
        env.use_fresh_prefix(SETTLE_LOOPBACK="false")
    return [_figure(name, counts, minimum, note="includes the in-process loopback projection (2 requests)")]


def run(env: Environment) -> list[Figure]:
    REQUEST_LOG.clear()
    figures = state_figures(env) + resolver_figures(env) + settlement_figure(env)
    env.details["round_trip_methods"] = dict(REQUEST_LOG)
    return figures
