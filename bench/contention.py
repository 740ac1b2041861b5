"""Figure 3: K callers race for one key at one barrier. Settle's ``lock`` must let exactly one acquire.

The figures that matter race on keys that already exist, where one winner is not handed out by an
insert-if-absent: a **Failed** record (re-acquisition, a conditional replace) and an **expired lock**
(a takeover), at K = 8 and 32. A race counts only if exactly one caller acquired, the winner's token
is accepted by a fenced ``set`` (so it names the lock storage holds), and no caller got a 5xx; any
other race misses the figure. The race on a new key is kept beside them for context.

The baseline is the seeds' ``TryAcquireLockAsync`` (seed 000) transcribed to Table Storage and raced on
the same Azurite: read the key's latest row; unless it is Processed, Skipped or Processing, insert a new
Processing row (the seed's table is an append-only log with an identity column, so the insert never
conflicts) and return true. On a Failed key several callers believe they hold the lock; on an expired
lock none does (the seed never takes a lock over; only its catch-up frees it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench.harness import Environment, Figure, HttpAnswer, median, missing, verdict_equal
from bench.workload import State, Unexpected, expect, new_key, raw_entity

SECTION = "contention"
TAKEOVER_KS = (8, 32)
EXPIRED_LOCK_S = 1
# Expiry is judged by the storage clock, estimated from 1-second Date headers: leave a margin.
EXPIRY_MARGIN_S = 2.5


@dataclass
class Race:
    """What one race gave: every caller's answer."""

    answers: list[HttpAnswer | BaseException] = field(default_factory=list)
    set_status: int | None = None

    @property
    def winners(self) -> list[HttpAnswer]:
        return [
            a
            for a in self.answers
            if isinstance(a, HttpAnswer) and a.status == 200 and bool((a.json or {}).get("acquired"))
        ]

    @property
    def server_errors(self) -> int:
        return sum(1 for a in self.answers if not isinstance(a, HttpAnswer) or a.status >= 500)

    def statuses(self) -> Counter[str]:
        return Counter(str(a.status) if isinstance(a, HttpAnswer) else type(a).__name__ for a in self.answers)

    @property
    def good(self) -> bool:
        return len(self.winners) == 1 and self.set_status == 200 and self.server_errors == 0


def race(k: int, attempt: Callable[[], Any]) -> list[Any]:
    """Start ``k`` threads at one barrier; every thread's result (or the exception it raised)."""
    barrier = threading.Barrier(k)
    results: list[Any] = []
    guard = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            result = attempt()
        except BaseException as exc:  # a crash is recorded, never lost
            result = exc
        with guard:
            results.append(result)

    threads = [threading.Thread(target=worker) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def naive_lock(table: Any, partition: str) -> bool:
    """The seed's read-then-insert ``TryAcquireLockAsync`` (the race it loses is the point)."""
    rows = list(table.query_entities("PartitionKey eq @pk", parameters={"pk": partition}))
    current = max(rows, key=lambda r: r["RowKey"])["Status"] if rows else None
    if current in ("Processed", "Skipped", "Processing"):
        return False
    table.create_entity(raw_entity(partition, uuid.uuid4().hex))
    return True


def naive_key(table: Any, status: str | None) -> str:
    """A partition for the naive lock whose latest row has ``status`` (None: a new key)."""
    partition = f"key-{uuid.uuid4().hex}"
    if status is not None:
        row = raw_entity(partition, "0" * 32)
        row["Status"] = status
        table.create_entity(row)
    return partition


def settle_race(state: State, key: dict[str, Any], k: int) -> Race:
    result = Race(answers=race(k, partial(state.lock, key)))
    winners = result.winners
    if len(winners) == 1:
        result.set_status = state.set(key, str(winners[0].json["lockToken"])).status
    return result


def _prepare(state: State, kind: str) -> dict[str, Any]:
    key = new_key(prefix=f"race-{kind}")
    if kind == "Failed":
        token = state.acquire(key)
        expect(state.release(key, token), 200, what="state_release")
    elif kind == "expired":
        answer = expect(
            state.app.http("state_lock", {"key": key, "lockSeconds": EXPIRED_LOCK_S}), 200, what="lock"
        )
        if not answer.json.get("acquired"):
            raise Unexpected(f"a short lock on a new key was refused: {answer.json}")
    return key


def _figure(name: str, races: list[Race], naive: list[int], context: bool) -> Figure:
    counts = [len(r.winners) for r in races]
    worst = max(counts, key=lambda n: abs(n - 1))
    bad = [r for r in races if not r.good]
    errors = sum(r.server_errors for r in races)
    refused_sets = [r.set_status for r in races if len(r.winners) == 1 and r.set_status != 200]
    statuses = sum((r.statuses() for r in races), Counter())
    verdict = verdict_equal(float(len(bad)), 0.0)
    return Figure(
        section=SECTION,
        name=name,
        settle=float(worst),
        baseline=median(naive),
        ratio=None,
        target="exactly 1 winner, its set accepted, no 5xx" + (" (context)" if context else ""),
        verdict=verdict,
        unit="holders",
        note=(
            f"{len(races)} races: winners {counts}; winner's set refused {refused_sets or 'never'}; "
            f"5xx {errors}; answers {dict(sorted(statuses.items()))}; seed read-then-insert {naive} "
            "(callers that believe they hold the lock; median in the baseline column)"
        ),
    )


def run(env: Environment) -> list[Figure]:
    state = State(env.app)
    table = env.raw_table("naive")
    repeats = env.sizes.contention_repeats
    if not (env.app.has("state_lock") and env.app.has("state_set") and env.app.has("state_release")):
        names = [f"takeover: K={k}, {kind}" for kind in ("Failed key", "expired lock") for k in TAKEOVER_KS]
        return [missing(SECTION, n, "exactly 1", "state_lock/set/release not registered") for n in names]
    figures: list[Figure] = []
    details: dict[str, Any] = {}
    ks = [k for k in TAKEOVER_KS if k in env.sizes.contention_ks] or [max(env.sizes.contention_ks)]
    for kind, label, naive_status in (
        ("Failed", "Failed key", "Failed"),
        ("expired", "expired lock", "Processing"),
    ):
        # Every key of this kind is prepared first (expired locks need to expire, once for all).
        keys = {k: [_prepare(state, kind) for _ in range(repeats)] for k in ks}
        if kind == "expired":
            time.sleep(EXPIRED_LOCK_S + EXPIRY_MARGIN_S)
        for k in ks:
            races: list[Race] = []
            naive: list[int] = []
            for key in keys[k]:  # Settle's race and the baseline's alternate
                races.append(settle_race(state, key, k))
                partition = naive_key(table, naive_status)
                naive.append(sum(1 for won in race(k, partial(naive_lock, table, partition)) if won is True))
            name = f"takeover: K={k}, {label}"
            details[name] = {"winners": [len(r.winners) for r in races], "naive": naive}
            figures.append(_figure(name, races, naive, context=False))
    for k in env.sizes.contention_ks:
        races, naive = [], []
        for _ in range(repeats):
            races.append(settle_race(state, new_key(prefix=f"race{k}"), k))
            naive.append(
                sum(1 for won in race(k, partial(naive_lock, table, naive_key(table, None))) if won is True)
            )
        name = f"lock race, new key, K={k}"
        details[name] = {"winners": [len(r.winners) for r in races], "naive": naive}
        figures.append(_figure(name, races, naive, context=True))
    env.details["contention"] = details
    return figures
