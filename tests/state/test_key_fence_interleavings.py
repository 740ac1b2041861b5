"""The key fence (common/fence.py, ADR-0020) under every order of storage calls, without storage: the real
``StateStore`` of two writers that route by different layouts, on one in-memory table (which passes the
conformance suite Azurite passes), each call of each writer one step of a drawn schedule. A writer held for
any number of steps is a write delayed for any time: the schedule decides which call lands first, so every
interleaving of the two lock calls' reads, claims and inserts is reachable."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from common.fence import LayoutBehind
from state.keys import Layout
from state.lifecycle import LockOutcome, WriteContext
from state.model import RecordKey, Scope, Status
from state.store import StateStore
from tests.support.examples import examples
from tests.support.interleave import interleave
from tests.support.memory_table import MemoryTables

ERAS = [
    Layout(1),
    Layout.of_eras((4, 1), [(1, 1)]),
    Layout.of_eras((1, 1), [(1, 1), (4, 1)]),
    Layout.of_eras((2, 1), [(1, 1), (4, 1), (1, 1)]),
]
KEY = RecordKey(1, Scope(4), 42, "invoice", "INV-1")
CTX = WriteContext()


def race(tables: MemoryTables, eras: tuple[int, ...], schedule: list[int]) -> list[LockOutcome]:
    """Writers of ``eras`` lock ``KEY`` at once, one storage call per drawn step; a writer told that its
    layout is behind asks again under the newest layout (as a caller retries a 503)."""
    stores = [StateStore(tables, layout=ERAS[era]) for era in eras]
    for store in stores:
        store.signer()  # read before the race: the lock then makes no call beside it
    answers: list[Any] = [None] * len(eras)

    def writer(n: int) -> None:
        try:
            try:
                answers[n] = stores[n].lock(KEY, CTX, 60)
            except LayoutBehind:
                answers[n] = StateStore(tables, layout=ERAS[-1]).lock(KEY, CTX, 60)
        except BaseException as exc:  # reported by the test, not lost in a thread
            answers[n] = exc

    interleave(tables, len(eras), writer, schedule)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers


def heads(tables: MemoryTables) -> list[str]:
    """The partitions holding a head of ``KEY`` (claims are no heads)."""
    rows = tables.table("state").rows
    return [pk for (pk, rk), row in rows.items() if rk == "invoice|INV-1|||c" and "MovedTo" not in row]


eras = st.tuples(st.integers(0, 3), st.integers(0, 3))
schedules = st.lists(st.integers(0, 1), max_size=40)


@settings(max_examples=examples(400), deadline=None)
@given(eras=eras, schedule=schedules)
def test_two_writers_of_any_two_layouts_in_any_order_make_one_record_and_one_holder(
    eras: tuple[int, int], schedule: list[int]
) -> None:
    tables = MemoryTables()
    answers = race(tables, eras, schedule)
    assert len(heads(tables)) == 1
    assert sum(1 for a in answers if a.acquired) == 1, answers
    # And every layout finds that record, wherever a reader routes
    for era in range(len(ERAS)):
        found = StateStore(tables, layout=ERAS[era]).read_head(KEY)
        assert found is not None and found.entity["PartitionKey"] == heads(tables)[0]


@settings(max_examples=examples(200), deadline=None)
@given(
    eras=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    schedule=st.lists(st.integers(0, 2), max_size=60),
)
def test_three_writers_of_any_layouts_in_any_order_make_one_record(
    eras: tuple[int, int, int], schedule: list[int]
) -> None:
    tables = MemoryTables()
    answers = race(tables, eras, schedule)
    assert len(heads(tables)) == 1
    assert sum(1 for a in answers if a.acquired) == 1, answers


@settings(max_examples=examples(150), deadline=None)
@given(schedule=schedules, settle_first=st.booleans())
def test_a_processed_key_stays_processed_through_1_4_1_in_any_order(
    schedule: list[int], settle_first: bool
) -> None:
    # Given a key locked and settled under S = 4 while a writer of S = 1 (before and after the return) races
    tables = MemoryTables()
    first = StateStore(tables, layout=ERAS[1])
    if settle_first:
        token = first.lock(KEY, CTX, 60).token
        first.record(
            KEY,
            CTX,
            status=Status.PROCESSED,
            envelope_props=None,
            substatus=None,
            error=None,
            token_text=token,
        )
    answers = race(tables, (0, 2), schedule)
    # Then there is still one record, and a settled key is never locked again
    assert len(heads(tables)) == 1
    acquired = [a for a in answers if a.acquired]
    assert len(acquired) == (0 if settle_first else 1)
