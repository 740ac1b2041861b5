"""The claim rules (``handoff.settlement.claims``) and the lease rules (``handoff.receive.leases``) on their
own: no storage.

Example tests name one rule each; the property test drives many settlers, lease holders, re-senders and
releases at random times against an in-memory table (``memory_table``) and checks that two different
control messages of one hand-off never both reach the broker, that a released claim can be taken again,
and that a write from a stale read never wins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from common.clock import iso
from common.errors import Conflict
from common.transactions import Refusal
from handoff.messages.contract import MessageType, ResolutionStatus
from handoff.receive import leases
from handoff.receive.leases import LeaseLost
from handoff.settlement import claims
from handoff.settlement.claims import ClaimOrder, ClaimRefused, SettlementInFlight
from handoff.settlement.settler import SettlementService
from handoff.settlement.timing import CONFIRM_AFTER
from handoff.storage import keys
from handoff.storage.claim_state import ClaimState
from handoff.storage.keys import Layout
from handoff.storage.records import AuditRow, ClaimRow, QueueRow
from handoff.storage.store import HandoffStore
from tests.support.examples import examples

from .claim_rows import (
    CLAIM_KEY,
    EVENT,
    PARKED,
    PK,
    QUEUE_KEY,
    T0,
    claim_row,
    message,
    order,
    parked,
    tracked_claim,
)
from .memory_table import MemoryTable, Refused

LEASE_FOR = timedelta(seconds=10)


def kinds(ops: list[tuple[object, ...]]) -> list[tuple[object, str]]:
    return [(op[0], str(op[1]["RowKey"])) for op in ops]  # type: ignore[index]


# -- taken ------------------------------------------------------------------------------------------


def test_a_settlement_claim_marks_the_queue_row_with_its_first_look_and_writes_no_reconcile_row() -> None:
    plan = claims.plan_claim(order(), parked(), message("ctl-1"), "{}", pk=PK, now=T0)

    # No audit row: the claim is the audit (ADR-0022 change 3); no reconcile row: the queue mark says when
    # the reconciler first looks (change 9)
    assert kinds(plan.ops) == [("create", CLAIM_KEY), ("update", QUEUE_KEY)]
    assert plan.ops[1][1] == {
        "PartitionKey": PK,
        "RowKey": QUEUE_KEY,
        "ClaimedUntil": leases.CLAIMED,
        "ReconcileAt": T0 + CONFIRM_AFTER,
    }
    assert "etag" not in plan.ops[1][2]  # If-Match *: only that the hand-off is still queued
    assert plan.fence is None and plan.pin is None
    assert plan.claim.state is ClaimState.sending and plan.claim.control_message_id == "ctl-1"
    assert plan.ops[0][1]["ReconcileKey"] == "" and claims.followed_on_queue(plan.claim)


def test_a_claim_without_a_queue_row_is_followed_through_a_reconcile_row_of_its_own() -> None:
    for asked, row in ((order(pins_event=True), parked()), (order(), parked(queue_key=None))):
        plan = claims.plan_claim(asked, row, message("ctl-1"), "{}", pk=PK, now=T0)

        reconcile_key = keys.reconcile_row(T0 + CONFIRM_AFTER, EVENT, PARKED)
        assert kinds(plan.ops[:2]) == [("create", CLAIM_KEY), ("create", reconcile_key)]
        assert plan.claim.reconcile_key == reconcile_key and not claims.followed_on_queue(plan.claim)
        assert all("ReconcileAt" not in op[1] for op in plan.ops)


def test_a_claim_is_followed_on_its_queue_mark_only_while_sending_and_given_no_later_look() -> None:
    claim = claim_row()

    assert claims.followed_on_queue(claim)
    assert not claims.followed_on_queue(claim.model_copy(update={"state": ClaimState.sent}))
    assert not claims.followed_on_queue(claim.model_copy(update={"state": ClaimState.unconfirmed}))
    assert not claims.followed_on_queue(claim.model_copy(update={"reconcile_key": "rc|x"}))
    queued = QueueRow(event_id=EVENT, parked_message_id=PARKED, row_key=QUEUE_KEY, etag='"q3"')
    look = claims.plan_queue_look(PK, queued, claims.RECONCILED)
    assert look == (
        "update",
        {"PartitionKey": PK, "RowKey": QUEUE_KEY, "ReconcileAt": claims.RECONCILED},
        look[2],
    )
    assert look[2]["etag"] == '"q3"'  # a claim taken again since has its own mark: never moved here


def test_a_claim_carries_the_audit_the_row_beside_it_used_to_hold() -> None:
    asked = dataclasses.replace(
        order(), principal_name="Billing App", principal_id="oid-9", audit_comment="why", agent_id="a-7"
    )
    plan = claims.plan_claim(asked, parked(), message("ctl-1"), '{"controlMessageId":"ctl-1"}', pk=PK, now=T0)

    # The claim as written (and read back) renders the audit row the claim transaction used to insert
    written = ClaimRow.from_entity(plan.ops[0][1])
    assert written.audit_key == "" and plan.ops[0][1]["AuditKey"] == ""  # rendered from the claim
    expected = AuditRow.of(
        parked(), T0, asked, "CompleteHandoff", comment="why", data='{"controlMessageId":"ctl-1"}'
    )
    assert written.audit() == expected == plan.claim.audit()
    # A claim written before (its own audit row, ``AuditKey``) renders nothing: that row is its audit
    legacy = written.model_copy(update={"audit_key": keys.audit_row(EVENT, T0, "x")})
    assert legacy.audit() is None
    assert ClaimRow.from_entity({"RowKey": CLAIM_KEY, **_legacy_columns()}).audit() is None


def _legacy_columns() -> dict[str, object]:
    """A claim row as written before ADR-0022 change 3: no audit columns, the key of its audit row."""
    return {
        "EventId": EVENT,
        "ParkedMessageId": PARKED,
        "State": "sent",
        "ClaimedAt": T0,
        "ControlMessageId": "ctl-0",
        "MessageType": "HandoffCompletedRequest",
        "SettledBy": "agent",
        "AuditKey": keys.audit_row(EVENT, T0, "legacy"),
    }


def test_a_leased_claim_is_fenced_by_the_queue_row_as_read_holding_the_lease() -> None:
    plan = claims.plan_claim(order(token="tok"), parked(), message(), "{}", pk=PK, now=T0)

    assert plan.fence == 1
    fenced = plan.fenced('"q7"')
    assert fenced[1][1]["ClaimedUntil"] == leases.CLAIMED and fenced[1][2]["etag"] == '"q7"'
    assert fenced[1][1]["ReconcileAt"] == T0 + CONFIRM_AFTER
    assert fenced[:1] == plan.ops[:1]


def test_an_operator_claim_pins_the_event_row_as_checked_and_needs_its_etag() -> None:
    plan = claims.plan_claim(order(pins_event=True), parked(), message(), "{}", pk=PK, now=T0)

    assert plan.pin == 2 and plan.ops[2][2]["etag"] == '"e1"'
    with pytest.raises(ValueError, match="ETag"):
        claims.plan_claim(order(pins_event=True), parked(etag=None), message(), "{}", pk=PK, now=T0)


@pytest.mark.parametrize(
    ("index", "status", "fenced", "pinned", "verdict"),
    [
        (0, 409, False, False, ClaimRefused.TAKEN),
        (1, 412, True, False, ClaimRefused.LEASE_MOVED),
        (1, 404, True, False, ClaimRefused.NOT_PARKED),
        (1, 404, False, False, ClaimRefused.NOT_PARKED),
        (2, 412, False, True, ClaimRefused.EVENT_MOVED),
        (2, 404, False, True, ClaimRefused.EVENT_MOVED),
        (1, 409, False, False, ClaimRefused.OTHER),
        (None, 412, False, False, ClaimRefused.OTHER),
    ],
)
def test_what_a_refused_claim_means(
    index: int | None, status: int, fenced: bool, pinned: bool, verdict: ClaimRefused
) -> None:
    plan = claims.plan_claim(
        order(token="tok" if fenced else None, pins_event=pinned), parked(), message(), "{}", pk=PK, now=T0
    )

    assert claims.claim_refused(plan, Refusal(index=index, status=status, code="")) is verdict


def test_a_lease_fences_only_while_its_token_holds_the_queue_row() -> None:
    held = QueueRow(event_id=EVENT, parked_message_id=PARKED, lease_token="tok", etag='"q1"')

    assert claims.holds_lease(held, "tok")
    assert not claims.holds_lease(held, "other")
    assert not claims.holds_lease(held.model_copy(update={"etag": None}), "tok")


def test_a_lost_lease_answers_our_own_retry_from_its_claim_and_refuses_anyone_else() -> None:
    ours = claim_row()

    assert claims.retried_or_lost(order("req-a"), ours) is ours
    with pytest.raises(LeaseLost):
        claims.retried_or_lost(order("req-b"), ours)
    with pytest.raises(LeaseLost):
        claims.retried_or_lost(order("req-a"), None)


# -- replayed ---------------------------------------------------------------------------------------


def test_a_claim_answers_the_same_request_and_refuses_another_however_old() -> None:
    old = claim_row(claimed_at=T0 - timedelta(days=30), state=ClaimState.unconfirmed)

    assert claims.replay(old, "req-a") is old
    with pytest.raises(SettlementInFlight):
        claims.replay(old, "req-b")


def test_a_superseded_claim_answers_no_retry() -> None:
    superseded = claim_row(state=ClaimState.superseded)
    sent = claim_row(parked_message_id="park-2", state=ClaimState.sent)

    assert claims.replayable([superseded], "req-a") is None
    assert claims.replayable([superseded, sent], "req-a") is sent
    assert claims.replayable([sent], "req-b") is None


# -- moved ------------------------------------------------------------------------------------------


def test_a_sent_claim_records_the_send_and_leaves_the_reconciler() -> None:
    for claim in (claim_row(), tracked_claim()):
        move = claims.plan_transition(PK, claim, ClaimState.sent, now=T0, sent=True, attempt=True)

        merged = move.ops[0][1]
        assert merged["State"] == "sent" and merged["LastSentAt"] == T0 and merged["Attempts"] == 1
        assert move.ops[0][2]["etag"] == '"c1"'
        # A settlement's claim is one write (its queue mark is left to the projection); a reconcile row goes
        assert kinds(move.ops[1:]) == ([("delete", str(claim.reconcile_key))] if claim.reconcile_key else [])
        assert not move.moved.reconcile_key and move.moved.last_sent_at == T0
        assert not claims.followed_on_queue(move.moved)
        assert move.applied([{"etag": '"c2"'}]).etag == '"c2"'


def test_an_unconfirmed_claim_is_listed_for_operators_once_and_unlisted_when_it_moves_on() -> None:
    claim = tracked_claim()
    due = T0 + timedelta(minutes=5)
    listed = claims.plan_transition(PK, claim, ClaimState.unconfirmed, now=T0, due=due)
    unconfirmed_key = keys.unconfirmed_row(EVENT, PARKED)
    reconcile_key = keys.reconcile_row(due, EVENT, PARKED)

    assert kinds(listed.ops[1:]) == [
        ("delete", str(claim.reconcile_key)),
        ("create", reconcile_key),
        ("create", unconfirmed_key),
    ]
    # Followed on its queue mark until then: the later look is a reconcile row of its own (nothing to delete)
    from_queue = claims.plan_transition(PK, claim_row(), ClaimState.unconfirmed, now=T0, due=due)
    assert kinds(from_queue.ops[1:]) == [("create", reconcile_key), ("create", unconfirmed_key)]
    assert not claims.followed_on_queue(from_queue.moved)
    again = claims.plan_transition(PK, listed.moved, ClaimState.unconfirmed, now=T0, due=due)
    assert len(again.ops) == 1  # same reconcile row, already listed
    delivered = claims.plan_transition(PK, listed.moved, ClaimState.delivered, now=T0)
    assert kinds(delivered.ops[1:]) == [("delete", reconcile_key), ("delete", unconfirmed_key)]


def test_an_unrecorded_move_is_answered_as_it_was_unless_the_broker_took_the_message() -> None:
    claim = claim_row()

    # A storage fault: nobody else wrote the claim (read again unchanged, or not readable at all)
    for current in (claim, None):
        assert claims.unrecorded(claim, current, sent=True).state is ClaimState.sent
        assert claims.unrecorded(claim, current, sent=False) == claim


@pytest.mark.parametrize(
    ("stored", "sent", "answered"),
    [
        (ClaimState.delivered, False, ClaimState.delivered),  # an identical replay's move won the race
        (ClaimState.delivered, True, ClaimState.delivered),
        (ClaimState.superseded, False, ClaimState.superseded),
        (ClaimState.unconfirmed, False, ClaimState.unconfirmed),
        (ClaimState.sending, True, ClaimState.sent),  # the broker took it: still behind in storage
        (ClaimState.sent, False, ClaimState.sent),
    ],
)
def test_a_move_that_lost_to_another_writer_is_answered_as_storage_holds_the_claim(
    stored: ClaimState, sent: bool, answered: ClaimState
) -> None:
    claim = claim_row()
    current = claim.model_copy(update={"state": stored, "etag": '"c9"'})

    answer = claims.unrecorded(claim, current, sent=sent)

    assert answer.state is answered
    assert answer.etag == '"c9"'  # the claim as read again, never the one read before the move


@pytest.mark.parametrize(
    ("state", "current_state", "same_etag", "redo"),
    [
        (ClaimState.sent, ClaimState.sending, False, True),
        (ClaimState.sent, ClaimState.unconfirmed, False, True),
        (ClaimState.sent, ClaimState.sent, False, False),
        (ClaimState.sent, ClaimState.sending, True, False),  # not someone else's write: a fault
        (ClaimState.delivered, ClaimState.sent, False, True),
        (ClaimState.delivered, ClaimState.superseded, False, False),
        (ClaimState.superseded, ClaimState.sending, False, False),  # no progress to keep
        (ClaimState.unconfirmed, ClaimState.sending, False, False),
    ],
)
def test_a_lost_move_is_redone_only_while_the_claim_is_behind_it(
    state: ClaimState, current_state: ClaimState, same_etag: bool, redo: bool
) -> None:
    claim = claim_row()
    current = claim.model_copy(update={"state": current_state, "etag": '"c1"' if same_etag else '"c9"'})

    assert claims.redo(claim, current, state) is redo
    assert not claims.redo(claim, None, state)


def test_a_claim_moved_on_when_its_hand_off_is_no_longer_parked_by_its_message() -> None:
    claim = claim_row()
    row = parked()

    assert not claims.moved_on(claim, row)
    assert claims.moved_on(claim, None)
    assert claims.moved_on(claim, row.model_copy(update={"last_message_id": "park-2"}))
    completed = row.model_copy(
        update={"resolution_status": ResolutionStatus.Completed, "pending_sub_status": None}
    )
    assert claims.moved_on(claim, completed)
    operator = claim.model_copy(update={"message_type": MessageType.ResubmissionRequest})
    assert not claims.moved_on(operator, completed)  # an operator action addresses the row's last message


# -- pinned and released ------------------------------------------------------------------------------


def test_a_pin_writes_the_claim_if_match_its_etag() -> None:
    claim = claim_row(attempts=2)
    op = claims.plan_pin(PK, claim, now=T0, count=True)

    assert op[1]["Attempts"] == 3 and op[2]["etag"] == '"c1"'
    assert "Attempts" not in claims.plan_pin(PK, claim, now=T0, count=False)[1]
    after = claims.pinned(claim, {"etag": '"c2"'}, now=T0, count=True)
    assert (after.etag, after.attempts, after.updated_at) == ('"c2"', 3, T0)


def test_a_release_deletes_the_claim_as_its_sender_wrote_it_and_frees_the_queue_row() -> None:
    claim = claim_row()
    release = claims.plan_release(PK, parked(), claim)

    # The claim's audit is rendered from it: deleting the claim is deleting its audit; the queue mark's
    # ReconcileAt stays, read only while the row is marked claimed
    assert kinds(release.ops) == [("delete", CLAIM_KEY), ("update", QUEUE_KEY)]
    assert release.ops[0][2]["etag"] == '"c1"' and release.ops[1][1]["ClaimedUntil"] == leases.UNCLAIMED
    # The queue row is gone (projected away): the claim is released alone; nothing else is retried.
    assert release.again(Refusal(index=1, status=404, code="ResourceNotFound")) == release.ops[:1]
    assert release.again(Refusal(index=0, status=412, code="")) is None
    assert release.again(None) is None
    assert claims.plan_release(PK, parked(queue_key=None), claim).mark is None
    # A claim with a reconcile row of its own takes it with it
    assert kinds(claims.plan_release(PK, parked(), tracked_claim()).ops) == [
        ("delete", CLAIM_KEY),
        ("delete", str(tracked_claim().reconcile_key)),
        ("update", QUEUE_KEY),
    ]


def test_a_release_of_a_claim_written_with_its_own_audit_row_deletes_that_row_too() -> None:
    legacy = tracked_claim(audit_key=keys.audit_row(EVENT, T0, "legacy"))
    release = claims.plan_release(PK, parked(), legacy)

    assert kinds(release.ops) == [
        ("delete", CLAIM_KEY),
        ("delete", str(legacy.audit_key)),
        ("delete", str(legacy.reconcile_key)),
        ("update", QUEUE_KEY),
    ]
    assert release.mark == 3


# -- leases -------------------------------------------------------------------------------------------


def test_a_lease_holds_until_released_settled_or_taken() -> None:
    entry = QueueRow(event_id=EVENT, parked_message_id=PARKED, lease_token="tok", claimed_until=iso(T0))

    assert leases.held(entry, "tok")
    assert not leases.held(entry, "other")
    assert not leases.held(None, "tok")
    assert not leases.held(entry.model_copy(update={"claimed_until": leases.UNCLAIMED}), "tok")
    assert not leases.held(entry.model_copy(update={"claimed_until": leases.CLAIMED}), "tok")


def test_a_lease_write_is_lost_when_the_queue_row_changed_or_left() -> None:
    assert leases.lost(Refusal(index=0, status=412, code=""))
    assert leases.lost(Refusal(index=0, status=404, code="ResourceNotFound"))
    assert not leases.lost(Refusal(index=0, status=409, code=""))
    assert not leases.lost(None)


# -- the model ----------------------------------------------------------------------------------------


def take(table: MemoryTable, want: ClaimOrder, now: datetime) -> tuple[str, ClaimRow | None]:
    """A settlement's claim, taken by the real service (``SettlementService._claim``: read the event, plan,
    fence by the lease, submit, ask the rules again) on the model's table."""
    settlement = SettlementService(
        HandoffStore(table.tables, Layout()), lambda: _NO_TRANSPORT, clock=lambda: now
    )
    row = settlement.store.get_event("Billing", EVENT)
    assert row is not None
    try:
        claim, existing = settlement._claim(want, row, message(), "{}")
    except LeaseLost:
        return "lease-lost", None
    except SettlementInFlight:
        return "in-flight", None
    return ("claimed", claim) if existing is None else ("replayed", existing)


_NO_TRANSPORT: Any = None  # the claim is taken before any send


def test_a_refused_send_cannot_release_a_claim_a_re_sender_pinned_first() -> None:
    table = MemoryTable()
    table.submit([("create", parked(etag=None).to_entity(PK, keys.event_row(EVENT)))])
    table.submit([("create", QueueRow(event_id=EVENT, parked_message_id=PARKED).to_entity(PK, QUEUE_KEY))])
    answer, first = take(table, order("req-a"), T0)
    assert answer == "claimed" and first is not None
    read = table.read(ClaimRow, PK, CLAIM_KEY)
    assert read is not None

    table.submit([claims.plan_pin(PK, read, now=T0, count=True)])  # a retry re-sends the identical message
    with pytest.raises(Refused) as refused:  # the first sender's send was refused meanwhile
        table.submit(claims.plan_release(PK, parked(), first).ops)

    assert refused.value.refusal.at(0) and refused.value.refusal.changed
    assert take(table, order("req-b"), T0)[0] == "in-flight"  # so no second, different message


@dataclass
class Agent:
    digest: str
    token: str | None = None
    queue_read: QueueRow | None = None  # a read of the queue row it may write from later (or never)
    claim: ClaimRow | None = None  # claimed, the send not yet returned
    claim_read: ClaimRow | None = None  # a re-sender's read of the claim
    answers: list[str] = field(default_factory=list)


AGENTS = st.integers(min_value=0, max_value=1)


class Settlements(RuleBasedStateMachine):
    """Agents lease, settle, send (accepted, lost or refused), re-send and release one parked hand-off."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.table = MemoryTable()
        row = parked(etag=None)
        queue = QueueRow(event_id=EVENT, parked_message_id=PARKED)
        self.table.submit([("create", row.to_entity(PK, keys.event_row(EVENT)))])
        self.table.submit([("create", queue.to_entity(PK, QUEUE_KEY))])
        self.agents = [Agent(digest=f"req-{n}") for n in range(2)]
        self.reached: set[str] = set()  # control messages that reached (or may have reached) the broker

    def queue(self) -> QueueRow:
        found = self.table.read(QueueRow, PK, QUEUE_KEY)
        assert found is not None
        return found

    @rule(seconds=st.integers(min_value=1, max_value=8))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(n=AGENTS)
    def read_queue_row(self, n: int) -> None:
        self.agents[n].queue_read = self.queue()

    @rule(n=AGENTS)
    def receive_with_a_lease(self, n: int) -> None:
        self.agents[n].queue_read = self.queue()
        self.lease_from_that_read(n)

    @rule(n=AGENTS)
    def lease_from_that_read(self, n: int) -> None:
        agent = self.agents[n]
        read, agent.queue_read = agent.queue_read, None
        if read is None or read.claimed_until >= iso(self.now):
            return  # not free in what it read: a receive would not try
        token = uuid.uuid4().hex
        stale = read.etag != self.queue().etag
        op = leases.plan_lease(PK, read, token, self.now + LEASE_FOR, f"agent-{n}", self.now)
        try:
            self.table.submit([op])
        except Refused as refused:
            assert leases.lost(refused.refusal)
            return
        assert not stale, "a lease written from a stale read of the queue row won"
        agent.token = token

    @rule(n=AGENTS)
    def give_the_lease_back(self, n: int) -> None:
        agent = self.agents[n]
        entry = self.queue()
        if agent.token is None or not leases.held(entry, agent.token):
            return
        self.table.submit([leases.plan_give_back(PK, entry)])
        agent.token = None

    @rule(n=AGENTS, leased=st.sampled_from([True, True, False]))
    def settle(self, n: int, leased: bool) -> None:
        agent = self.agents[n]
        if agent.claim is not None:
            return  # its send has not returned yet
        if leased and agent.token is None:
            self.receive_with_a_lease(n)  # a leased receive first (it may find the hand-off taken)
        token = agent.token if leased else None
        holder = self.queue().lease_token
        answer, claim = take(self.table, order(agent.digest, token=token), self.now)
        agent.answers.append(answer)
        event(f"settle: {answer}{' (leased)' if token else ''}")
        if answer == "claimed":
            assert claim is not None
            if token is not None:
                assert holder == token, "a settlement fenced by a lease another agent holds was claimed"
            agent.claim = claim

    @rule(n=AGENTS, outcome=st.sampled_from(["accepted", "lost", *["refused"] * 4]))
    def send_returns(self, n: int, outcome: str) -> None:
        agent = self.agents[n]
        claim, agent.claim = agent.claim, None
        if claim is None:
            return
        if outcome != "refused":  # accepted, or lost after the broker may have taken it
            self.reached.add(claim.control_message_id)
            if outcome == "accepted":
                sent = claims.plan_transition(PK, claim, ClaimState.sent, now=self.now, sent=True)
                with contextlib.suppress(Refused):  # best effort: the reconciler confirms it later
                    self.table.submit(sent.ops)
            return
        release = claims.plan_release(PK, parked(), claim)
        try:
            self.table.submit(release.ops)
        except Refused as refused:
            assert release.again(refused.refusal) is None  # the queue row never leaves in this model
            event("release refused: a re-sender pinned the claim")
            return  # a re-sender pinned it meanwhile: the claim stands
        event("released")
        assert self.table.get(PK, CLAIM_KEY) is None
        assert self.queue().claimed_until == leases.UNCLAIMED

    @rule(n=AGENTS)
    def read_claim_to_resend(self, n: int) -> None:
        self.agents[n].claim_read = self.table.read(ClaimRow, PK, CLAIM_KEY)

    @rule(n=AGENTS)
    def resend(self, n: int) -> None:
        self.read_claim_to_resend(n)
        self.resend_from_that_read(n)

    @rule(n=AGENTS)
    def resend_from_that_read(self, n: int) -> None:
        agent = self.agents[n]
        read, agent.claim_read = agent.claim_read, None
        if read is None or not read.state.open:
            return
        current = self.table.read(ClaimRow, PK, CLAIM_KEY)
        stale = current is None or current.etag != read.etag
        try:
            self.table.submit([claims.plan_pin(PK, read, now=self.now, count=True)])
        except Refused:
            event("re-send refused: the claim changed or was released")
            return  # changed or released meanwhile: not ours to send
        event("re-sent")
        assert not stale, "a re-send pinned from a stale read of the claim won"
        self.reached.add(read.control_message_id)  # the identical message again

    @rule()
    def a_released_hand_off_is_settled_again(self) -> None:
        if self.table.get(PK, CLAIM_KEY) is not None:
            return
        answer, claim = take(self.table, order(uuid.uuid4().hex), self.now)
        assert answer == "claimed" and claim is not None
        self.reached.add(claim.control_message_id)  # and sent

    @invariant()
    def never_two_messages_of_one_hand_off(self) -> None:
        assert len(self.reached) <= 1, self.reached

    @invariant()
    def a_hand_off_without_a_claim_is_not_marked_claimed(self) -> None:
        if self.table.get(PK, CLAIM_KEY) is None:
            assert self.queue().claimed_until != leases.CLAIMED

    @invariant()
    def another_request_never_takes_a_standing_claim(self) -> None:
        standing = self.table.read(ClaimRow, PK, CLAIM_KEY)
        if standing is not None:
            with pytest.raises(Conflict):
                claims.replay(standing, "someone-else")


Settlements.TestCase.settings = settings(
    max_examples=examples(200),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_settlements_against_the_model = Settlements.TestCase
