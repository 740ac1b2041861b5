"""The operator's services themselves (not copies of their loops), without storage: the real resolver
projects an event onto the project's in-memory table (``tests/support/memory_table.py``, held to Azurite by
the conformance suite), then the real :class:`OperatorActions`, :class:`OperatorReads` and
:class:`PoisonDesk` act on it. Each test names the service's rule it checks; a rule broken in
``management/rules.py`` or in the order a service asks it fails here under ``make test-unit``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from common.errors import Conflict, NotFound, PayloadTooLarge
from common.principal import Actor
from handoff.messages.contract import MessageType
from handoff.messages.transport import message_body
from handoff.projection.resolver import ResolverService
from handoff.settlement.settler import SettlementService
from handoff.storage import overview
from handoff.storage.counts import Capped
from handoff.storage.keys import Layout
from handoff.storage.records import PoisonRow
from handoff.storage.store import HandoffStore
from management import bulk
from management.actions import OperatorActions
from management.audits import AUDIT_TABLE
from management.poison import PoisonDesk
from management.reads import OperatorReads
from management.rules import AlreadyDismissed
from tests.handoff.conftest import CaptureTransport
from tests.support.handoff_flows import Flow
from tests.support.memory_table import MemoryTables

OPS = Actor(by="ops", principal=None)
ENDPOINT = "Billing"
EVENT = "ev-1"


class Desk:
    """One in-memory storage with the hand-off services on it, and a transport that records sends."""

    def __init__(self) -> None:
        self.tables = MemoryTables()
        self.store = HandoffStore(self.tables, Layout())  # S = 1, no earlier layout: no recorded one read
        self.transport = CaptureTransport()
        self.resolver = ResolverService(self.store, sleep=lambda _s: None)
        self.actions = OperatorActions(SettlementService(self.store, lambda: self.transport))
        self.flow = Flow(endpoint=ENDPOINT, event_id=EVENT)

    def project(self, message: Any) -> None:
        self.resolver.handle(message)

    def failed(self) -> None:
        self.project(self.flow.request())
        self.project(self.flow.response(MessageType.ErrorResponse, message_id="err-1", error_text="ERP down"))

    def reads(self) -> OperatorReads:
        from handoff.storage.overview import Overview

        return OperatorReads(self.store, Overview(self.store))

    def audit_copies(self) -> list[dict[str, Any]]:
        return list(self.tables.table(AUDIT_TABLE).query_entities("PartitionKey ne ''"))


@pytest.fixture
def desk() -> Desk:
    return Desk()


def test_a_resubmit_sends_one_resubmission_of_the_latest_payload_and_copies_its_audit(desk: Desk) -> None:
    desk.failed()
    done = desk.actions.resubmit(ENDPOINT, EVENT, OPS, event_json=None, reason="retry it")
    assert done.action == "Resubmit" and not done.accepted.replayed
    [(topic, sent)] = desk.transport.sent
    assert topic == ENDPOINT and sent.application_properties["MessageType"] == "ResubmissionRequest"
    assert json.loads(message_body(sent))["EventContent"]["EventJson"] is not None
    assert done.audit is not None and done.audit.audit_type == "Resubmit"
    assert [c["AuditType"] for c in desk.audit_copies()] == ["Resubmit"]


def test_a_retried_action_is_answered_from_its_claim_and_sends_nothing_more(desk: Desk) -> None:
    desk.failed()
    first = desk.actions.skip(ENDPOINT, EVENT, OPS, reason="stale", message_id="err-1")
    again = desk.actions.skip(ENDPOINT, EVENT, OPS, reason="stale", message_id="err-1")
    assert again.accepted.replayed and again.accepted.control_message_id == first.accepted.control_message_id
    assert len(desk.transport.sent) == 1
    assert len(desk.audit_copies()) == 1  # the retry's copy lands on the same row


def test_an_action_the_events_state_does_not_allow_is_refused_and_sends_nothing(desk: Desk) -> None:
    desk.project(desk.flow.request())  # Pending, not parked: neither resubmit nor skip
    with pytest.raises(Conflict, match="Skip is not allowed"):
        desk.actions.skip(ENDPOINT, EVENT, OPS, reason=None)
    assert desk.transport.sent == []


def test_an_action_addressed_to_a_message_that_is_not_the_current_one_is_refused(desk: Desk) -> None:
    desk.failed()
    with pytest.raises(Conflict, match="is not the current message") as refused:
        desk.actions.skip(ENDPOINT, EVENT, OPS, reason=None, message_id="req-1")
    assert refused.value.field == "messageId"
    assert desk.transport.sent == []


def test_an_unknown_event_is_not_found(desk: Desk) -> None:
    with pytest.raises(NotFound):
        desk.actions.resubmit(ENDPOINT, "nope", OPS, event_json=None, reason=None)


def test_the_event_view_offers_what_its_state_allows_and_nothing_while_a_claim_is_open(desk: Desk) -> None:
    desk.failed()
    found = desk.reads().event(ENDPOINT, EVENT)
    assert found.actions == ["resubmit", "skip"]
    assert found.claim is None and found.event_json is not None


def test_the_overview_counts_each_endpoints_events_by_status(desk: Desk) -> None:
    desk.failed()
    figures = desk.reads().figures()
    [billing] = figures.endpoints
    assert billing.endpoint_id == ENDPOINT and billing.totals["Failed"] == 1
    assert not billing.unconfirmed.at_least and billing.unconfirmed.count == 0


def test_the_overview_counts_open_events_up_to_the_cap_and_says_at_least(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a cap of 3 rows per open status, and 5 Failed events and 1 Pending on the endpoint
    monkeypatch.setattr(overview, "OPEN_COUNT_CAP", 3)
    for n in range(5):
        failing = Flow(endpoint=ENDPOINT, event_id=f"ev-f{n}")
        desk.project(failing.request())
        desk.project(failing.response(MessageType.ErrorResponse, message_id=f"err-{n}", error_text="down"))
    desk.project(desk.flow.request())

    # When the overview is read, Then Failed counts the cap and says "at least" (its oldest age too); Pending
    # is exact
    [billing] = desk.reads().figures().endpoints
    assert (billing.totals["Failed"], billing.totals["Pending"]) == (3, 1)
    assert billing.open_events.at_least == {"Failed"}
    assert billing.open_events.oldest_failed_at_least and not billing.open_events.oldest_pending_at_least

    # And a Failed listing's first page carries that count, "at least"; a Pending one its exact count
    def first_page(status: str) -> Any:
        reads = desk.reads()
        return reads.events(
            ENDPOINT,
            bucket=status,
            event_type_ids=[],
            oldest=None,
            newest=None,
            page_size=1,
            continuation=None,
        )

    assert first_page("Failed").count == Capped(3, at_least=True)
    assert first_page("Pending").count == Capped(1, at_least=False)


def test_a_dismissed_poison_message_is_not_replayed(desk: Desk) -> None:
    day, row_key = "20261205", "r-1"
    at = datetime(2026, 12, 5, 9, tzinfo=UTC)
    poison = PoisonRow(reason="bad", enqueued_time_utc=at, recorded_at=at, application_properties="{}")
    desk.tables.table("hopoison").create_entity(poison.to_entity(day, row_key))
    poison_desk = PoisonDesk(desk.store, lambda: desk.resolver)
    poison_desk.dismiss(day, row_key, OPS, "no fix will project it")
    with pytest.raises(AlreadyDismissed):
        poison_desk.replay(day, row_key, OPS)


def test_a_bulk_action_acts_once_per_selected_event_and_a_refusal_is_that_events_result(desk: Desk) -> None:
    desk.failed()
    items = bulk.run(desk.actions, ENDPOINT, [EVENT, "unknown", EVENT], OPS, action="skip", reason=None)
    results = [(i.event_id, i.status, i.slug) for i in items]
    assert results == [(EVENT, 202, None), ("unknown", 404, "not-found")]
    assert len(desk.transport.sent) == 1


def test_a_resubmission_larger_than_service_bus_takes_is_refused_before_any_claim(desk: Desk) -> None:
    desk.failed()
    huge = json.dumps({"blob": "x" * 300_000})
    with pytest.raises(PayloadTooLarge):
        desk.actions.resubmit(ENDPOINT, EVENT, OPS, event_json=huge, reason=None)
    assert desk.transport.sent == []
    assert desk.reads().event(ENDPOINT, EVENT).actions == ["resubmit", "skip"]  # no claim was taken
