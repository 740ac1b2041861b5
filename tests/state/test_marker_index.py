"""ADR-0021: the minute's marker is the lock index. The adversary's cases, on the real ``StateStore`` and
``Catchup`` over the in-memory table (its gate holds and reorders writes deterministically):

* a lock merging its entry into a marker **between** catch-up's read of that marker and its delete: the
  delete is ``If-Match`` the read's ETag, so it fails (412), catch-up reads the minute again and concludes
  the new lock too (with ``If-Match *`` the marker, and the lock's only entry, would go);
* the 241st lock of one minute, one partition and one process goes into a second marker (an entity holds
  252 user properties; a marker holds at most 240 entries), and every lock is still caught up;
* migration: rows an earlier version wrote (a level-2 lock row beside its head, an ``m`` marker without
  entries) are still caught up, a stale one (the new code concluded or moved its lock) is dropped, and a
  legacy row landing while catch-up closes its minute is found by the re-read.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from azure.data.tables import UpdateMode

from state import catchup
from state.catchup import Catchup
from state.expiry import MARKER_ENTRIES
from state.keys import LEGACY_MARKER_MARK, Layout, bucket_of, head_row_key, is_marker
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.rows import IndexRow
from state.store import StateStore
from tests.support.memory_table import MemoryTables

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the start of a minute
CTX = WriteContext()
# The most user properties an entity holds (shared/reference/idempotency-anchors.md: 255 with
# PartitionKey, RowKey and Timestamp).
ENTITY_PROPERTIES = 252


def key(n: int | str, entity: int = 3) -> RecordKey:
    return RecordKey(7, Scope.ELEMENT, entity, "invoice", f"INV-{n}")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    at = Clock()
    with mock.patch.multiple("state.store", utcnow=at, earliest_now=at, latest_now=at):
        yield at


@pytest.fixture
def tables() -> MemoryTables:
    return MemoryTables()


def markers(tables: MemoryTables) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        k: row for k, row in tables.table("state").rows.items() if k[1].startswith("~l") and is_marker(k[1])
    }


def entries(row: dict[str, Any]) -> dict[str, str]:
    return {name: value for name, value in row.items() if name.startswith("L") and "@" not in name}


def index_left(tables: MemoryTables) -> tuple[list[str], list[tuple[str, str]]]:
    """(every ``~`` row of the state table, every level-1 row)."""
    state = [rk for (_, rk) in tables.table("state").rows if rk.startswith("~")]
    level1 = [k for k in tables.table("statelocks").rows if k[0][:1] in "lr"]
    return state, level1


def status_of(store: StateStore, k: RecordKey) -> Status:
    head = store.read_head(k)
    assert head is not None
    return head.status


def test_a_lock_merged_between_catch_ups_read_of_its_marker_and_the_delete_is_caught_up(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    # Given a lock of minute M (its marker names it) that expired
    first = store.lock(key("a"), CTX, 1)
    assert first.acquired
    (marker_key,) = markers(tables)
    late: list[Any] = []

    # When a second lock of M, by the same process (its marker cached), merges its entry into that marker
    # after catch-up read it and before catch-up's delete of it is applied
    def lock_lands_first(call: str, args: tuple[Any, ...]) -> None:
        if call == "delete_entity" and str(args[0]).endswith("state") and (args[1], args[2]) == marker_key:
            tables.gate = None
            late.append(store.lock(key("b"), CTX, 1))
            assert len(entries(tables.table("state").rows[marker_key])) == 2  # the same marker took it

    tables.gate = lock_lands_first
    result = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    # Then the delete failed (412), the minute was read again, and both locks were concluded
    assert late and late[0].acquired
    assert result.locks_failed == 2
    assert status_of(store, key("a")) is Status.FAILED and status_of(store, key("b")) is Status.FAILED
    # and the minute was closed: no marker, no level-1 row
    assert result.minutes_closed == 1 and index_left(tables) == ([], [])


def test_the_241st_lock_of_one_minute_and_process_goes_into_a_new_marker_and_all_are_caught_up(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    sizes: list[int] = []

    def count(call: str, args: tuple[Any, ...]) -> None:
        if call == "submit_transaction" and str(args[0]).endswith("state"):
            sizes.append(len(args[1]))

    tables.gate = count
    # Given 241 locks of one partition, one process, all expiring in one minute
    for n in range(MARKER_ENTRIES + 1):
        assert store.lock(key(n), CTX, 1).acquired
    tables.gate = None
    # Then each was one transaction of 2 entity writes (the head, the marker merge naming it)
    assert sizes == [2] * (MARKER_ENTRIES + 1)
    # and the minute holds two markers of this process: 240 entries and 1, each within an entity's limit
    found = markers(tables)
    assert sorted(len(entries(row)) for row in found.values()) == [1, MARKER_ENTRIES]
    properties = [[name for name in row if "@" not in name] for row in found.values()]
    assert all(len(names) - 2 <= ENTITY_PROPERTIES for names in properties)  # less its two keys
    assert {rk.split("|")[1] for (_, rk) in found} == {f"{bucket_of(int(T0.timestamp() * 1000) + 1000):010d}"}
    # When catch-up runs once the minute is over
    result = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    # Then every lock is Failed, and the index is empty
    assert result.locks_failed == MARKER_ENTRIES + 1
    assert {status_of(store, key(n)) for n in range(MARKER_ENTRIES + 1)} == {Status.FAILED}
    assert index_left(tables) == ([], [])


def _strip_entry(tables: MemoryTables, store: StateStore, k: RecordKey) -> tuple[str, str, str]:
    """Take ``k``'s lock entry out of its marker (the marker goes with its last entry), as if the code
    before ADR-0021 had taken the lock. Returns (partition, the head's lock index key, the head's RowKey)."""
    table = tables.table("state")
    head = store.read_head(k)
    assert head is not None and head.row.lock_index_key is not None
    pk, rk = head.row.partition_key, head.row.row_key
    for marker_pk, marker_rk in list(markers(tables)):
        row = table.rows[(marker_pk, marker_rk)]
        named = [name for name, value in entries(row).items() if value.endswith(f"|{rk}")]
        if marker_pk != pk or not named:
            continue
        if len(entries(row)) == len(named):
            table.delete_entity(marker_pk, marker_rk)
        else:
            kept = {n: v for n, v in row.items() if not n.startswith("L") or n not in named}
            kept = {n: v for n, v in kept.items() if not n.startswith(("@", "odata", "Timestamp"))}
            table.update_entity(kept, mode=UpdateMode.REPLACE)
    return pk, head.row.lock_index_key, rk


def _legacy_lands(tables: MemoryTables, pk: str, index_key: str, head_rk: str) -> None:
    """What the earlier code's lock transaction added beside its head: the level-2 row, and the merge of its
    minute's ``m`` marker (inserted first when this process had none: its preparation)."""
    table = tables.table("state")
    marker = f"~l|{index_key.split('|')[1]}|{LEGACY_MARKER_MARK}{'0' * 32}"
    if (pk, marker) not in table.rows:
        table.create_entity({"PartitionKey": pk, "RowKey": marker})
    table.create_entity(IndexRow(pk, index_key, head_rk).to_entity())
    table.update_entity({"PartitionKey": pk, "RowKey": marker}, mode=UpdateMode.MERGE)


def _as_written_before(tables: MemoryTables, store: StateStore, k: RecordKey) -> str:
    """``k``'s lock as the code before ADR-0021 wrote it: a level-2 row, an ``m`` marker, no entry."""
    pk, index_key, rk = _strip_entry(tables, store, k)
    _legacy_lands(tables, pk, index_key, rk)
    return index_key


def test_level_two_rows_of_the_earlier_code_are_still_caught_up_and_stale_ones_dropped(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    # Given three locks of minute M as the earlier code wrote them (a level-2 row each, an "m" marker)
    tokens = {n: store.lock(key(n), CTX, 1).token for n in "abc"}
    rows = {n: _as_written_before(tables, store, key(n)) for n in "abc"}
    assert not [rk for (_, rk) in markers(tables) if "|n" in rk]
    # and the new code then finished b (deleting no row) and extended c into minute M + 3
    store.record(
        key("b"), CTX, status=Status.PROCESSED, envelope_props=None, substatus=None, error=None,
        token_text=tokens["b"], digest="d",
    )  # fmt: skip
    store.extend(key("c"), CTX, str(tokens["c"]), 180)
    state = tables.table("state").rows
    assert all(any(k[1] == row for k in state) for row in rows.values())  # every level-2 row still there
    # When catch-up runs after M is over
    first = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    # Then a is Failed by its level-2 row, b stays Processed, c (moved) is still Processing, and M is
    # closed: its rows (a's, and b's and c's, stale) and its marker are gone
    assert status_of(store, key("a")) is Status.FAILED
    assert status_of(store, key("b")) is Status.PROCESSED
    assert status_of(store, key("c")) is Status.PROCESSING
    assert first.locks_failed == 1 and first.stale_index_rows == 2 and first.minutes_closed == 1
    left, _ = index_left(tables)
    assert not [rk for rk in left if rk.startswith(f"~l|{rows['a'].split('|')[1]}|")]
    # and c is concluded in its new minute, by the entry its extension merged there
    later = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=6))
    assert later.locks_failed == 1 and status_of(store, key("c")) is Status.FAILED
    assert index_left(tables) == ([], [])


def test_a_level_two_row_of_the_earlier_code_landing_while_a_minute_closes_is_found(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    # Given a lock of minute M in the earlier code's shape (a level-2 row, an "m" marker), and a second
    # lock of M by an instance of the earlier code whose transaction has not applied yet
    store.lock(key("a"), CTX, 1)
    _as_written_before(tables, store, key("a"))
    store.lock(key("b"), CTX, 1)
    pending = _strip_entry(tables, store, key("b"))
    (marker_key,) = [k for k in markers(tables) if f"|{LEGACY_MARKER_MARK}" in k[1]]
    landed: list[bool] = []

    # When that transaction (its level-2 row, its merge of the marker) applies after catch-up read the
    # minute and before its delete of the marker
    def old_lock_lands(call: str, args: tuple[Any, ...]) -> None:
        if call == "delete_entity" and (args[1], args[2]) == marker_key and not landed:
            tables.gate = None
            _legacy_lands(tables, *pending)
            landed.append(True)
            tables.gate = old_lock_lands

    tables.gate = old_lock_lands
    result = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    tables.gate = None
    # Then it is found (the merge changed the marker's ETag, so the delete fails and the minute is read
    # again; the re-read after the deletes, ADR-0011's, would find it too): both locks are Failed and the
    # minute is closed, nothing is left
    assert landed
    assert status_of(store, key("a")) is Status.FAILED and status_of(store, key("b")) is Status.FAILED
    assert result.locks_failed == 2
    assert index_left(tables) == ([], [])


def test_an_entry_is_named_by_lock_id_and_expiry_and_points_at_the_head(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    outcome = store.lock(key("a"), CTX, 30)
    head = store.read_head(key("a"))
    assert outcome.acquired and head is not None and head.row.locked_until is not None
    ((_, rk), row) = next(iter(markers(tables).items()))
    until = int(head.row.locked_until.timestamp() * 1000)
    assert rk.startswith(f"~l|{until // 60_000:010d}|n")
    assert entries(row) == {f"L{head.row.lock_id}": f"{until}|{head_row_key(key('a'))}"}


def test_a_minute_with_more_ended_locks_than_one_runs_budget_is_worked_through_in_one_drain(
    clock: Clock, tables: MemoryTables, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ended lock's entry stays in its marker until the minute closes: without the process remembering
    # the lock ids it saw end, every run would spend its budget re-reading the first entries
    monkeypatch.setattr("state.catchup.ENDED", type(catchup.ENDED)(1000))
    store = StateStore(tables, layout=Layout(1))
    # Given 40 locks of one minute that finished, and 5 that expired after them
    for n in range(40):
        lock = store.lock(key(n), CTX, 1)
        store.record(
            key(n), CTX, status=Status.PROCESSED, envelope_props=None, substatus=None, error=None,
            token_text=lock.token, digest="d",
        )  # fmt: skip
    for n in range(40, 45):
        store.lock(key(n), CTX, 1)
    # When the timer drains with a budget of 10 rows a run
    runs = Catchup(store, parallelism=1).drain(now=T0 + timedelta(minutes=2), max_rows=10)
    # Then one drain reads each finished lock once, fails the 5, and closes the minute
    assert sum(r.locks_ended for r in runs) == 40 and sum(r.records_read for r in runs) == 45
    assert sum(r.locks_failed for r in runs) == 5 and sum(r.minutes_closed for r in runs) == 1
    assert {status_of(store, key(n)) for n in range(40, 45)} == {Status.FAILED}
    assert index_left(tables) == ([], [])


class Killed(BaseException):
    """The catch-up process dies here (nothing after this step of it happens)."""


def test_a_catch_up_killed_between_its_marker_deletes_and_level_one_loses_no_lock(
    clock: Clock, tables: MemoryTables
) -> None:
    store = StateStore(tables, layout=Layout(1))
    # Given an expired lock of minute M
    assert store.lock(key("a"), CTX, 1).acquired

    # When a catch-up run concludes it, deletes M's marker and dies before deleting level 1
    def die_at_level_one(call: str, args: tuple[Any, ...]) -> None:
        if call == "delete_entity" and str(args[0]).endswith("statelocks"):
            raise Killed

    tables.gate = die_at_level_one
    with pytest.raises(Killed):
        Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    tables.gate = None
    assert status_of(store, key("a")) is Status.FAILED and not markers(tables)
    # and the same process then takes another lock of M (its cached marker is gone: it prepares again)
    assert store.lock(key("b"), CTX, 1).acquired
    # Then the next run concludes it and closes M: nothing is lost, nothing is left
    result = Catchup(store, parallelism=1).run(now=T0 + timedelta(minutes=2))
    assert result.locks_failed == 1 and status_of(store, key("b")) is Status.FAILED
    assert index_left(tables) == ([], [])
