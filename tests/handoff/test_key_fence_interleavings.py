"""The key fence of hand-offs (common/fence.py, ADR-0020) under every order of storage calls, without
storage: two real resolvers on one in-memory table (which passes the conformance suite Azurite passes),
routing by different layouts, project an event's EventRequest and its PendingHandoffResponse at once, each
storage call one step of a drawn schedule. Whatever lands first, the event has one row, in one partition,
with both messages in its history, and every layout finds it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from handoff.projection.resolver import ResolverService
from handoff.storage import keys
from handoff.storage.keys import Layout
from handoff.storage.store import HandoffStore
from tests.support.examples import examples
from tests.support.handoff_flows import Flow
from tests.support.interleave import interleave
from tests.support.memory_table import MemoryTables

# The layouts of one deployment, oldest first: 1 shard, then 4, back to 1, then 2.
LAYOUTS = [Layout(1), Layout(4, (1,), era=1), Layout(1, (4,), era=2), Layout(2, (1, 4), era=3)]
NEWEST = len(LAYOUTS) - 1


class Routing(threading.local):
    """The layout each thread's stores route by (a writer's own; the test's reads: the newest)."""

    era = NEWEST

    def now(self) -> Layout:
        return LAYOUTS[self.era]

    def forget(self) -> None:
        """A writer keeps its layout until its message is delivered again."""


ROUTING = Routing()


def project_all(tables: MemoryTables, jobs: list[tuple[int, Any]], schedule: list[int]) -> None:
    """Each (era, message) is delivered to a resolver of that layout, one storage call per drawn step; a
    delivery that fails transiently (its layout behind) is delivered again under the newest layout, as
    Service Bus redelivers it."""
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        era, message = jobs[n]
        ROUTING.era = era
        try:
            for _ in range(3):
                try:
                    ResolverService(HandoffStore(tables, ROUTING), sleep=lambda _: None).handle(message)
                    return
                except Exception:  # a transient failure: redelivered, now under the newest layout
                    ROUTING.era = NEWEST
            raise AssertionError("three deliveries failed")
        except BaseException as exc:
            failures.append(exc)

    interleave(tables, len(jobs), writer, schedule)
    assert failures == []


@settings(max_examples=examples(300), deadline=None)
@given(
    eras=st.tuples(st.integers(0, NEWEST), st.integers(0, NEWEST)),
    schedule=st.lists(st.integers(0, 1), max_size=40),
)
def test_two_messages_of_one_event_projected_under_any_two_layouts_in_any_order_make_one_event(
    eras: tuple[int, int], schedule: list[int]
) -> None:
    tables = MemoryTables()
    flow = Flow(endpoint="Billing", event_id="ev-1")
    at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    request, park = flow.request(enqueued=at), flow.park(enqueued=at + timedelta(seconds=1), job="job-1")
    project_all(tables, [(eras[0], request), (eras[1], park)], schedule)
    rows = tables.table(keys.EVENTS_TABLE).rows
    events = [pk for (pk, rk), row in rows.items() if rk == keys.event_row("ev-1") and "MovedTo" not in row]
    assert len(events) == 1, rows.keys()
    history = [rk for (pk, rk) in rows if pk == events[0] and rk.startswith("ev|ev-1|m|")]
    assert sorted(history) == ["ev|ev-1|m|park-1", "ev|ev-1|m|req-1"]
    for era in range(len(LAYOUTS)):
        ROUTING.era = era
        pk, found = HandoffStore(tables, ROUTING).locate_event("Billing", "ev-1")
        assert found is not None and pk == events[0]
    ROUTING.era = NEWEST
    event = HandoffStore(tables, ROUTING).get_event("Billing", "ev-1")
    assert event is not None and event.is_pending_handoff
