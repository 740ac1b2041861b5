"""The rules that live in ``StateStore``'s loops, through the real store on the in-memory table (no
storage): a refusal is always confirmed by storage, the holder's token writes from the token alone, a token
whose lock ended never writes, and a conclusion asked again is answered from the version it wrote."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest

from common.errors import Conflict, LockLost
from common.fence import MOVED_TO, LayoutBehind
from state.keys import Layout, head_row_key, history_row_key_of
from state.lifecycle import WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore
from tests.support.memory_table import MemoryTables

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-store")
OTHER = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-other")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
CTX = WriteContext()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def passes(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Iterator[Clock]:
    """The store's clock (one reading: the storage clock is certain here)."""
    at = Clock()
    with mock.patch.multiple("state.store", utcnow=at, earliest_now=at, latest_now=at):
        yield at


@pytest.fixture
def tables() -> MemoryTables:
    return MemoryTables()


def store_on(tables: MemoryTables) -> StateStore:
    return StateStore(tables, layout=Layout(1))


def calls_of(tables: MemoryTables) -> list[str]:
    """The calls every table of ``tables`` receives from now on (state table only)."""
    seen: list[str] = []

    def gate(call: str, args: tuple[Any, ...]) -> None:
        if str(args[0]).endswith("state"):
            seen.append(call)

    tables.gate = gate
    return seen


def record(store: StateStore, token: str, status: Status, digest: str | None = "d1") -> Any:
    return store.record(
        KEY,
        CTX,
        status=status,
        envelope_props=None,
        substatus=None,
        error=None,
        token_text=token,
        digest=digest,
    )


def test_a_held_lock_refuses_another_caller_until_it_expires_and_is_taken_over(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    first = store.lock(KEY, CTX, 30)
    assert first.acquired and first.token is not None and not first.takeover

    refused = store.lock(KEY, CTX, 30)
    assert not refused.acquired and refused.token is None
    assert refused.locked_until == T0 + timedelta(seconds=30)

    clock.passes(31)
    taken = store.lock(KEY, CTX, 30)
    assert taken.acquired and taken.takeover
    assert taken.previous is not None and taken.previous.lock_expired and taken.previous.version == 1


def test_a_refusal_is_always_confirmed_by_storage(clock: Clock, tables: MemoryTables) -> None:
    holder, other = store_on(tables), store_on(tables)
    lock = holder.lock(KEY, CTX, 30)
    assert lock.token is not None
    assert not other.lock(KEY, CTX, 30).acquired  # ``other`` now remembers the head as held

    record(holder, lock.token, Status.FAILED)  # the holder ends it: the record may be locked again
    calls = calls_of(tables)

    again = other.lock(KEY, CTX, 30)

    # one read confirms the remembered refusal before deciding; then the expiry minute and the write
    assert calls.count("get_entity") == 1 and len(calls) == 3 and calls[-1] == "submit_transaction"
    assert again.acquired and not again.takeover
    assert again.previous is not None and again.previous.error is None and not again.previous.lock_expired


def test_the_holders_token_writes_in_one_transaction_without_reading(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    calls = calls_of(tables)

    head = record(store_on(tables), lock.token, Status.PROCESSED)

    assert calls == ["submit_transaction"]
    assert head.status is Status.PROCESSED and head.version == 2


def test_a_token_at_the_end_of_its_lock_reads_the_head_and_is_lock_lost(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    clock.passes(30)  # expired at this very instant: no longer valid
    calls = calls_of(tables)

    with pytest.raises(LockLost, match="The lock expired at"):
        record(store, lock.token, Status.PROCESSED)

    assert "submit_transaction" not in calls and calls[0] == "get_entity"
    assert store.read_head(KEY) is not None and store.read_head(KEY).status is Status.PROCESSING  # type: ignore[union-attr]


def test_a_token_whose_lock_was_taken_over_never_writes(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    old = store.lock(KEY, CTX, 10)
    assert old.token is not None
    clock.passes(11)
    assert store.lock(KEY, CTX, 60).takeover

    with pytest.raises(LockLost, match="another caller took the lock over"):
        record(store, old.token, Status.PROCESSED)
    head = store.read_head(KEY)
    assert head is not None and head.status is Status.PROCESSING and head.version == 2


def test_a_token_of_another_record_is_refused(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None

    with pytest.raises(LockLost) as refused:
        store.record(
            OTHER, CTX, status=Status.PROCESSED, envelope_props=None, substatus=None, error=None,
            token_text=lock.token,
        )  # fmt: skip
    assert refused.value.field == "lockToken"
    assert str(refused.value) == "The lock token belongs to another record."


def test_a_conclusion_asked_again_is_answered_from_the_head_it_wrote(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    done = record(store, lock.token, Status.PROCESSED, "d1")

    again = record(store_on(tables), lock.token, Status.PROCESSED, "d1")

    assert again.version == done.version == 2 and again.status is Status.PROCESSED
    with pytest.raises(LockLost, match="already ended with Processed"):
        record(store, lock.token, Status.PROCESSED, "another-request")
    with pytest.raises(LockLost):
        record(store, lock.token, Status.SKIPPED, "d1")


def test_a_conclusion_asked_again_after_newer_versions_is_answered_as_it_was_written(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    record(store, lock.token, Status.FAILED, "d1")
    assert store.lock(KEY, CTX, 30).acquired  # a failed record is locked again: version 3

    again = record(store_on(tables), lock.token, Status.FAILED, "d1")

    assert again.status is Status.FAILED and again.version == 2
    assert again.entity["RowKey"] == head_row_key(KEY) and "RecordedStatus" not in again.entity
    with pytest.raises(LockLost):
        record(store, lock.token, Status.FAILED, "another-request")
    head = store.read_head(KEY)
    assert head is not None and head.version == 3 and head.status is Status.PROCESSING


def test_an_extension_moves_the_expiry_of_the_holders_lock_only(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    clock.passes(20)

    extended = store.extend(KEY, CTX, lock.token, 60)

    assert extended.acquired and extended.locked_until == T0 + timedelta(seconds=80)
    head = store.read_head(KEY)
    assert head is not None and head.version == 1 and head.locked_until == T0 + timedelta(seconds=80)
    clock.passes(61)
    with pytest.raises(LockLost):
        store.extend(KEY, CTX, lock.token, 60)


# -- while an earlier layout is listed (the key fence) -----------------------------------------------------

EARLIER = Layout(1)
NOW_FOUR = Layout.of_eras((4, 1), [(1, 1)])  # four partitions per entity now; one before


def heads_of(tables: MemoryTables) -> list[tuple[str, str]]:
    """Where the record's rows are: (partition, row key) of every head and claim of ``KEY``."""
    rk = head_row_key(KEY)
    return sorted((pk, r) for (pk, r) in tables.table("state").rows if r == rk)


def test_a_key_created_under_the_earlier_layout_is_found_there_not_created_again(
    clock: Clock, tables: MemoryTables
) -> None:
    old, new = StateStore(tables, layout=EARLIER), StateStore(tables, layout=NOW_FOUR)
    assert old.lock(KEY, CTX, 30).acquired
    before = heads_of(tables)

    refused = new.lock(KEY, CTX, 30)

    assert not refused.acquired and refused.locked_until == T0 + timedelta(seconds=30)
    assert heads_of(tables) == before  # one record, nothing fenced: the key exists
    calls = calls_of(tables)
    assert not StateStore(tables, layout=NOW_FOUR).lock(KEY, CTX, 30).acquired
    # a key this instance does not know: read where it is created now, then fenced in the earlier partition,
    # where the record is found (and decided on, never created again)
    assert calls == ["get_entity", "create_entity", "get_entity"]
    clock.passes(31)
    taken = new.lock(KEY, CTX, 30)
    assert taken.acquired and taken.takeover and heads_of(tables) == before


def test_a_key_created_now_is_fenced_in_the_earlier_layouts_partition(
    clock: Clock, tables: MemoryTables
) -> None:

    new = StateStore(tables, layout=NOW_FOUR)

    assert new.lock(KEY, CTX, 30).acquired

    rows = tables.table("state").rows
    where = heads_of(tables)
    assert len(where) == 2
    home = new.layout.partition(KEY)
    earlier = EARLIER.partition(KEY)
    assert {pk for pk, _ in where} == {home, earlier}
    assert rows[(earlier, where[0][1])][MOVED_TO] == home
    assert MOVED_TO not in rows[(home, where[0][1])]
    # the earlier layout's writer meets the claim: it never creates a second record
    late = StateStore(tables, layout=EARLIER)
    with pytest.raises(LayoutBehind):
        late.lock(KEY, CTX, 30)
    assert heads_of(tables) == where


def test_an_upsert_while_an_earlier_layout_is_listed_writes_one_record(
    clock: Clock, tables: MemoryTables
) -> None:
    old, new = StateStore(tables, layout=EARLIER), StateStore(tables, layout=NOW_FOUR)
    upsert: dict[str, Any] = {"envelope_props": None, "substatus": None, "error": None, "token_text": None}
    old.record(KEY, CTX, status=Status.PROCESSED, **upsert)
    before = heads_of(tables)

    head = new.record(KEY, CTX, status=Status.SKIPPED, **upsert)

    assert head.version == 2 and head.status is Status.SKIPPED
    assert heads_of(tables) == before
    fresh = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-new")
    made = new.record(fresh, CTX, status=Status.PROCESSED, **upsert)
    assert made.version == 1 and new.read_head(fresh) is not None


def test_the_same_lock_request_asked_again_while_its_lock_holds_gets_it_back(
    clock: Clock, tables: MemoryTables
) -> None:
    store = store_on(tables)
    first = store.lock(KEY, CTX, 30)
    assert first.token is not None
    record(store, first.token, Status.FAILED, "d1")
    clock.passes(1)
    taken = store.lock(KEY, CTX, 30, request_id="req-1")

    again = store_on(tables).lock(KEY, CTX, 30, request_id="req-1")

    assert again.acquired and again.replayed and not again.takeover
    assert again.token == taken.token and again.locked_until == taken.locked_until
    assert again.previous is not None and again.previous.version == 2 and not again.previous.lock_expired
    other = store_on(tables).lock(KEY, CTX, 30, request_id="req-2")
    assert not other.acquired and not other.replayed


def test_a_fenced_write_keeps_the_version_it_replaces_as_history(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None

    record(store, lock.token, Status.PROCESSED)

    rows = tables.table("state").rows
    pk = store.layout.partition(KEY)
    history = rows.get((pk, history_row_key_of(head_row_key(KEY), 1)))
    assert history is not None and history["RecordedStatus"] == int(Status.PROCESSING)
    assert history["Status"] == int(Status.SUPERSEDED) and history["SupersededByVersion"] == 2


def test_a_write_that_loses_every_race_gives_up_with_a_conflict(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    table = tables.table("state")

    def another_writer_first(call: str, args: tuple[Any, ...]) -> None:
        if call == "submit_transaction" and str(args[0]).endswith("state"):
            tables.gate = None
            head = dict(table.get_entity(store.layout.partition(KEY), head_row_key(KEY)))
            table.update_entity(head)  # the same columns again: a new ETag
            tables.gate = another_writer_first

    tables.gate = another_writer_first
    with pytest.raises(Conflict) as refused:
        record(store, lock.token, Status.PROCESSED)
    assert refused.value.field == "key"
    assert str(refused.value) == "The record changed on every attempt to write it; retry."

    clock.passes(31)
    with pytest.raises(Conflict) as refused:
        store.lock(KEY, CTX, 30)
    assert refused.value.field == "key"
    assert str(refused.value) == "The record changed on every attempt to lock it; retry."


def test_a_refusal_remembered_from_our_own_lock_is_confirmed_by_storage_before_it_is_answered(
    clock: Clock, tables: MemoryTables
) -> None:
    """This instance locked the record (it remembers the head it wrote, held); another instance ended the
    lock with the token. Asked again, this instance reads the head before refusing: the record is free."""
    here, elsewhere = store_on(tables), store_on(tables)
    lock = here.lock(KEY, CTX, 30)
    assert lock.token is not None
    record(elsewhere, lock.token, Status.FAILED)
    calls = calls_of(tables)

    again = here.lock(KEY, CTX, 30)

    assert again.acquired and not again.takeover
    assert calls == ["get_entity", "submit_transaction"]  # one read confirms it, then the write
    assert again.previous is not None and again.previous.version == 2


def test_a_lock_that_loses_the_race_for_a_free_record_is_refused_as_storage_holds_it(
    clock: Clock, tables: MemoryTables
) -> None:
    """This instance remembers the record free and writes its lock; another instance locked it first. The
    refused write is followed by one read and a decision on what storage holds: held by the other."""
    here, elsewhere = store_on(tables), store_on(tables)
    first = here.lock(KEY, CTX, 30)
    assert first.token is not None
    record(here, first.token, Status.FAILED)
    clock.passes(1)
    calls: list[str] = []
    theirs: list[Any] = []

    def another_instance_first(call: str, args: tuple[Any, ...]) -> None:
        calls.append(call)
        if call == "submit_transaction" and not theirs:
            tables.gate = None
            theirs.append(elsewhere.lock(KEY, CTX, 60))
            tables.gate = another_instance_first

    tables.gate = another_instance_first

    refused = here.lock(KEY, CTX, 30)

    assert theirs[0].acquired and not refused.acquired and refused.token is None
    assert refused.locked_until == T0 + timedelta(seconds=61)  # the other instance's lock
    assert calls == ["submit_transaction", "get_entity"]  # refused, read again, decided: no second write


def test_a_lock_whose_token_cannot_be_issued_is_never_written(clock: Clock, tables: MemoryTables) -> None:
    """A cold instance reads its signing key beside its first lock; when that read fails, the lock is not
    written (a lock nobody holds a token for would block the record until it expires)."""
    from azure.core.exceptions import ServiceRequestError

    def no_signing_key(call: str, args: tuple[Any, ...]) -> None:
        if call == "get_entity" and str(args[0]).endswith("statelocks") and args[1] == "hmac":
            raise ServiceRequestError("the signing key cannot be read (test)")

    tables.gate = no_signing_key
    store = store_on(tables)

    with pytest.raises(ServiceRequestError):
        store.lock(KEY, CTX, 30)

    tables.gate = None
    assert store.read_head(KEY) is None
    assert store_on(tables).lock(KEY, CTX, 30).acquired  # the next call reads the key and locks


def test_a_return_to_an_earlier_shard_count_clears_the_claim_left_where_the_record_goes(
    clock: Clock, tables: MemoryTables
) -> None:
    """1 -> 4 -> 1: a writer of the four-partition layout claimed the key in the one partition (naming its
    own partition) and never created the record. Back at one partition, the lock clears that claim and
    creates the record in its place."""
    from common.fence import claim_row as fence_claim

    four, back = NOW_FOUR, Layout.of_eras((1, 1), [(1, 1), (4, 1)])
    home, theirs = back.partition(KEY), four.partition(KEY)
    assert home == EARLIER.partition(KEY) and theirs != home
    tables.table("state").create_entity(fence_claim(home, head_row_key(KEY), theirs, four.era))

    lock = StateStore(tables, layout=back).lock(KEY, CTX, 30)

    assert lock.acquired
    rows = tables.table("state").rows
    assert MOVED_TO not in rows[(home, head_row_key(KEY))]  # the record, where the claim stood
    assert rows[(theirs, head_row_key(KEY))][MOVED_TO] == home  # their partition fenced: no twin there


def test_a_key_already_created_where_it_lives_now_costs_one_read_and_fences_nothing(
    clock: Clock, tables: MemoryTables
) -> None:
    assert StateStore(tables, layout=NOW_FOUR).lock(KEY, CTX, 30).acquired
    where = heads_of(tables)
    calls = calls_of(tables)

    refused = StateStore(tables, layout=NOW_FOUR).lock(KEY, CTX, 30)  # an instance that does not know it

    assert not refused.acquired and calls == ["get_entity"] and heads_of(tables) == where


def test_an_expired_lock_on_a_record_of_the_earlier_layout_is_taken_over_where_it_is(
    clock: Clock, tables: MemoryTables
) -> None:
    assert StateStore(tables, layout=EARLIER).lock(KEY, CTX, 30).acquired
    where = heads_of(tables)
    clock.passes(31)
    calls = calls_of(tables)

    taken = StateStore(tables, layout=NOW_FOUR).lock(KEY, CTX, 30)  # an instance that does not know it

    assert taken.acquired and taken.takeover and heads_of(tables) == where
    # read where it is created now, fenced in the earlier partition (where it is found), the expiry minute
    # prepared, written there once
    assert calls == ["get_entity", "create_entity", "get_entity", "create_entity", "submit_transaction"]


def test_a_token_whose_record_was_deleted_meanwhile_is_lock_lost(clock: Clock, tables: MemoryTables) -> None:
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    tables.table("state").delete_entity(store.layout.partition(KEY), head_row_key(KEY))

    with pytest.raises(LockLost):
        record(store, lock.token, Status.PROCESSED)
    assert store.read_head(KEY) is None  # nothing written in its place


def test_a_conclusion_asked_again_once_its_version_can_no_longer_be_read_is_lock_lost(
    clock: Clock, tables: MemoryTables
) -> None:
    """The version the token wrote is gone from the history (newer versions followed): the retry cannot be
    answered from it, and is refused rather than guessed."""
    store = store_on(tables)
    lock = store.lock(KEY, CTX, 30)
    assert lock.token is not None
    record(store, lock.token, Status.FAILED, "d1")
    assert store.lock(KEY, CTX, 30).acquired  # version 3
    tables.table("state").delete_entity(store.layout.partition(KEY), history_row_key_of(head_row_key(KEY), 2))

    with pytest.raises(LockLost):
        record(store_on(tables), lock.token, Status.FAILED, "d1")
