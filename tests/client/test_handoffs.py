"""Hand-offs through the client, against the development host with the loopback transport.

A hand-off is parked by feeding the resolver through the host's admin endpoint (EventRequest, then
the endpoint's PendingHandoffResponse); the agent loop receives and settles it.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from settle_client import Conflict, ContentTruncated, SettleClient

from tests.client.conftest import FAST_RETRY, Gate, LoseAnswers, park, some


@pytest.fixture
def endpoint() -> str:
    return f"Billing{uuid.uuid4().hex[:8]}"


def test_the_agent_loop_settles_a_parked_handoff(settle, host, endpoint):
    event_id = park(host, endpoint, body={"invoiceId": "INV-7"})
    assert settle.events.get(endpoint, event_id).is_pending_handoff

    settled = []
    for handoff in settle.handoffs.watch(endpoint, event_types=["InvoiceCreated"], wait_seconds=2):
        assert handoff.coordinates.event_id == event_id
        assert handoff.payload_json() == {"invoiceId": "INV-7"}
        accepted = handoff.complete(result={"ledgerEntry": 7781}, settled_by="agent-test")
        settled.append(accepted)
        break

    assert settled[0].message_type == "HandoffCompletedRequest" and settled[0].event_id == event_id
    event = settle.events.get(endpoint, event_id)
    assert (event.resolution_status, event.pending_sub_status) == ("Pending", None)
    assert [(a.audit_type, a.auditor_name) for a in event.audits] == [("CompleteHandoff", "agent-test")]
    assert settle.handoffs.next(endpoint) is None


def test_an_agent_fails_a_handoff_and_skips_other_event_types(settle, host, endpoint):
    other = park(host, endpoint, event_type="InvoiceCancelled")
    wanted = park(host, endpoint, event_type="InvoiceCreated")
    handoff = settle.handoffs.next(endpoint, event_types=["InvoiceCreated"])
    assert handoff is not None and handoff.coordinates.event_id == wanted
    handoff.fail("DMF import rejected 3 rows", error_type="DmfValidation")
    assert handoff.settled
    assert settle.events.get(endpoint, wanted).audits[0].audit_type == "FailHandoff"
    assert settle.handoffs.next(endpoint, event_types=["InvoiceCreated"]) is None
    assert settle.handoffs.next(endpoint).coordinates.event_id == other


def test_job_lookup_and_unknowns_are_none(settle, host, endpoint):
    event_id = park(host, endpoint)
    handoff = settle.handoffs.next(endpoint)
    assert handoff is not None
    found = settle.handoffs.job(endpoint, handoff.external_job_id)
    assert found is not None and found.coordinates.event_id == event_id
    assert settle.handoffs.job(endpoint, "no-such-job") is None
    assert settle.events.get(endpoint, "no-such-event") is None
    assert settle.handoffs.next("NoSuchEndpoint") is None


def test_a_repeated_settlement_is_answered_from_its_claim_and_another_is_a_conflict(settle, host, endpoint):
    event_id = park(host, endpoint)
    handoff = settle.handoffs.next(endpoint)
    first = handoff.complete()
    again = settle.handoffs.complete(endpoint, handoff.coordinates)
    assert again.replayed and again.control_message_id == first.control_message_id
    with pytest.raises(Conflict) as other:
        settle.handoffs.fail(endpoint, handoff.coordinates, "changed my mind")
    assert other.value.status == 409
    audits = some(settle.events.get(endpoint, event_id)).audits
    assert [a.audit_type for a in audits] == ["CompleteHandoff"]


def test_a_lost_settlement_answer_is_retried_and_settles_once(host, endpoint):
    event_id = park(host, endpoint)
    lossy = LoseAnswers("/v1/handoffs/complete")
    with SettleClient(host.base_url, transport=lossy, retry=FAST_RETRY) as client:
        handoff = client.handoffs.next(endpoint)
        accepted = some(handoff).complete(result={"n": 1})
        assert accepted.replayed and len(lossy.sent) >= 2
        audits = some(client.events.get(endpoint, event_id)).audits
        assert [a.audit_type for a in audits] == ["CompleteHandoff"]


def test_watch_stops_when_asked_and_revisits_an_unsettled_handoff_later(settle, host, endpoint):
    park(host, endpoint)
    stop = threading.Event()
    seen = []
    for handoff in settle.handoffs.watch(
        endpoint, wait_seconds=1, revisit_seconds=0.2, stop=stop, leased=False
    ):
        seen.append(handoff.coordinates.event_id)  # left unsettled: the job is still running
        if len(seen) == 2:
            stop.set()
    assert len(seen) == 2 and seen[0] == seen[1]
    assert settle.handoffs.next(endpoint) is not None  # still parked: watching never claims


def test_watch_stops_from_another_thread_within_one_poll(host, endpoint):
    polling = Gate("/receive")
    polling.opened.set()  # let every poll through; ``waiting`` tells that one was sent
    stop = threading.Event()
    finished = threading.Event()

    with SettleClient(host.base_url, transport=polling) as client:

        def agent() -> None:
            for _ in client.handoffs.watch(endpoint, wait_seconds=1, stop=stop):
                pytest.fail("nothing is parked")
            finished.set()

        thread = threading.Thread(target=agent, daemon=True)
        thread.start()
        assert polling.waiting.wait(30), "the agent never polled"
        stop.set()
        thread.join(30)
        assert finished.is_set()


def test_a_parked_body_settle_stored_truncated_is_said_not_read_as_empty(settle, host, endpoint):
    """Settle stores a body too large for a row truncated; ``next`` then has no payload. The
    agent must learn the body was cut, not read it as "no body" and settle on nothing."""
    park(host, endpoint, body={"invoiceId": "INV-BIG", "rows": "x" * 600_000})
    handoff = some(settle.handoffs.next(endpoint))
    assert handoff.content_truncated is True
    with pytest.raises(ContentTruncated) as cut:
        handoff.payload_json()
    assert cut.value.field == "payload" and isinstance(cut.value, ValueError)
    event = some(settle.events.get(endpoint, handoff.coordinates.event_id))
    assert event.content_truncated is True
    assert any(h.content_truncated for h in event.history)

    small = park(host, f"{endpoint}s", body={"invoiceId": "INV-SMALL"})
    whole = some(settle.handoffs.next(f"{endpoint}s"))
    assert whole.coordinates.event_id == small and whole.content_truncated is False
    assert whole.payload_json() == {"invoiceId": "INV-SMALL"}
