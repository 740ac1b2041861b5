"""A cold instance's first message for an endpoint lists the endpoint beside the event's read
(``common.beside``), and never writes an event of an endpoint it could not list:
the operator overview, the sweeper and the reconciler only walk listed endpoints.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.projection.resolver import Outcome, TransientProjectionError
from tests.support.handoff_flows import Flow

pytestmark = pytest.mark.usefixtures("settle_tables")


@pytest.fixture(autouse=True)
def new_instance():
    """Each test is a new instance: its own services, nothing listed yet."""
    service.reset()
    yield
    runtime.reset()
    service.reset()


class Timeline(SansIOHTTPPolicy[Any, Any]):
    """When each request is sent and answered; the endpoint listing held ``hold_s`` or refused."""

    def __init__(self, *, hold_s: float = 0.0, refuse_listing: bool = False) -> None:
        self.hold_s, self.refuse_listing = hold_s, refuse_listing
        self.events: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    @staticmethod
    def what(request: Any) -> str:
        http = request.http_request
        path = http.url.split("?", 1)[0]
        if path.endswith("$batch"):
            return "transaction"
        if "hoendpoints" in path and http.method == "POST":
            return "listing"
        if "hoevents" in path and http.method == "GET":
            return "event read"
        return f"{http.method} {path.rsplit('/', 1)[-1]}"

    def on_request(self, request: Any) -> None:
        what = self.what(request)
        with self._lock:
            self.events.append((time.monotonic(), "sent", what))
        if what == "listing":
            if self.refuse_listing:
                raise ServiceRequestError("storage unreachable for the endpoint listing (test)")
            time.sleep(self.hold_s)

    def on_response(self, request: Any, response: Any) -> None:
        with self._lock:
            self.events.append((time.monotonic(), "answered", self.what(request)))

    def at(self, step: str, what: str) -> float:
        return next(t for t, s, w in self.events if s == step and w == what)


def test_the_endpoint_is_listed_beside_the_event_read_and_before_the_event_is_written(flow: Flow) -> None:
    timeline = Timeline(hold_s=0.5)
    runtime.reset(policies=[timeline])
    with ROUND_TRIPS.measure() as tally:
        assert service.resolver_service().handle(flow.request()) is Outcome.APPLIED
    sent = len([e for e in timeline.events if e[1] == "sent"])
    # The event was read while the listing was under way, and written only after it was answered
    assert timeline.at("sent", "event read") < timeline.at("answered", "listing")
    assert timeline.at("sent", "transaction") > timeline.at("answered", "listing")
    assert flow.endpoint in service.store().endpoints()
    # The listing on the other thread is counted as the message's own request
    assert tally.requests == sent
    # and the next message of that endpoint in this instance lists nothing
    before = len(timeline.events)
    service.resolver_service().handle(Flow(flow.endpoint, flow.event_id + "-2").request())
    assert "listing" not in [w for _, _, w in timeline.events[before:]]


def test_an_endpoint_that_cannot_be_listed_gets_no_event_written(flow: Flow) -> None:
    """The listing fails and the event read succeeds: the message goes back to be retried (the host's
    retry), nothing is projected."""
    timeline = Timeline(refuse_listing=True)
    runtime.reset(policies=[timeline], client_options={"retry_total": 0})
    service.resolver_service().sleep = lambda seconds: None  # the in-process back-off before the host's retry
    with pytest.raises(TransientProjectionError, match="endpoint listing"):
        service.resolver_service().handle(flow.request())
    assert "event read" in [w for _, s, w in timeline.events if s == "sent"]
    assert "transaction" not in [w for _, s, w in timeline.events if s == "sent"]
    # When the listing works again, the same message is projected and its endpoint listed
    timeline.refuse_listing = False
    assert service.resolver_service().handle(flow.request()) is Outcome.APPLIED
    assert flow.endpoint in service.store().endpoints()
