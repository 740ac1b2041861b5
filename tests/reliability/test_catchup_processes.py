"""Catch-up scaled out over separate OS processes catches each expired lock up once (state/catchup.py,
ADR-0011).

Each instance is its own Python process (``tests/reliability/catchup_child.py``) running what the app's
timer runs (``service.catchup().drain()``) with its own lease owner and clock estimate, against the same
Azurite tables, over a backlog of expired locks spread over ``SETTLE_STATE_SHARDS=4`` partitions. Each
process reaches storage through a proxy of its own, and every proxy charges one shared storage budget
(bench/throttle.py: Azure's targets ÷ 200), so the test knows which process each admitted request came
from and the budget holds across processes, as Azure's does.

Everything is judged from storage and from what storage was sent, never from catch-up's report:

* every expired lock is Failed exactly once (its head Failed, one history row, no lock index row left);
* each process concluded a share of the locks, each lock by one process, and each level-1 pointer (a
  minute of a partition) was written by one process only: the leases divided the work;
* no partition was written faster than its budget allows, and the budget refused something;
* an instance SIGKILLed in the middle of a pointer it leased: the other instance leaves that pointer alone
  while the lease runs, and the next run after the lease finishes it, nothing lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.proxy import CountingProxy
from bench.throttle import Budget, Charge, Refusal
from common import runtime
from state import service
from state.keys import (
    EXPIRY_TABLE,
    INDEX_MARK,
    SHARD_MARK,
    STATE_TABLE,
    is_marker,
    parse_index_row_key,
    partition_key,
)
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from tests.conftest import new_prefix
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow
AREA = "catch-up processes"
ROOT = Path(__file__).resolve().parents[2]
SHARDS = 4
TENANT, SCOPE, ENTITY = 3, 4, 21


class _Seat(Budget):
    """One process's door to the shared budget: what the budget admitted for it, and what it refused."""

    def __init__(self, shared: Budget) -> None:
        super().__init__()
        self.shared = shared
        self.rows_written: list[
            tuple[float, tuple[str, str, str]]
        ] = []  # (when, (table, PartitionKey, RowKey))
        self.refused_status: Counter[int] = Counter()

    def admit(self, charge: Charge) -> Refusal | None:
        refusal = self.shared.admit(charge)
        at = time.monotonic()
        with self._lock:
            if refusal is not None:
                self.refused_status[refusal.status] += 1
            elif charge.write:
                self.rows_written.extend((at, row) for row in charge.rows)
        return refusal

    def charge_rows(self, account: str, table: str, body: bytes) -> None:
        self.shared.charge_rows(account, table, body)


@dataclass
class _Instance:
    name: str
    seat: _Seat
    proxy: CountingProxy
    process: subprocess.Popen[str] | None = None
    owner: str = ""
    lines: list[str] = field(default_factory=list)


def _endpoint(connection: str) -> str:
    value = next(p.split("=", 1)[1] for p in connection.split(";") if p.startswith("TableEndpoint"))
    return value.rsplit("/", 1)[0]


@pytest.fixture
def backlog_tables(azurite_connection: str, settle_tables: str) -> Iterator[str]:
    """Empty tables of this test's own, records spread over SHARDS partitions per node."""
    saved = {k: os.environ.get(k) for k in ("SETTLE_TABLE_PREFIX", "SETTLE_STATE_SHARDS")}
    prefix = new_prefix()
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    os.environ["SETTLE_STATE_SHARDS"] = str(SHARDS)
    runtime.reset()
    try:
        yield prefix
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        runtime.reset()


def _backlog(count: int) -> datetime:
    """``count`` locks of one second on one node (spread over its shards); when the last one expires."""
    store = service.store()
    ctx = WriteContext()
    untils = []
    for n in range(count):
        outcome = store.lock(RecordKey(TENANT, Scope(SCOPE), ENTITY, "invoice", f"item-{n}"), ctx, 1)
        assert outcome.acquired and outcome.locked_until is not None
        untils.append(outcome.locked_until)
    return max(untils)


def _rows(table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (of the state table: the node's rows only)."""
    rows = [dict(e) for e in runtime.tables().table(table).list_entities()]
    if table == STATE_TABLE:
        node = partition_key(TENANT, SCOPE, ENTITY) + SHARD_MARK
        rows = [r for r in rows if str(r["PartitionKey"]).startswith(node)]
    return rows


def _pointers_of_locks() -> dict[str, tuple[str, int]]:
    """Each item's level-1 pointer (state partition, minute), from the entry naming its lock in a marker of
    that minute (ADR-0021: ``L{lockId}`` = ``{expiry ms}|{head RowKey}``), or a lock index row of the code
    before it."""
    out: dict[str, tuple[str, int]] = {}
    for row in _rows(STATE_TABLE):
        rk = str(row["RowKey"])
        if not rk.startswith(INDEX_MARK):
            continue
        if "StateRK" in row:
            out[_item(str(row["StateRK"]))] = (str(row["PartitionKey"]), parse_index_row_key(rk)[1])
        elif is_marker(rk):
            for name, value in row.items():
                if name.startswith("L"):
                    head = str(value).split("|", 1)[1]
                    out[_item(head)] = (str(row["PartitionKey"]), int(rk.split("|")[1]))
    return out


def _item(head_or_history_rk: str) -> str:
    return head_or_history_rk.split("|")[1]


def _start(instances: list[_Instance], connection: str, **args: Any) -> None:
    """Start one process per instance, each through its own proxy; return once every one is ready."""
    for inst in instances:
        env = dict(os.environ)
        env["SETTLE_TABLES"] = inst.proxy.connection_string(connection)
        env["STATE_CATCHUP_PARALLELISM"] = "2"  # fewer workers than pointers: instances must share
        inst.process = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.catchup_child", json.dumps(args.get(inst.name, {}))],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for inst in instances:
        assert inst.process is not None and inst.process.stdout is not None
        ready = json.loads(inst.process.stdout.readline() or "{}")
        assert ready.get("ready"), f"{inst.name} did not start"
        inst.owner = str(ready["owner"])


def _go(instances: list[_Instance]) -> None:
    for inst in instances:
        assert inst.process is not None and inst.process.stdin is not None
        inst.process.stdin.write("go\n")
        inst.process.stdin.flush()


def _wait(inst: _Instance, timeout: float = 240) -> int:
    assert inst.process is not None and inst.process.stdout is not None
    out, _ = inst.process.communicate(timeout=timeout)
    inst.lines = [line for line in out.splitlines() if line.strip()]
    return int(inst.process.returncode)


def _instances(connection: str, shared: Budget, names: list[str]) -> list[_Instance]:
    out = []
    for name in names:
        seat = _Seat(shared)
        out.append(_Instance(name, seat, CountingProxy(_endpoint(connection), budget=seat).start()))
    return out


def _concluded(inst: _Instance) -> Counter[str]:
    """Items whose head this instance's admitted transactions wrote (catch-up writes a head only to
    conclude it): what reached storage from this process."""
    return Counter(
        _item(rk)
        for _, (table, _pk, rk) in inst.seat.rows_written
        if table.endswith(STATE_TABLE) and rk.endswith("|c")
    )


def _pointers_written(inst: _Instance, pointers: dict[str, tuple[str, int]]) -> set[tuple[str, int]]:
    """The level-1 pointers (state partition, minute) whose rows this instance wrote: every catch-up
    write in the state table is an index row or marker of one minute, or the head of a lock it concluded
    (whose pointer ``pointers`` gives: a conclusion deletes no row, ADR-0021)."""
    out = set()
    for _, (table, pk, rk) in inst.seat.rows_written:
        if table.endswith(STATE_TABLE) and rk.startswith(INDEX_MARK):
            out.add((pk, parse_index_row_key(rk)[1] if not is_marker(rk) else int(rk.split("|")[1])))
    out |= {pointers[item] for item in _concluded(inst) if item in pointers}
    return out


def _check_every_lock_failed_once(count: int, where: str) -> None:
    """From storage: every head Failed (LockExpired), one history row each, no lock index row left."""
    rows = _rows(STATE_TABLE)
    heads = {_item(str(r["RowKey"])): r for r in rows if str(r["RowKey"]).endswith("|c")}
    history = Counter(
        _item(str(r["RowKey"]))
        for r in rows
        if not str(r["RowKey"]).startswith(INDEX_MARK) and not str(r["RowKey"]).endswith("|c")
    )
    left = [r for r in rows if str(r["RowKey"]).startswith(f"{INDEX_MARK}l") and "StateRK" in r]
    TALLY.check(AREA, len(heads) == count, f"{where}: {len(heads)} heads, expected {count}")
    not_failed = [i for i, h in heads.items() if int(h["Status"]) != int(Status.FAILED)]
    TALLY.check(AREA, not not_failed, f"{where}: not Failed (lock lost): {sorted(not_failed)[:5]}")
    wrong = [i for i, h in heads.items() if h.get("Substatus") != "LockExpired"]
    TALLY.check(AREA, not wrong, f"{where}: concluded otherwise than LockExpired: {sorted(wrong)[:5]}")
    TALLY.check(
        AREA,
        set(history) == set(heads) and set(history.values()) == {1},
        f"{where}: history rows per item {dict(history)} (each must be exactly 1)",
    )
    TALLY.check(AREA, not left, f"{where}: {len(left)} lock index rows left")


def _check_within_budget(instances: list[_Instance], shared: Budget, where: str) -> int:
    """No partition was written faster than its budget allows over any second (the bucket holds one
    second of budget, refills at its rate, and a transaction may overdraw by its size less one), across
    processes; returns the most entities written in one partition in one second."""
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    for inst in instances:
        for at, (table, pk, _rk) in inst.seat.rows_written:
            per[(table, pk)].append(at)
    peak = 0
    for times in per.values():
        times.sort()
        first = 0
        for last, at in enumerate(times):
            while at - times[first] > 1.0:
                first += 1
            peak = max(peak, last - first + 1)
    allowed = 2 * shared.partition_per_s + 2
    TALLY.check(AREA, peak <= allowed, f"{where}: a partition took {peak} writes in one second (> {allowed})")
    return peak


def _wait_until_expired(until: datetime) -> None:
    """The children judge expiry by the earliest the storage clock may read: wait past it, with margin."""
    left = (until + timedelta(seconds=2) - datetime.now(UTC)).total_seconds()
    if left > 0:
        time.sleep(left)


def test_two_processes_divide_a_backlog_and_fail_every_expired_lock_exactly_once(
    azurite_connection: str, backlog_tables: str
) -> None:
    count = sized(96, 48)
    where = f"{count} expired locks, 2 processes"
    # Given a backlog of expired locks on one node spread over 4 partitions
    until = _backlog(count)
    pointers = _pointers_of_locks()
    assert len(pointers) == count and len({p for p, _ in pointers.values()}) == SHARDS
    shared = Budget.scaled()
    instances = _instances(azurite_connection, shared, ["a", "b"])
    try:
        _start(instances, azurite_connection)
        _wait_until_expired(until)
        # When two instances, separate processes, run catch-up at the same moment under one budget
        _go(instances)
        codes = [_wait(inst) for inst in instances]
    finally:
        for inst in instances:
            inst.proxy.stop()
    TALLY.add(AREA, operations=2, races=1, faults=shared.refusals())
    TALLY.check(AREA, codes == [0, 0], f"{where}: exit codes {codes}")
    # Then every expired lock is Failed exactly once, read from storage
    _check_every_lock_failed_once(count, where)
    # And each process concluded a share, each lock concluded by one process only
    shares = [_concluded(inst) for inst in instances]
    TALLY.check(AREA, all(shares), f"{where}: a process concluded nothing: {[len(s) for s in shares]}")
    twice = {i for i in pointers if sum(s[i] for s in shares) != 1}
    TALLY.check(AREA, not twice, f"{where}: concluded by more or fewer than one process: {sorted(twice)[:5]}")
    # And each pointer (a minute of a partition) was written by one process: the leases held
    written = [_pointers_written(inst, pointers) for inst in instances]
    shared_pointers = written[0] & written[1]
    TALLY.check(AREA, not shared_pointers, f"{where}: pointers written by both processes: {shared_pointers}")
    # (where a minute is not closed yet, level 1 still says who leased it: the process that wrote it)
    owners = {inst.owner: written[n] for n, inst in enumerate(instances)}
    for row in _rows(EXPIRY_TABLE):
        if not str(row["PartitionKey"]).startswith("l"):
            continue
        pointer = (str(row["RowKey"]), int(str(row["PartitionKey"])[1:]))
        if pointer in set(pointers.values()):
            by = str(row.get("LeasedBy"))
            TALLY.check(AREA, by in owners, f"{where}: {pointer} leased by {by}, not by an instance")
            TALLY.check(
                AREA, pointer in owners[by], f"{where}: {pointer} leased by {by}, written by the other"
            )
    # And no partition was written beyond its budget, which did refuse (the processes were throttled)
    peak = _check_within_budget(instances, shared, where)
    print(
        f"{where}: locks concluded per process {[sum(s.values()) for s in shares]}, pointers written"
        f" {[len(w) for w in written]}, budget refused {shared.refusals()}, peak partition writes/s {peak}"
    )
    TALLY.check(AREA, shared.refusals() > 0, f"{where}: the budget refused nothing: the test proved nothing")


def test_a_process_killed_mid_run_loses_nothing_and_its_lease_is_respected_until_it_ends(
    azurite_connection: str, backlog_tables: str
) -> None:
    count = sized(96, 48)
    lease_ms = 8_000
    where = f"{count} expired locks, one process SIGKILLed"
    until = _backlog(count)
    pointers = _pointers_of_locks()
    shared = Budget.scaled()
    first = _instances(azurite_connection, shared, ["killed", "other"])
    nxt: list[_Instance] = []
    try:
        # Given two instances, one of which is killed after its third transaction (mid-pointer)
        _start(
            first,
            azurite_connection,
            killed={"lease_ms": lease_ms, "kill_after": 3},
            other={"lease_ms": lease_ms},
        )
        _wait_until_expired(until)
        _go(first)
        codes = [_wait(inst) for inst in first]
        TALLY.check(AREA, codes[0] == -9 and codes[1] == 0, f"{where}: exit codes {codes}")
        killed, other = first
        # Then the pointers it still holds a lease on were left alone by the other instance
        held = {
            (str(r["RowKey"]), int(str(r["PartitionKey"])[1:])): r["LeasedUntil"]
            for r in _rows(EXPIRY_TABLE)
            if r.get("LeasedBy") == killed.owner
        }
        TALLY.check(AREA, held, f"{where}: the killed process holds no lease")
        TALLY.check(
            AREA,
            not (_pointers_written(other, pointers) & set(held)),
            f"{where}: the other process wrote in pointers leased by the killed one: "
            f"{_pointers_written(other, pointers) & set(held)}",
        )
        done = _concluded(killed) + _concluded(other)
        left = [i for i, p in pointers.items() if p in held and not done[i]]
        TALLY.check(AREA, left, f"{where}: the killed process left no work behind (not killed mid-pointer)")
        # When the next run starts after the lease has ended
        _wait_until_expired(max(held.values()))
        nxt += _instances(azurite_connection, shared, ["next"])
        _start(nxt, azurite_connection, next={"lease_ms": lease_ms})
        _go(nxt)
        TALLY.check(AREA, _wait(nxt[0]) == 0, f"{where}: the next run failed")
    finally:
        for inst in [*first, *nxt]:
            inst.proxy.stop()
            if inst.process is not None and inst.process.poll() is None:
                inst.process.kill()
    TALLY.add(AREA, operations=3, races=1, faults=1 + shared.refusals())
    # Then every expired lock is Failed exactly once, read from storage: nothing lost, nothing twice
    _check_every_lock_failed_once(count, where)
    everyone = [*first, *nxt]
    shares = [_concluded(inst) for inst in everyone]
    twice = {i for i in pointers if sum(s[i] for s in shares) != 1}
    TALLY.check(AREA, not twice, f"{where}: concluded by more or fewer than one process: {sorted(twice)[:5]}")
    TALLY.check(AREA, all(shares), f"{where}: some instance concluded nothing: {[len(s) for s in shares]}")
    peak = _check_within_budget(everyone, shared, where)
    print(
        f"{where}: locks concluded by killed / other / next {[sum(s.values()) for s in shares]}, pointers"
        f" held by the killed one {len(held)}, budget refused {shared.refusals()},"
        f" peak partition writes/s {peak}"
    )
