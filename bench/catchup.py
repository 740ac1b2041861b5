"""Figure 4: catch-up cost against what could grow it.

**index** (the figure): two tables in the real state layout, holding ``Sizes.catchup_sizes`` (2,000 and
10,000) live locks that are not due yet (their level-2 rows beside the heads, markers and level-1 rows,
spread over the same partitions and the next half hour), each with ``catchup_expired`` (50) due locks. The
``state_catchup`` timer runs on each in turn (order alternating), with fresh due locks before every run
after the first. **records** (context): the same with finished records instead of live locks.

Entities read are counted by an azure-core policy added to Settle's table clients (entities in every GET
response), so the count does not rely on Settle's own word; every run must also have failed exactly its
due locks, read from storage, and catch-up's own report (what :meth:`Catchup.drain`, the timer's path,
returned, summed over its runs) must say the same, or the figure misses: a catch-up that skipped work
would read less, and one that misreports would hide it.

Target: the same number of entities read at both sizes, and time(large) / time(small) <= 1.5.

Loading uses ``bench.bench_support`` (the bulk loader, 100-entity transactions in the real
layout). Without it the benchmark falls back to the public HTTP functions at small sizes and says so.

Catch-up is imported inside the function that reports on it, so the section still runs on a tree without it.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.data.tables import TableServiceClient

from bench.harness import (
    Environment,
    Figure,
    Verdict,
    log,
    median,
    missing,
    verdict_at_most,
    verdict_equal,
)
from bench.workload import State, expect, new_key

SECTION = "catch-up"
TIME_TARGET = 1.5


class EntityCounter(SansIOHTTPPolicy[Any, Any]):
    """Counts entities in Table GET responses (a query's ``value`` list, or one entity) while enabled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.enabled = False
        self.entities = 0
        self.requests = 0

    def on_response(self, request: Any, response: Any) -> None:
        if not self.enabled or request.http_request.method != "GET":
            return
        try:
            payload = json.loads(response.http_response.text() or "null")
        except ValueError:
            return
        found = 0
        if isinstance(payload, dict):
            value = payload.get("value")
            if isinstance(value, list):
                found = len(value)
            elif "PartitionKey" in payload:
                found = 1
        with self._lock:
            self.requests += 1
            self.entities += found

    def measure(self, call: Callable[[], Any]) -> tuple[int, float]:
        """Run ``call``; return (entities read, seconds)."""
        with self._lock:
            self.entities = 0
            self.requests = 0
        self.enabled = True
        start = time.perf_counter()
        try:
            call()
        finally:
            elapsed = time.perf_counter() - start
            self.enabled = False
        return self.entities, elapsed


class Loader:
    """Puts records into the current prefix's tables: bulk (``bench.bench_support``) or via HTTP."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.state = State(env.app)
        try:
            self.support: Any = importlib.import_module("bench.bench_support")
        except ImportError:
            self.support = None
        self.bulk = self.support is not None and hasattr(self.support, "bulk_records")

    def records(self, count: int, *, expired_locks: int) -> None:
        if self.bulk:
            self.support.bulk_records(count - expired_locks, expired_locks=expired_locks)
            return
        # Fallback: processed records through lock + set, expired locks through a 1-second lock.
        for _ in range(count - expired_locks):
            self.state.processed(new_key(prefix="cu"))
        self.expired(expired_locks)

    def live(self, count: int, *, expired_locks: int) -> None:
        self.support.bulk_records(0, expired_locks=expired_locks, live_locks=count)

    def expired(self, count: int) -> None:
        if self.bulk:
            self.support.bulk_records(0, expired_locks=count)
            return
        for _ in range(count):
            key = new_key(prefix="cux")
            answer = expect(
                self.env.app.http("state_lock", {"key": key, "lockSeconds": 1}), 200, what="state_lock"
            )
            if not answer.json.get("acquired"):
                raise RuntimeError(f"could not lock {key}")
        time.sleep(2.2)  # let the 1-second locks expire (server clock has 1 s resolution)


@contextmanager
def catchup_reports() -> Iterator[list[dict[str, Any]]]:
    """Collect what each timer invocation's catch-up says it did: the ``CatchupResult`` of every run of
    :meth:`Catchup.drain` (the path the timer calls), summed, beside our own count."""
    reports: list[dict[str, Any]] = []
    try:
        from state.catchup import Catchup, CatchupResult
    except ImportError:
        yield reports
        return
    original = Catchup.drain

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        results = original(self, *args, **kwargs)
        total = CatchupResult()
        for result in results:
            total.add(result)
        said = {k: v for k, v in vars(total).items() if isinstance(v, int) and not isinstance(v, bool)}
        reports.append(dict(said, runs=len(results)))
        return results

    Catchup.drain = recording  # type: ignore[method-assign]
    try:
        yield reports
    finally:
        Catchup.drain = original  # type: ignore[method-assign]


def _state_table(env: Environment, prefix: str) -> Any:

    return TableServiceClient.from_connection_string(env.connection).get_table_client(prefix + "state")


def _expired_failed(env: Environment, prefix: str) -> int:
    """Heads in storage that catch-up concluded (Failed, LockExpired): a scan, the bench's own check."""
    rows = _state_table(env, prefix).query_entities(
        "Status eq 3 and Substatus eq 'LockExpired'", select=["RowKey"], results_per_page=1000
    )
    return sum(1 for _ in rows)


def _due_left(env: Environment, prefix: str) -> int:
    """Processing heads whose lock expired more than 2 s ago (catch-up should have concluded them)."""

    cutoff = datetime.now(UTC) - timedelta(seconds=2)
    rows = _state_table(env, prefix).query_entities(
        "Status eq 2 and LockedUntil lt @cutoff", parameters={"cutoff": cutoff}, select=["RowKey"]
    )
    return sum(1 for _ in rows)


RECORDS_NAMES = ("records: entities read, 100k / 10k records", "records: time per run, 100k / 10k records")
INDEX_NAMES = (
    "index: entities read, 100k / 10k live index rows",
    "index: time per run, 100k / 10k live index rows",
)


def run(env: Environment) -> list[Figure]:
    if not (env.app.has("state_catchup") and env.app.has("state_lock")):
        return [
            missing(SECTION, n, "", "state_catchup or state_lock not registered")
            for n in (*INDEX_NAMES, *RECORDS_NAMES)
        ]
    counter = EntityCounter()
    probe = Loader(env)
    if probe.bulk:
        sizes = env.sizes.catchup_sizes
        fallback_note = ""
    else:
        sizes = env.sizes.catchup_fallback_sizes
        fallback_note = (
            "bench.bench_support.bulk_records is missing: loaded through HTTP at "
            f"{sizes[0]:,} / {sizes[1]:,} records instead of the full sizes"
        )
    figures: list[Figure] = []
    # What could grow catch-up's cost is the index itself: live locks that are not due yet. The same due
    # locks per run beside the smaller and then the larger count of live ones, spread over the same
    # partitions. Context: finished records do not reach catch-up at all (they have no index rows).
    for kind, load, unit_label, context, note in (
        ("index", Loader.live, "live index rows", False, ""),
        ("records", Loader.records, "records", True, fallback_note),
    ):
        if kind == "index" and not probe.bulk:
            figures += [
                missing(SECTION, n, "", "bench.bench_support.bulk_records is missing: no bulk live locks")
                for n in INDEX_NAMES
            ]
            continue
        figures += _compare(
            env, counter, kind=kind, sizes=sizes, load=load, unit_label=unit_label, context=context, note=note
        )
    return figures


def _compare(
    env: Environment,
    counter: EntityCounter,
    *,
    kind: str,
    sizes: tuple[int, int],
    load: Callable[..., None],
    unit_label: str,
    context: bool,
    note: str,
) -> list[Figure]:
    """Two tables (``sizes``), each loaded by the :class:`Loader` method ``load`` with ``catchup_expired``
    due locks; the timer runs on each in turn (order alternating), with fresh due locks before every run
    after the first."""
    expired = env.sizes.catchup_expired
    prefixes: list[str] = []
    for size in sizes:
        prefix = env.use_fresh_prefix(policies=[counter])
        start = time.perf_counter()
        load(Loader(env), size, expired_locks=expired)
        log(f"catch-up ({kind}): loaded {size:,} {unit_label} in {time.perf_counter() - start:.1f} s")
        prefixes.append(prefix)
    timings: dict[int, list[float]] = {s: [] for s in sizes}
    reads: dict[int, list[int]] = {s: [] for s in sizes}
    said: dict[int, list[dict[str, Any]]] = {s: [] for s in sizes}
    reported: dict[int, list[int | None]] = {s: [] for s in sizes}
    failed: dict[int, list[int]] = {s: [] for s in sizes}
    left: dict[int, list[int]] = {s: [] for s in sizes}
    for n in range(env.sizes.catchup_runs):
        order = list(zip(sizes, prefixes, strict=True))
        if n % 2:
            order.reverse()
        for size, prefix in order:
            env.use_fresh_prefix(prefix=prefix, policies=[counter])
            loader = Loader(env)
            if n > 0:  # the first run finds the locks loaded with the table; later runs get fresh ones
                loader.expired(expired)
            before = _expired_failed(env, prefix)
            with catchup_reports() as reports:
                entities, seconds = counter.measure(lambda: env.app.timer("state_catchup"))
            timings[size].append(seconds)
            reads[size].append(entities)
            said[size].extend(reports)
            # What the timer's catch-up said it failed (None: it reported nothing, or more than once).
            reported[size].append(reports[0]["locks_failed"] if len(reports) == 1 else None)
            # Read from storage, not from catch-up's report: heads it turned Failed, and due locks left.
            failed[size].append(_expired_failed(env, prefix) - before)
            left[size].append(_due_left(env, prefix))
    env.details.setdefault("catchup", {})[kind] = {
        "sizes": list(sizes),
        "expired_locks_per_run": expired,
        "bulk_loader": Loader(env).bulk,
        "seconds": {str(s): v for s, v in timings.items()},
        "entities_read": {str(s): v for s, v in reads.items()},
        "locks_failed": {str(s): v for s, v in failed.items()},
        "due_locks_left": {str(s): v for s, v in left.items()},
        "catchup_reported": {str(s): v for s, v in said.items()},
        "locks_failed_reported": {str(s): v for s, v in reported.items()},
    }
    small, large = sizes
    read_ratio = median(reads[large]) / median(reads[small]) if median(reads[small]) else None
    time_ratio = median([b / a for a, b in zip(timings[small], timings[large], strict=True)])
    label = f"{large // 1000}k / {small // 1000}k" if small >= 1000 else f"{large:,} / {small:,}"
    # Every run must have failed exactly its due locks: a catch-up that skips work would read less.
    complete = all(count == expired for side in failed.values() for count in side) and not any(
        n for side in left.values() for n in side
    )
    # Catch-up's own report, from the timer's path, must say what storage says it did.
    truthful = all(reported[s] == failed[s] for s in sizes)
    read_verdict = verdict_equal(read_ratio, 1.0) if read_ratio is not None else "missing"
    if not (complete and truthful):
        read_verdict = "missed"
    suffix = " (context)" if context else ""

    def larger_beside_smaller(
        what: str,
        values: Mapping[int, Sequence[float]],
        value_ratio: float | None,
        target: str,
        *,
        verdict: Verdict,
        unit: str,
        note: str = "",
    ) -> Figure:
        """A figure of the larger table's median beside the smaller one's."""
        return Figure(
            section=SECTION,
            name=f"{kind}: {what}, {label} {unit_label}",
            settle=median(values[large]),
            baseline=median(values[small]),
            ratio=value_ratio,
            target=target + suffix,
            verdict=verdict,
            unit=unit,
            note=note,
        )

    return [
        larger_beside_smaller(
            "entities read",
            reads,
            read_ratio,
            "identical (1.00), every due lock failed",
            verdict=read_verdict,
            unit="entities",
            note="; ".join(
                x
                for x in (
                    f"{expired} due locks per run; reads per run {reads[small]} vs {reads[large]}; "
                    f"locks turned Failed per run, read from storage, {failed[small]} vs {failed[large]}; "
                    f"due locks left {left[small]} vs {left[large]}; "
                    f"catch-up's own report (the timer's drain) {reported[small]} vs {reported[large]}",
                    note,
                )
                if x
            ),
        ),
        larger_beside_smaller(
            "time per run",
            timings,
            time_ratio,
            f"<= {TIME_TARGET}x",
            verdict=verdict_at_most(time_ratio, TIME_TARGET),
            unit="s",
        ),
    ]
