"""The hand-off layout as a value the composition root hands to the store (handoff/storage/keys.py
``Layout``, handoff/storage/layout.py): where an event and an endpoint live, what a fence is built from,
and how the recorded layout becomes one. No storage."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from common.layouts import Era, InForce
from handoff.storage import keys
from handoff.storage.keys import Layout
from handoff.storage.layout import RecordedLayout, layout_of
from handoff.storage.store import HandoffStore
from tests.support.memory_table import MemoryTables

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_layout_routes_an_event_to_its_shard_and_probes_the_earlier_layouts_partitions() -> None:
    layout = Layout(4, (1,), era=1)
    home = keys.event_partition("Billing", "ev-1", 4)
    assert layout.event_partition("Billing", "ev-1") == home != keys.partition("Billing")
    assert layout.earlier_event_partitions("Billing", "ev-1") == [keys.partition("Billing")]
    shards = [keys.shard_partition("Billing", 4, s) for s in range(4)]
    assert layout.endpoint_partitions("Billing") == [*shards, keys.partition("Billing")]


def test_the_unsharded_layout_is_one_partition_per_endpoint_with_nothing_earlier() -> None:
    layout = Layout()
    assert layout.event_partition("Billing", "ev-1") == keys.partition("Billing")
    assert layout.earlier_event_partitions("Billing", "ev-1") == []
    assert layout.endpoint_partitions("Billing") == [keys.partition("Billing")]


def test_a_layout_is_refused_when_its_era_is_before_its_earlier_layouts_or_its_shards_out_of_range() -> None:
    with pytest.raises(ValueError, match="era"):
        Layout(4, (1,), era=0)
    with pytest.raises(ValueError, match=keys.SHARDS_SETTING):
        Layout(1000)


def test_the_recorded_eras_become_s_now_the_earlier_values_newest_first_and_the_eras_index() -> None:
    eras = [Era(1, 1, T0), Era(4, 1, T0), Era(1, 1, T0), Era(2, 1, T0)]
    layout = layout_of(InForce(eras[-1], tuple(eras[:-1])))
    assert layout == Layout(2, (1, 4), era=3)


class Book:
    """A layout book that hands out one recorded state and counts what is asked of it."""

    def __init__(self, in_force: InForce) -> None:
        self.in_force_now = in_force
        self.reads = 0
        self.invalidated = 0

    def in_force(self, family: str, configured: Any) -> InForce:
        assert family == "handoff"
        self.reads += 1
        return self.in_force_now

    def invalidate(self) -> None:
        self.invalidated += 1


def test_the_recorded_layout_follows_the_book_and_forget_drops_the_books_copy() -> None:
    book = Book(InForce(Era(1, 1, T0), ()))
    recorded = RecordedLayout(book)  # type: ignore[arg-type]
    assert recorded.now() == Layout()
    book.in_force_now = InForce(Era(4, 1, T0), (Era(1, 1, T0),))
    assert recorded.now() == Layout(4, (1,), era=1)
    recorded.forget()
    assert book.invalidated == 1


def test_the_stores_fence_names_the_home_the_earlier_partitions_and_the_era_of_one_layout() -> None:
    forgotten: list[bool] = []

    class Source:
        def now(self) -> Layout:
            return Layout(4, (1,), era=1)

        def forget(self) -> None:
            forgotten.append(True)

    store = HandoffStore(MemoryTables(), Source())
    fence = store.event_fence("Billing", "ev-1")
    assert fence is not None
    assert (fence.home, fence.earlier, fence.era) == (
        keys.event_partition("Billing", "ev-1", 4),
        (keys.partition("Billing"),),
        1,
    )
    fence.forget()
    assert forgotten == [True]
    assert HandoffStore(MemoryTables(), Layout()).event_fence("Billing", "ev-1") is None
