"""Figure 3: K threads race for one key. Settle's ``lock`` must let exactly one acquire; the seeds'
read-then-insert algorithm, run here as the baseline on the same Azurite, lets several believe they hold it.

The baseline is ``TryAcquireLockAsync`` of seed 000 transcribed to Table Storage: read the key's current
(latest) row; if it is not Processed/Skipped/Processing, insert a new Processing row (the seed's table is
an append-only log with an identity column, so the insert never conflicts) and return true.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.harness import Environment, Figure, median, missing, verdict_equal
from bench.workload import State, new_key, raw_entity

SECTION = "contention"


def race(k: int, attempt: Callable[[], bool]) -> int:
    """Start ``k`` threads at one barrier; return how many of them believe they hold the lock."""
    barrier = threading.Barrier(k)
    wins: list[bool] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def worker() -> None:
        barrier.wait()
        try:
            won = attempt()
        except BaseException as exc:
            with guard:
                errors.append(exc)
            return
        with guard:
            wins.append(won)

    threads = [threading.Thread(target=worker) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(wins)


def naive_lock(table: Any, partition: str) -> bool:
    """The seed's read-then-insert ``TryAcquireLockAsync`` (the race it loses is the point)."""
    rows = list(table.query_entities("PartitionKey eq @pk", parameters={"pk": partition}))
    current = max(rows, key=lambda r: r["RowKey"])["Status"] if rows else None
    if current in ("Processed", "Skipped", "Processing"):
        return False
    table.create_entity(raw_entity(partition, uuid.uuid4().hex))
    return True


def run(env: Environment) -> list[Figure]:
    state = State(env.app)
    table = env.raw_table("naive")
    figures: list[Figure] = []
    details: dict[str, Any] = {}

    def settle_attempt(key: dict[str, Any]) -> bool:
        answer = state.lock(key)
        return answer.status == 200 and bool(answer.json.get("acquired"))

    for k in env.sizes.contention_ks:
        name = f"K={k}: threads that acquire"
        naive: list[int] = []
        settle: list[int] = []
        failure = "state_lock not registered" if not env.app.has("state_lock") else ""
        # Settle's race and the baseline's alternate, each on a fresh key.
        for _ in range(env.sizes.contention_repeats):
            partition = f"key-{uuid.uuid4().hex}"
            naive.append(race(k, partial(naive_lock, table, partition)))
            if failure:
                continue
            key = new_key(prefix=f"race{k}")
            try:
                settle.append(race(k, partial(settle_attempt, key)))
            except Exception as exc:  # a crash in the code under test is a finding
                failure = f"state_lock raised {exc!r}"
        details[f"K={k}"] = {"settle": settle, "naive": naive}
        if failure:
            figures.append(
                missing(SECTION, name, "exactly 1", f"{failure}; seed read-then-insert: {naive}", "holders")
            )
            continue
        worst = max(settle, key=lambda n: abs(n - 1))  # any race other than 1 is the verdict
        figures.append(
            Figure(
                section=SECTION,
                name=name,
                settle=float(worst),
                baseline=median(naive),
                ratio=None,
                target="Settle exactly 1",
                verdict=verdict_equal(worst, 1),
                unit="holders",
                note=(
                    f"{len(settle)} races: Settle {settle}; seed read-then-insert {naive} "
                    "(callers that believe they hold the lock; median in the baseline column)"
                ),
            )
        )
    env.details["contention"] = details
    return figures
