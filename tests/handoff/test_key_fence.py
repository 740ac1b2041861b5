"""One event row per hand-off across a layout change, whatever a projection's delay (common/fence.py):
a message projected under the earlier layout whose write lands after a later message was projected under
the new one joins that event; it never makes a second event row."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy

from common import runtime
from handoff import service
from handoff.storage import keys
from handoff.storage.keys import Layout
from tests.support.handoff_flows import Flow

HELD = "held-resolver"


class HoldBatches(HTTPPolicy[Any, Any]):
    """Holds the entity-group transactions sent by the thread named ``HELD`` until ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.released = threading.Event()

    def send(self, request: PipelineRequest[Any]) -> PipelineResponse[Any, Any]:
        if threading.current_thread().name == HELD and "$batch" in str(request.http_request.url):
            self.entered.set()
            assert self.released.wait(20), "the held transaction was never released"
        return self.next.send(request)


class Switched:
    """The layout this process routes by, switched by the test (a writer already under way keeps the one
    it routed by); it has no recorded copy to forget."""

    def __init__(self) -> None:
        self.current = Layout()

    def now(self) -> Layout:
        return self.current

    def forget(self) -> None:
        """Nothing recorded to drop: the test switches the layout."""


@pytest.fixture
def layout() -> Iterator[Callable[[Layout], None]]:
    """``layout(Layout(...))``: every hand-off of this process routes by it from now on (through the
    composition root: ``handoff.service.layout``)."""
    switched = Switched()

    def follow(to: Layout) -> None:
        switched.current = to
        service.layout.replace(switched)

    yield follow
    service.reset()


def event_rows(event_id: str) -> list[dict[str, Any]]:
    table = runtime.tables().table(keys.EVENTS_TABLE)
    rows = table.query_entities("RowKey eq @rk", parameters={"rk": keys.event_row(event_id)})
    return [dict(r) for r in rows]


def test_an_event_request_landing_after_the_switch_joins_the_event_its_park_created(
    resolve: Any, flow: Flow, layout: Any
) -> None:
    hold = HoldBatches()
    runtime.reset(policies=[hold])
    try:
        # Given the EventRequest projected under S = 1, its transaction in flight
        layout(Layout(1))
        at = datetime.now(UTC) - timedelta(minutes=5)
        held = threading.Thread(target=resolve, args=(flow.request(enqueued=at),), name=HELD)
        held.start()
        assert hold.entered.wait(10)
        # When the layout switches to S = 4, the PendingHandoffResponse is projected, then the request lands
        layout(Layout(4, (1,), era=1))
        resolve(flow.park(enqueued=at + timedelta(seconds=1), job="job-fence"))
        hold.released.set()
        held.join(20)
    finally:
        runtime.reset()
    layout(Layout(4, (1,), era=1))  # the process's services are built again, on the new layout
    # Then the event has one row, in the new layout's partition, and the earlier partition holds its claim
    rows = event_rows(flow.event_id)
    events = [r for r in rows if "MovedTo" not in r]
    claims = [r for r in rows if "MovedTo" in r]
    home = keys.event_partition(flow.endpoint, flow.event_id, 4)
    assert [r["PartitionKey"] for r in events] == [home]
    assert [(r["PartitionKey"], r["MovedTo"]) for r in claims] == [(keys.partition(flow.endpoint), home)]
    # And its history holds both messages, and the event is the parked hand-off
    store = service.store()
    history = [r for r in store.event_rows(flow.endpoint, flow.event_id) if "|m|" in str(r["RowKey"])]
    assert len(history) == 2
    event = store.get_event(flow.endpoint, flow.event_id)
    assert event is not None and event.is_pending_handoff
    # And a reader still routing by S = 1 follows the claim to it
    layout(Layout(1))
    assert store.get_event(flow.endpoint, flow.event_id) is not None
