"""Fault injection on every state operation: fail its Nth storage request, before or after it applied.

For each operation, a clean run first counts the storage requests it makes; then for every request
number N and both kinds of fault (``before``: never sent; ``after``: applied, answer lost) a fresh record
is prepared the same way, the operation is called with request N failing, and the caller retries the
same HTTP call while it answers 503 (the documented contract). Afterwards:

* head and history agree (storage and API), versions are contiguous, no history row lost or doubled;
* the status sequence is the one the operation must produce (an unfenced write retried after an
  ambiguous fault may legitimately record its outcome twice: nothing identifies the first attempt);
* no lock is held by two callers: a second caller is refused while the record is Processing, and a
  token handed out names the lock the head holds;
* a fenced write (with its token) retried after an ambiguous fault is answered with its record, never
  409: the retry is recognised;
* a lock call retried with its ``requestId`` ends up holding its lock; without one, a lock orphaned by an
  ambiguous failure is free again once it expires (taken over by the next lock).

Racing lock callers under random faults, each retrying with its own ``requestId``, end with exactly one
holder: never two (safety) and never none (liveness).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from common.clock import utcnow
from state import service
from tests.conftest import Caller, HttpResult
from tests.reliability.faults import WHENS, FaultPolicy, When
from tests.reliability.records import (
    check_head_and_history,
    check_one_holder,
    check_recorded_once,
    lock_id_of,
    new_key,
    read_rows,
)
from tests.reliability.tally import TALLY, scale, sized

pytestmark = pytest.mark.slow

AREA = "state faults"
ORPHAN_LOCK_SECONDS = 3
PROBLEM = "application/problem+json"


@dataclass
class Case:
    """One operation under test: how to prepare a record, the call, and what it must record."""

    name: str
    function: str
    prepare: Callable[[Caller, dict[str, Any]], dict[str, Any]]
    body: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    before: list[str]
    records: str | None  # None: the version is rewritten in place (an extension adds no version)
    # An ambiguous fault then a retry may record the outcome a second time (no token to recognise it by).
    may_repeat: bool = False
    # Answers allowed only after an ambiguous fault, when storage shows the first attempt applied.
    ambiguous_answers: tuple[int, ...] = ()
    # Run the operation on "another instance" (no cached head hints): the longer request paths.
    cold: bool = False
    # The caller sends a requestId (the same on every retry): then it must end up holding its lock.
    request_id: bool = False

    def request(self, key: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
        body = self.body(key, ctx)
        if self.request_id:
            body["requestId"] = "retry-" + key["itemKey"]
        return body


def _ok(result: HttpResult, what: str) -> dict[str, Any]:
    assert result.status == 200, f"{what}: {result.status} {result.body!r}"
    data: dict[str, Any] = result.json
    return data


def _nothing(call: Caller, key: dict[str, Any]) -> dict[str, Any]:
    return {}


def _locked(call: Caller, key: dict[str, Any]) -> dict[str, Any]:
    return {"token": _ok(call("state_lock", {"key": key}), "prepare lock")["lockToken"]}


def _failed(call: Caller, key: dict[str, Any]) -> dict[str, Any]:
    ctx = _locked(call, key)
    _ok(call("state_release", {"key": key, "error": "boom", "lockToken": ctx["token"]}), "prepare release")
    return {}


def _expired_lock(call: Caller, key: dict[str, Any]) -> dict[str, Any]:
    _ok(call("state_lock", {"key": key, "lockSeconds": 1}), "prepare short lock")
    # Expiry is judged by the storage clock, estimated from 1-second Date headers: leave a margin.
    time.sleep(2.1)
    return {}


def _processed(call: Caller, key: dict[str, Any]) -> dict[str, Any]:
    ctx = _locked(call, key)
    _ok(
        call("state_set", {"key": key, "status": "Processed", "lockToken": ctx["token"], "data": {"n": 1}}),
        "prepare set",
    )
    return {}


_CASES = [
    Case(
        "lock a new key",
        "state_lock",
        _nothing,
        lambda k, c: {"key": k, "lockSeconds": ORPHAN_LOCK_SECONDS},
        [],
        "Processing",
    ),
    Case(
        "lock a Failed record",
        "state_lock",
        _failed,
        lambda k, c: {"key": k, "lockSeconds": ORPHAN_LOCK_SECONDS},
        ["Processing", "Failed"],
        "Processing",
    ),
    Case(
        "take over an expired lock",
        "state_lock",
        _expired_lock,
        lambda k, c: {"key": k, "lockSeconds": ORPHAN_LOCK_SECONDS},
        ["Processing"],
        "Processing",
    ),
    Case(
        "set Processed with the token",
        "state_set",
        _locked,
        lambda k, c: {"key": k, "status": "Processed", "lockToken": c["token"], "data": {"n": 2}},
        ["Processing"],
        "Processed",
    ),
    Case(
        "set Skipped without a token",
        "state_set",
        _locked,
        lambda k, c: {"key": k, "status": "Skipped", "substatus": "dup"},
        ["Processing"],
        "Skipped",
        may_repeat=True,
    ),
    Case(
        "upsert a Processed record",
        "state_upsert",
        _processed,
        lambda k, c: {"key": k, "data": {"n": 3}},
        ["Processing", "Processed"],
        "Processed",
        may_repeat=True,
    ),
    Case(
        "upsert a new key",
        "state_upsert",
        _nothing,
        lambda k, c: {"key": k, "data": {"n": 4}},
        [],
        "Processed",
        may_repeat=True,
    ),
    Case(
        "release with the token",
        "state_release",
        _locked,
        lambda k, c: {"key": k, "error": "gave up", "lockToken": c["token"]},
        ["Processing"],
        "Failed",
    ),
    Case(
        "release without a token",
        "state_release",
        _locked,
        lambda k, c: {"key": k, "error": "gave up"},
        ["Processing"],
        "Failed",
        ambiguous_answers=(409,),
    ),
    Case(
        "extend with the token",
        "state_lock_extend",
        _locked,
        lambda k, c: {"key": k, "lockToken": c["token"], "lockSeconds": 600},
        ["Processing"],
        None,
    ),
]


# The lock cases once more with a requestId: a retry after a lost answer must get the lock back.
_CASES += [
    replace(c, name=c.name + " with a requestId", request_id=True)
    for c in _CASES
    if c.function == "state_lock"
]

# Every operation once on the instance that prepared the record (hints warm), once on another one.
# In CI (small scale) only the cold variants: they take the longest request paths.
# The expired-lock takeover with a requestId waits for a lock to expire per fault: full scale only.
CASES = [
    *(_CASES if scale() == "full" else []),
    *(
        replace(c, name=c.name + " (cold instance)", cold=True)
        for c in _CASES
        if scale() == "full" or not (c.request_id and c.name.startswith("take over"))
    ),
]


# How often a case is re-run when its path turned out shorter than the fault's request number.
SHORTER_PATH_RETRIES = 3


def call_with_retries(
    call: Caller, function: str, body: dict[str, Any], where: str
) -> tuple[HttpResult, int]:
    """The documented client behaviour: on 503 (problem+json), send the same call again."""
    for attempt in range(1, 6):
        result = call(function, body)
        if result.status != 503:
            return result, attempt
        TALLY.check(AREA, result.content_type.startswith(PROBLEM), f"{where}: 503 is not problem+json")
    raise AssertionError(f"{where}: still 503 after 5 attempts")


def count_requests(faults: FaultPolicy, call: Caller, case: Case, restart: Callable[[], None]) -> int:
    # Twice, the fewer counted: a process's first lock in a partition and expiry minute also prepares the
    # expiry index (+2 requests, once); a later run that does so only has more requests to fail.
    counts = []
    for _ in range(2):
        key = new_key()
        ctx = case.prepare(call, key)
        if case.cold:
            restart()
        with faults.plan() as plan:
            result = call(case.function, case.request(key, ctx))
        assert result.status == 200, f"{case.name}: clean run answered {result.status} {result.body!r}"
        TALLY.add(AREA, operations=1)
        counts.append(len(plan.requests))
    return min(counts)


def run_case(
    faults: FaultPolicy, call: Caller, case: Case, index: int, when: When, restart: Callable[[], None]
) -> dict[str, Any] | None:
    """One fault; returns the key when the record is left Processing (its lock must free itself)."""
    where = f"{case.name}, request #{index} fails {when}"
    for _ in range(SHORTER_PATH_RETRIES):
        key = new_key()
        ctx = case.prepare(call, key)
        if case.cold:
            restart()
        with faults.plan(index, when) as plan:
            result, attempts = call_with_retries(call, case.function, case.request(key, ctx), where)
        TALLY.add(AREA, operations=attempts, faults=len(plan.injected))
        # The path may be shorter than the one counted (a fault that ends it early on a retry's path, a
        # minute prepared by the counting runs): then request #index was never made; the same fault is
        # tried again on a fresh key.
        if plan.injected or len(plan.requests) >= index:
            break
    TALLY.check(AREA, len(plan.injected) == 1, f"{where}: expected one injected fault, got {plan.injected}")
    rows = check_head_and_history(AREA, call, key, where)

    # The status sequence the operation must leave (nothing lost, nothing recorded twice).
    once = [*case.before, case.records] if case.records is not None else list(case.before)
    allowed = [once] + (
        [[*once, case.records]] if case.may_repeat and when == "after" and case.records else []
    )
    check_recorded_once(AREA, rows, allowed, where)

    # The answer: success, or (ambiguous only) the documented refusal of a retry whose first try applied.
    if result.status != 200:
        TALLY.check(
            AREA,
            when == "after" and result.status in case.ambiguous_answers and rows.statuses == once,
            f"{where}: answered {result.status} {result.body!r} with statuses {rows.statuses}",
        )
        TALLY.check(AREA, result.content_type.startswith(PROBLEM), f"{where}: error is not problem+json")

    # No lock held by two callers.
    assert rows.head is not None
    holding = rows.head["Status"] == 2
    answer = result.json if result.status == 200 else {}
    token = answer.get("lockToken") if case.function in ("state_lock", "state_lock_extend") else None
    if case.function == "state_lock":
        if answer.get("acquired"):
            TALLY.check(
                AREA, token and lock_id_of(token) == rows.head.get("LockId"), f"{where}: token/head lock"
            )
        else:
            # Refused only because its own first attempt took the lock (ambiguous): an orphan, held by
            # nobody. With a requestId the retry is recognised, so a refusal is a lost lock (liveness).
            TALLY.check(
                AREA,
                not case.request_id and when == "after" and holding,
                f"{where}: lock refused: {result.body!r}",
            )
    if case.function == "state_lock_extend":
        TALLY.check(AREA, token and lock_id_of(token) == rows.head.get("LockId"), f"{where}: extended token")
    if holding:
        other = call("state_lock", {"key": key})  # the suite's probe of the invariant: not an operation
        TALLY.check(
            AREA,
            other.status == 200 and other.json["acquired"] is False,
            f"{where}: a second caller got {other.status} {other.body!r} while the record is Processing",
        )
        if case.function == "state_lock" and not answer.get("acquired"):
            return key
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_fault_on_any_request_of_a_state_operation_leaves_the_record_consistent(
    faulty_tables, restart, call, case
):
    # Given the number of storage requests the operation makes on a record prepared this way
    requests = count_requests(faulty_tables, call, case, restart)
    assert requests >= 1
    orphans: list[dict[str, Any]] = []
    # When each of them fails, before it is sent and after it was applied, and the caller retries
    for index in range(1, requests + 1):
        for when in WHENS:
            orphan = run_case(faulty_tables, call, case, index, when, restart)
            if orphan is not None:
                orphans.append(orphan)
    # Then (checked per case) the record is consistent; and an orphaned lock is free once it expires
    if orphans:
        time.sleep(ORPHAN_LOCK_SECONDS + 0.5)
        for key in orphans:
            again = call("state_lock", {"key": key})
            TALLY.add(AREA, operations=1)
            TALLY.check(
                AREA,
                again.status == 200 and again.json["acquired"] and again.json["takeover"],
                f"{case.name}: an orphaned lock was not taken over after it expired: {again.body!r}",
            )
            check_head_and_history(AREA, call, key, f"{case.name}: takeover of an orphan")


# CI runs one case (three requests, a read among them) with the SDK's retries on; full scale every one.
COLD = [c for c in CASES if c.cold and (scale() == "full" or c.name.startswith("lock a Failed"))]


@pytest.mark.parametrize("case", COLD, ids=[c.name for c in COLD])
def test_with_the_sdks_own_retries_on_a_fault_still_leaves_the_record_consistent(
    faulty_tables_sdk_retries, restart, call, case
):
    # Given the production client set-up (the SDK retries reads and deletes itself, never inserts/batches)
    faults = faulty_tables_sdk_retries
    requests = count_requests(faults, call, case, restart)
    orphans = []
    # When each request fails before/after and the caller retries 503s
    for index in range(1, requests + 1):
        for when in WHENS:
            orphan = run_case(faults, call, case, index, when, restart)
            if orphan is not None:
                orphans.append(orphan)
    # Then the same promises hold (an orphaned lock is taken over once it expires)
    if orphans:
        time.sleep(ORPHAN_LOCK_SECONDS + 0.5)
        for key in orphans:
            again = call("state_lock", {"key": key})
            TALLY.add(AREA, operations=1)
            TALLY.check(
                AREA, again.status == 200 and again.json["takeover"], f"{case.name}: orphan {again.body!r}"
            )


def test_a_fault_on_any_request_of_catch_up_converts_each_expired_lock_exactly_once(
    faulty_tables, new_tables, call
):
    def prepare() -> tuple[dict[str, Any], dict[str, Any]]:
        new_tables()  # catch-up reads the whole index: each case gets tables of its own
        expired, live = new_key(), new_key()
        _ok(call("state_lock", {"key": expired, "lockSeconds": 60}), "prepare")
        _ok(call("state_lock", {"key": live, "lockSeconds": 3600}), "prepare")
        return expired, live

    later = lambda: utcnow() + timedelta(seconds=600)  # noqa: E731 - the expired lock is past, the live one not
    expired, live = prepare()
    with faulty_tables.plan() as plan:
        result = service.catchup().run(now=later())
    assert result.locks_failed == 1
    requests = len(plan.requests)
    TALLY.add(AREA, operations=1)
    for index in range(1, requests + 1):
        for when in WHENS:
            where = f"catch-up, request #{index} fails {when}"
            expired, live = prepare()
            runs = 0
            with faulty_tables.plan(index, when) as plan:
                while runs < 3:  # the timer simply runs again on its next schedule
                    runs += 1
                    try:
                        # A fault on one of its workers' requests (they carry the plan, as they carry the
                        # caller's context) ends a run early, reported as storage busy: the next run goes on.
                        if not service.catchup().run(now=later()).storage_busy:
                            break
                    except Exception as exc:
                        TALLY.check(AREA, "injected fault" in str(exc), f"{where}: unexpected {exc!r}")
            TALLY.add(AREA, operations=runs, faults=len(plan.injected))
            rows = check_head_and_history(AREA, call, expired, where)
            TALLY.check(AREA, rows.statuses == ["Processing", "Failed"], f"{where}: statuses {rows.statuses}")
            assert rows.head is not None
            TALLY.check(
                AREA, rows.head.get("Substatus") == "LockExpired", f"{where}: {rows.head.get('Substatus')}"
            )
            live_rows = read_rows(live)
            TALLY.check(AREA, live_rows.statuses == ["Processing"], f"{where}: a live lock was touched")
            # The index row of the converted lock is gone after the runs (nothing left to redo).
            again = service.catchup().run(now=later())
            TALLY.check(
                AREA,
                again.index_rows_read == 0 or again.locks_failed == 0,
                f"{where}: a later run converted again: {again}",
            )
            TALLY.check(AREA, again.locks_failed == 0, f"{where}: a later run failed another lock: {again}")


def _race_lock(
    faults: FaultPolicy, call: Caller, key: dict[str, Any], seeds: list[int]
) -> tuple[list[dict[str, Any]], int, int]:
    """Callers lock ``key`` at the same instant, each with random faults, retrying 503s with the same
    ``requestId`` (the documented remedy for a lost answer)."""
    barrier = threading.Barrier(len(seeds))
    answers: list[dict[str, Any]] = []
    counts = {"attempts": 0, "faults": 0}
    guard = threading.Lock()

    def caller(seed: int) -> None:
        with faults.plan(when=WHENS[seed % 2], rate=0.33, limit=3, seed=seed) as plan:
            barrier.wait()
            body = {"key": key, "lockSeconds": 600, "requestId": f"racer-{seed}"}
            result, attempts = call_with_retries(call, "state_lock", body, "race")
        with guard:
            answers.append(result.json if result.status == 200 else {"status": result.status})
            counts["attempts"] += attempts
            counts["faults"] += len(plan.injected)

    workers = [threading.Thread(target=caller, args=(seed,)) for seed in seeds]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    return answers, counts["attempts"], counts["faults"]


def test_racing_lock_callers_under_random_faults_end_with_exactly_one_holder(faulty_tables, call):
    # Given keys that eight callers lock at the same instant, a third of their storage requests failing,
    # each caller retrying a 503 with its own requestId
    threads = 8
    for round_no in range(sized(30, 6)):
        key = new_key()
        if round_no % 2:  # half the keys start as a Failed record (re-acquisition: conditional replace)
            _failed(call, key)
        seeds = [round_no * threads + i for i in range(threads)]
        answers, attempts, injected = _race_lock(faulty_tables, call, key, seeds)
        TALLY.add(AREA, operations=attempts, faults=injected, races=1)
        # Then exactly one caller holds the lock (never two, never none), and it is the lock the head holds
        where = f"lock race {round_no}"
        rows = check_head_and_history(AREA, call, key, where)
        check_one_holder(AREA, answers, threads, rows.head, where)
        # and the record went to Processing exactly once in this round
        expected = ["Processing"] if round_no % 2 == 0 else ["Processing", "Failed", "Processing"]
        check_recorded_once(AREA, rows, [expected], where)


def test_catch_up_on_several_instances_at_once_converts_each_expired_lock_once(faulty_tables, call):
    # Given expired and live locks, flushed to the expiry index
    from common import runtime
    from state.catchup import Catchup
    from state.store import StateStore

    expired = [new_key() for _ in range(sized(20, 6))]
    live = [new_key() for _ in range(3)]
    for key in expired:
        _ok(call("state_lock", {"key": key, "lockSeconds": 60}), "prepare")
    for key in live:
        _ok(call("state_lock", {"key": key, "lockSeconds": 3600}), "prepare")
    when = utcnow() + timedelta(seconds=600)
    # When three instances run catch-up at the same instant, with random storage faults, each retrying
    barrier = threading.Barrier(3)
    runs = {"count": 0, "faults": 0}
    guard = threading.Lock()

    def instance(seed: int) -> None:
        store = StateStore(runtime.tables())
        with faulty_tables.plan(when=WHENS[seed % 2], rate=0.1, limit=4, seed=seed) as plan:
            barrier.wait()
            for _ in range(6):  # the timer fires again after a failed run
                with guard:
                    runs["count"] += 1
                try:
                    Catchup(store).run(now=when)
                    break
                except Exception as exc:
                    TALLY.check(AREA, "injected fault" in str(exc), f"catch-up raised {exc!r}")
        with guard:
            runs["faults"] += len(plan.injected)

    workers = [threading.Thread(target=instance, args=(seed,)) for seed in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    TALLY.add(AREA, operations=runs["count"], faults=runs["faults"], races=1)
    # Then every expired lock became Failed exactly once, and the live ones were not touched
    for key in expired:
        rows = check_head_and_history(AREA, call, key, "concurrent catch-up")
        TALLY.check(AREA, rows.statuses == ["Processing", "Failed"], f"concurrent catch-up: {rows.statuses}")
    for key in live:
        TALLY.check(
            AREA, read_rows(key).statuses == ["Processing"], "concurrent catch-up touched a live lock"
        )
