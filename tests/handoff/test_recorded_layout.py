"""Hand-offs route by the layout recorded in storage (common/layouts.py), not each instance's
``SETTLE_HANDOFF_SHARDS``: an instance whose setting disagrees still finds every parked hand-off, hands
each out once and settles none twice; a change is one explicit step that loses nothing."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common import layouts, runtime
from handoff import service
from handoff.storage import keys
from tests.layouts import fast_changes, reshard
from tests.support.handoff_flows import Flow, park, receive, settle_leased

from .broker import Broker, BrokerTransport


@pytest.fixture
def deployment(monkeypatch: pytest.MonkeyPatch, fresh_tables: str) -> Iterator[Any]:
    """``deployment(S)``: a new instance of one deployment with ``SETTLE_HANDOFF_SHARDS=S`` and no
    ``..._PREVIOUS``, its transport a broker that forwards at once (one broker for every instance)."""
    fast_changes(monkeypatch)
    broker = Broker(forward=True)

    def start(shards: int) -> Broker:
        monkeypatch.setenv(keys.SHARDS_SETTING, str(shards))
        monkeypatch.delenv(keys.PREVIOUS_SHARDS_SETTING, raising=False)
        runtime.reset()
        service.use_transport(BrokerTransport(broker))
        return broker

    yield start
    monkeypatch.delenv(keys.SHARDS_SETTING)
    runtime.reset()


def parked(resolve: Any, endpoint: str, n: int, prefix: str = "ev") -> list[Flow]:
    base = datetime.now(UTC) - timedelta(hours=1)
    return [park(resolve, endpoint, f"{prefix}-{i:03d}", at=base + timedelta(seconds=i)) for i in range(n)]


def receive_all(call: Any, endpoint: str, flows: dict[str, Flow]) -> list[str]:
    """Receive and settle until nothing is left: the event ids in the order they were handed out."""
    got: list[str] = []
    for _ in range(3 * len(flows) + 3):
        answer = receive(call, endpoint, "agent-1")
        if answer.status == 204:
            return got
        assert answer.status == 200, answer.body
        event_id = answer.json["coordinates"]["eventId"]
        got.append(event_id)
        settled = settle_leased(call, flows[event_id], answer.json["lease"]["token"], "agent-1")
        assert settled.status == 202, settled.body
    raise AssertionError(f"receive never ran dry: {got}")


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1), (3, 16)])
def test_a_parked_hand_off_is_received_and_settled_once_whatever_the_setting_says(
    call: Any, resolve: Any, deployment: Any, before: int, after: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Given 10 hand-offs parked under SETTLE_HANDOFF_SHARDS=before, 4 of them received and settled
    broker = deployment(before)
    endpoint = "Layout-" + uuid.uuid4().hex[:8]
    flows = {f.event_id: f for f in parked(resolve, endpoint, 10)}
    done = []
    for _ in range(4):
        answer = receive(call, endpoint, "agent-0")
        done.append(answer.json["coordinates"]["eventId"])
        assert settle_leased(call, flows[done[-1]], answer.json["lease"]["token"], "agent-0").status == 202
    # When an instance starts with SETTLE_HANDOFF_SHARDS=after and no SETTLE_HANDOFF_SHARDS_PREVIOUS
    deployment(after)
    with caplog.at_level(logging.WARNING, logger="settle.layouts"):
        # Then the job lookup finds a parked hand-off
        waiting = sorted(set(flows) - set(done))
        job = call(
            "handoff_job",
            method="GET",
            route_params={"endpointId": endpoint, "externalJobId": f"job-{waiting[0]}"},
        )
        assert job.status == 200 and job.json["coordinates"]["eventId"] == waiting[0], job.body
        # And receive hands out each of the 6 still parked, once, oldest first, and nothing settled before
        assert receive_all(call, endpoint, flows) == waiting
    # And no settled hand-off is settled again
    for event_id in done:
        again = settle_leased(call, flows[event_id], None, "agent-2")
        assert again.status == 409, again.body
    assert len(broker.delivered) == 10
    # And the disagreement was logged, naming the setting and the recorded value
    assert any(
        keys.SHARDS_SETTING in r.getMessage() and f"({before} shards" in r.getMessage()
        for r in caplog.records
    )
    assert service.layout().now().shards == before


def test_a_change_made_the_explicit_way_loses_no_hand_off(call: Any, resolve: Any, deployment: Any) -> None:
    # Given hand-offs parked in the unsharded layout
    broker = deployment(1)
    endpoint = "Reshard-" + uuid.uuid4().hex[:8]
    old = {f.event_id: f for f in parked(resolve, endpoint, 4, "old")}
    # When an operator changes the recorded layout to 4 shards (the setting is not touched)
    changed = reshard(layouts.HANDOFF, 4)
    assert [e.shards for e in changed.eras] == [1, 4]
    # Then new hand-offs go to the new shards, and the old ones are still found
    assert service.layout().now().shards == 4 and service.layout().now().previous == (1,)
    new = {f.event_id: f for f in parked(resolve, endpoint, 4, "new")}
    assert sorted(receive_all(call, endpoint, {**old, **new})) == sorted([*old, *new])
    assert len(broker.delivered) == 8
    # And the change is audited
    [audit] = layouts.audits(runtime.tables(), layouts.HANDOFF)
    assert (audit["FromShards"], audit["ToShards"], audit["Actor"]) == (1, 4, "test")


def test_a_message_in_the_moment_before_a_change_is_retried_never_poisoned(
    call: Any, deployment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from handoff.projection.resolver import Outcome
    from tests.support.handoff_flows import RecordingRedelivery

    # Given a change to 4 shards about to take effect (inside its guard: nothing is routed)
    monkeypatch.setattr(layouts, "GUARD_S", 60.0)
    deployment(1)
    assert service.layout().now().shards == 1  # recorded
    reshard(layouts.HANDOFF, 4, wait=False)
    time.sleep(1.0)  # past 2 x RefreshSeconds + margin: the guard has begun, the change has not
    resolver = service.resolver_service()
    redelivery = RecordingRedelivery()
    resolver.redelivery = lambda: redelivery
    flow = Flow(endpoint="Guard-" + uuid.uuid4().hex[:8], event_id="ev-1")
    # When a message arrives, it is rescheduled (503 layout-changing is transient), not poisoned
    assert resolver.handle(flow.request()) is Outcome.RESCHEDULED
    assert [m for m, _, _ in redelivery.scheduled] == ["req-1"]
    # And an agent's receive is a 503 with Retry-After, naming the change
    answer = receive(call, flow.endpoint, "agent-1")
    assert answer.status == 503 and answer.json["type"] == "urn:settle:problem:layout-changing", answer.body
    assert "Retry-After" in {k.title() for k in answer.headers}
