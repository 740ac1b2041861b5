"""The on-call operator finds any hand-off by the id the other team gives (``GET v1/find``): an event id or
its first characters, a session id, a message id or an external job id, in any case, across endpoints and
shards, in a few reads of the lookup index ``hoids`` whatever the number of endpoints."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from common.roundtrips import ROUND_TRIPS
from handoff import service
from handoff.messages.contract import MessageType
from handoff.projection.resolver import TransientProjectionError
from handoff.storage import keys
from tests.support.handoff_flows import Flow, nimbus
from tests.support.operator_calls import EntitiesRead

from .conftest import failed_event


def _find(call: Any, **params: str) -> list[dict[str, Any]]:
    answer = call("find_events", method="GET", params=params)
    assert answer.status == 200, answer.body
    return list(answer.json["items"])


def _found(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["endpointId"], e["eventId"], e["matchedBy"]) for e in items]


def _park(resolve: Any, flow: Flow, *, session: str, job: str) -> None:
    resolve(flow.request(session_id=session))
    resolve(flow.park(message_id=f"park-{flow.event_id}", session_id=session, job=job))


def test_the_erp_job_number_finds_the_hand_off_on_whichever_endpoint_and_shard_it_is(
    call, resolve, handoff_shards: int
):
    """Given hand-offs parked on several endpoints (and shards), when the on-call engineer types the job
    number the ERP team gave, in another case, then the one hand-off is found with what matched."""
    tag = uuid.uuid4().hex[:8]
    flows = [Flow(endpoint=f"Erp{n}-{tag}", event_id=f"{tag}-ev-{n}") for n in range(5)]
    for n, flow in enumerate(flows):
        _park(resolve, flow, session=f"Order-{tag}-{n}", job=f"JOB-{tag}-{n}")
    stuck = flows[3]
    items = _find(call, q=f"job-{tag.upper()}-3")
    assert _found(items) == [(stuck.endpoint, stuck.event_id, "externalJobId")]
    assert items[0]["matches"] == [{"kind": "externalJobId", "value": f"JOB-{tag}-3"}]
    assert items[0]["resolutionStatus"] == "Pending" and items[0]["pendingSubStatus"] == "Handoff"
    assert items[0]["externalJobId"] == f"JOB-{tag}-3"
    # each kind of id, in another case
    assert _found(_find(call, q=f"ORDER-{tag.upper()}-3")) == [(stuck.endpoint, stuck.event_id, "sessionId")]
    assert _found(_find(call, q=f"PARK-{stuck.event_id.upper()}")) == [
        (stuck.endpoint, stuck.event_id, "messageId")
    ]
    assert _found(_find(call, q=stuck.event_id.upper())) == [(stuck.endpoint, stuck.event_id, "eventId")]
    # the exact questions answer their kind only
    assert _found(_find(call, externalJobId=f"job-{tag}-3")) == [
        (stuck.endpoint, stuck.event_id, "externalJobId")
    ]
    assert _find(call, sessionId=f"JOB-{tag}-3") == []
    assert _found(_find(call, sessionId=f"order-{tag}-3")) == [(stuck.endpoint, stuck.event_id, "sessionId")]
    assert _found(_find(call, messageId=f"park-{stuck.event_id}")) == [
        (stuck.endpoint, stuck.event_id, "messageId")
    ]
    assert _find(call, messageId=f"JOB-{tag}-3") == []


def test_an_event_id_prefix_in_any_case_finds_every_endpoint_but_a_fragment_from_the_middle_does_not(
    call, resolve, handoff_shards: int
):
    tag = uuid.uuid4().hex[:8]
    one = Flow(endpoint=f"Billing-{tag}", event_id=f"Ab{tag}-inv-1")
    two = Flow(endpoint=f"Shipping-{tag}", event_id=f"ab{tag}-inv-2")
    other = Flow(endpoint=f"Billing-{tag}", event_id=f"zz{tag}-inv-3")
    for flow in (one, two, other):
        resolve(flow.request())
    prefix = _find(call, q=f"AB{tag.upper()}")
    assert sorted((e["endpointId"], e["eventId"], e["matchedBy"]) for e in prefix) == [
        (one.endpoint, one.event_id, "eventId"),
        (two.endpoint, two.event_id, "eventId"),
    ]
    assert _found(_find(call, eventId=f"ab{tag}-INV-1")) == [(one.endpoint, one.event_id, "eventId")]
    # a whole id comes first, then the ids it begins
    assert [e["eventId"] for e in _find(call, q=f"ab{tag}-inv-2")] == [two.event_id]
    # a fragment from the middle of an id matches nothing, in any case
    assert _find(call, q=f"{tag}-inv") == []
    assert _find(call, q="INV-1") == []
    assert _find(call, eventId=tag[2:]) == []


def test_fewer_than_three_characters_find_only_a_whole_id_and_an_event_id_prefix_is_refused(call, resolve):
    tag = uuid.uuid4().hex[:8]
    short = Flow(endpoint=f"Short-{tag}", event_id="Q7")
    longer = Flow(endpoint=f"Short-{tag}", event_id=f"q7{tag}")
    resolve(short.request())
    resolve(longer.request())
    mine = [e for e in _find(call, q="q7") if e["endpointId"] == short.endpoint]
    assert [(e["eventId"], e["matchedBy"]) for e in mine] == [("Q7", "eventId")]
    refused = call("find_events", method="GET", params={"eventId": "q7"})
    assert refused.status == 400 and refused.json["field"] == "eventId"
    nothing = call("find_events", method="GET", params={})
    assert nothing.status == 400 and nothing.json["field"] == "q"
    blank = call("find_events", method="GET", params={"q": "   "})
    assert blank.status == 400 and blank.json["field"] == "q"
    huge = call("find_events", method="GET", params={"q": "x" * 5000})
    assert huge.status == 400 and huge.json["field"] == "q"


def test_ids_with_characters_table_keys_forbid_are_found(call, resolve):
    tag = uuid.uuid4().hex[:8]
    flow = Flow(endpoint=f"Odd/{tag}#?", event_id=f"ev/{tag}\\#?%|~")
    resolve(flow.request(session_id=f"s/{tag}?#"))
    resolve(flow.park(message_id=f"m\\{tag}", session_id=f"s/{tag}?#", job=f"JOB/{tag}#1?"))
    for q, kind in [
        (f"EV/{tag}\\#", "eventId"),
        (f"s/{tag.upper()}?#", "sessionId"),
        (f"M\\{tag}", "messageId"),
        (f"job/{tag}#1?", "externalJobId"),
    ]:
        assert _found(_find(call, q=q)) == [(flow.endpoint, flow.event_id, kind)], q


def test_a_session_finds_its_events_on_every_endpoint_oldest_first(call, resolve):
    tag = uuid.uuid4().hex[:8]
    session = f"customer-{tag}"
    one = Flow(endpoint=f"FindB-{tag}", event_id=f"inv-{tag}-1")
    two = Flow(endpoint=f"FindS-{tag}", event_id=f"inv-{tag}-2")
    resolve(nimbus("EventRequest", endpoint=one.endpoint, event_id=one.event_id, session_id=session))
    resolve(nimbus("EventRequest", endpoint=two.endpoint, event_id=two.event_id, session_id=session))
    resolve(nimbus("EventRequest", endpoint=two.endpoint, event_id=f"oth-{tag}", session_id="another"))
    items = _find(call, sessionId=session.upper())
    assert [(e["endpointId"], e["eventId"], e["sessionId"]) for e in items] == [
        (one.endpoint, one.event_id, session),
        (two.endpoint, two.event_id, session),
    ]


def test_one_find_costs_three_requests_at_any_number_of_endpoints_and_shards(
    resolve, fresh_tables, handoff_shards: int
):
    """Whatever the endpoints and shards: the event-id range and the exact-id partition of hoids (sent
    together), then one point read of the hand-off found."""
    from management import find
    from management.failed import page as failed_page

    endpoints = [f"Node{n}" for n in range(8)]
    for endpoint in endpoints:
        for n in range(3):
            flow = Flow(endpoint=endpoint, event_id=f"{endpoint}-evt-{n}")
            _park(resolve, flow, session=f"{endpoint}-sess-{n}", job=f"{endpoint}-job-{n}")
    failed_event(resolve, Flow(endpoint="Node0", event_id="Node0-failed"))
    read = EntitiesRead()
    runtime.reset(policies=[read])
    try:
        store = service.store()
        find.find(store, "warm")  # the process's one table listing, before the counts
        service.layout().now()  # and its one read of the recorded layouts (common/layouts.py)
        for q, kind in [
            ("node5-EVT-1", "eventId"),
            ("NODE5-SESS-1", "sessionId"),
            ("park-Node5-evt-1", "messageId"),
            ("node5-job-1", "externalJobId"),
        ]:
            with ROUND_TRIPS.measure() as tally:
                before = read.count
                items = find.find(store, q)
            assert [(e.endpoint_id, e.event_id, e.matched_by) for e in items] == [
                ("Node5", "Node5-evt-1", kind)
            ]
            assert tally.requests == 3, (q, tally.methods)
            # and those reads return the rows of the id, not a partition's worth (a request can hide a scan)
            assert read.count - before <= 3, q
            with ROUND_TRIPS.measure() as tally:
                assert len(find.find(store, q, kinds=(kind,))) == 1
            assert tally.requests == 2, (q, tally.methods)
        with ROUND_TRIPS.measure() as tally:
            failed, more = failed_page(store, page_size=50, token=None)
        assert more is None
        assert [(e.endpoint_id, e.event_id) for e in failed] == [("Node0", "Node0-failed")]
        # the endpoint list, the first page of two buckets per endpoint and shard
        assert tally.requests == 1 + 2 * len(endpoints) * handoff_shards
    finally:
        runtime.reset()


class RefuseIndexInserts(SansIOHTTPPolicy):  # type: ignore[type-arg]
    """Storage unreachable for inserts into hoids (the event table still answers)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def on_request(self, request: Any) -> None:
        http = request.http_request
        if http.method == "POST" and http.url.split("?", 1)[0].rstrip("/").endswith(keys.IDS_TABLE):
            self.refused += 1
            raise ServiceRequestError("hoids unreachable (test)")


@pytest.mark.parametrize("shards", [1, 4])
def test_a_lost_index_write_is_repaired_by_the_reconciler(call, resolve, monkeypatch, shards: int) -> None:
    """Given the index inserts fail while the hand-off is projected, the request is projected all the same
    and the next reconciler run writes its rows; the park waits for its job's row (the job lookup reads
    only the index, ADR-0022): retried, not written, until the index answers again."""
    monkeypatch.setenv(keys.SHARDS_SETTING, str(shards))
    tag = uuid.uuid4().hex[:8]
    flow = Flow(endpoint=f"Lost-{tag}", event_id=f"lost-{tag}")
    refuse = RefuseIndexInserts()
    runtime.reset(policies=[refuse], client_options={"retry_total": 0})
    try:
        resolve(flow.request(session_id=f"sess-{tag}"))
        with pytest.raises(TransientProjectionError):  # raised to the host: Service Bus delivers it again
            resolve(flow.park(message_id=f"park-{flow.event_id}", session_id=f"sess-{tag}", job=f"JOB-{tag}"))
    finally:
        runtime.reset()
    assert refuse.refused >= 4  # message ids, event id, session id, job id
    row = service.store().get_event(flow.endpoint, flow.event_id)
    assert row is not None and not row.is_pending_handoff  # the request projected; the park retried
    assert _find(call, q=f"job-{tag}") == []
    resolve(flow.park(message_id=f"park-{flow.event_id}", session_id=f"sess-{tag}", job=f"JOB-{tag}"))
    parked = service.store().get_event(flow.endpoint, flow.event_id)
    assert parked is not None and parked.is_pending_handoff  # the redelivery, once the index answers
    report = service.reconciler().run()
    assert report.indexed.count(flow.event_id) == 1  # the request's repair row
    assert not report.errors.get(flow.endpoint)
    for q, kind in [
        (f"job-{tag}", "externalJobId"),
        (f"SESS-{tag}", "sessionId"),
        (f"LOST-{tag}", "eventId"),
        (f"PARK-lost-{tag}", "messageId"),
    ]:
        assert _found(_find(call, q=q)) == [(flow.endpoint, flow.event_id, kind)]
    # the repair rows are gone: the next run has nothing to do for this endpoint
    again = service.reconciler().run()
    assert flow.event_id not in again.indexed
    rows = service.store().due_reconcile(flow.endpoint, service.settlement_service().clock())
    assert [r for r in rows if r.task] == []


def test_a_message_projected_after_a_lost_write_still_finds_it_once(call, resolve) -> None:
    """A repair row replayed after the rows were written by a later message changes nothing (inserts)."""
    tag = uuid.uuid4().hex[:8]
    flow = Flow(endpoint=f"Twice-{tag}", event_id=f"twice-{tag}")
    runtime.reset(policies=[RefuseIndexInserts()], client_options={"retry_total": 0})
    try:
        resolve(flow.request(session_id=f"s-{tag}"))
    finally:
        runtime.reset()
    resolve(flow.response(MessageType.ResolutionResponse, session_id=f"s-{tag}"))  # writes the event's ids
    assert _found(_find(call, q=f"s-{tag}")) == [(flow.endpoint, flow.event_id, "sessionId")]
    report = service.reconciler().run()
    assert flow.event_id in report.indexed and not report.errors.get(flow.endpoint)
    assert _found(_find(call, q=f"s-{tag}")) == [(flow.endpoint, flow.event_id, "sessionId")]
