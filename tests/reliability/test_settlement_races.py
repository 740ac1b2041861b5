"""Settlement exactly once under races, send failures, storage faults and process kills: one control
message per 202.

The promise: a 202 means exactly one control message reaches the endpoint; every message that reached
it has exactly one audit; at most one control message per hand-off, ever. Counted from what was
kept: copies the broker model kept (``tests/handoff/broker.py``; duplicate detection drops a repeated
MessageId inside its window), the audits of the event view (rendered from the claims, ADR-0022 change 3: a
released claim takes its audit with it), history rows of control messages, the final row state. The
one residual (no duplicate detection and an unknown send outcome: shown as ``unconfirmed``) is counted
separately and must be listed where operators look.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from common.clock import utcnow
from handoff import service
from handoff.timers.sweeper import Sweeper
from tests.conftest import Caller, HttpResult
from tests.handoff.broker import Broker, BrokerTransport
from tests.reliability.faults import FAULTS, WHENS
from tests.reliability.nimbus_model import Msg, service_bus_message
from tests.reliability.settle_child import read_topic_file
from tests.reliability.tally import TALLY, sized
from tests.support import children

pytestmark = pytest.mark.slow

AREA = "settlement races"
ROOT = Path(__file__).resolve().parents[2]
CONTROL = ("HandoffCompletedRequest", "HandoffFailedRequest")
AUDITS = {"HandoffCompletedRequest": "CompleteHandoff", "HandoffFailedRequest": "FailHandoff"}


@dataclass
class Parked:
    endpoint: str
    event_id: str
    park_id: str

    def body(self, kind: str = "complete", **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "endpointId": self.endpoint,
            "coordinates": {"eventId": self.event_id, "messageId": self.park_id},
        }
        if kind == "fail":
            body["errorText"] = "rejected by the ERP"
        else:
            body["result"] = {"ok": True}
        body.update(extra)
        return body


def park(functions: dict[str, Any], endpoint: str, *, expected_by: str | None = None) -> Parked:
    resolver = functions["resolver"].get_user_function()
    event_id = str(uuid.uuid4())
    req = Msg("EventRequest", f"req-{uuid.uuid4().hex[:8]}")
    handoff = Msg("PendingHandoffResponse", f"park-{uuid.uuid4().hex[:8]}", req.message_id)
    for msg in (req, handoff):
        sb = service_bus_message(msg, endpoint=endpoint, event_id=event_id)
        if expected_by and msg.kind == "PendingHandoffResponse":
            sb.application_properties["ExpectedBy"] = expected_by
        resolver(sb)
    return Parked(endpoint, event_id, handoff.message_id)


def event(call: Caller, p: Parked) -> dict[str, Any]:
    result = call("event_get", method="GET", route_params={"endpointId": p.endpoint, "eventId": p.event_id})
    assert result.status == 200, result.body
    data: dict[str, Any] = result.json
    return data


def settle(call: Caller, p: Parked, kind: str = "complete", **extra: Any) -> HttpResult:
    return call("handoff_complete" if kind == "complete" else "handoff_fail", p.body(kind, **extra))


@pytest.fixture
def broker(faulty_tables: Any) -> Iterator[Broker]:
    # The broker judges duplicates by settlement's clock, which tests move forward for the reconciler.
    yield Broker(clock=lambda: service.settlement_service().clock())


def install(broker: Broker, **kw: Any) -> BrokerTransport:
    transport = BrokerTransport(broker, **kw)
    service.use_transport(transport)
    return transport


def reconcile_until_quiet(broker: Broker, minutes: tuple[float, ...] = (3, 5, 7, 9.5, 40)) -> None:
    """Let time pass as the timer would: the reconciler at each minute mark, the broker forwarding."""
    settlement = service.settlement_service()
    try:
        for minute in minutes:
            broker.pump()
            settlement.clock = lambda m=minute: utcnow() + timedelta(minutes=m)  # type: ignore[misc]
            report = service.reconciler().run()
            TALLY.add(AREA, operations=1)
            TALLY.check(AREA, not report.errors, f"reconciler errors: {report.errors}")
        broker.pump()
    finally:
        settlement.clock = utcnow


def unconfirmed_ids(call: Caller, endpoint: str) -> set[str]:
    result = call("handoff_unconfirmed", method="GET", route_params={"endpointId": endpoint})
    assert result.status == 200, result.body
    return {item["eventId"] for item in result.json["items"]}


def check_exactly_once(
    call: Caller,
    broker: Broker,
    p: Parked,
    answers: list[HttpResult],
    where: str,
    *,
    residual_ok: bool = False,
) -> str:
    """The counting rule of the issue, for one hand-off. Returns "settled", "open" or "residual"."""
    copies = broker.for_event(p.event_id)
    row = event(call, p)
    audits = [a for a in row["audits"] if a["auditType"] in AUDITS.values()]
    history = [h["messageId"] for h in row["history"] if h["messageType"] in CONTROL]
    accepted = [a for a in answers if a.status == 202]
    ids = {a.json["controlMessageId"] for a in accepted}
    TALLY.check(AREA, len(copies) <= 1, f"{where}: {len(copies)} control messages reached the endpoint")
    TALLY.check(AREA, len(ids) <= 1, f"{where}: 202s name different messages {ids}")
    for a in answers:
        TALLY.check(
            AREA,
            a.status in (202, 409, 503)
            and (a.status == 202 or a.content_type.startswith("application/problem+json")),
            f"{where}: answered {a.status} {a.body[:300]!r}",
        )
    if copies:
        [copy] = copies
        TALLY.check(AREA, ids <= {copy.message_id}, f"{where}: 202 for {ids}, but {copy.message_id} was sent")
        TALLY.check(
            AREA,
            [a["auditType"] for a in audits] == [AUDITS[copy.message_type]],
            f"{where}: audits {[a['auditType'] for a in audits]} for one {copy.message_type}",
        )
        TALLY.check(AREA, history == [copy.message_id], f"{where}: control history {history}")
        TALLY.check(
            AREA,
            (row["resolutionStatus"], row["pendingSubStatus"], row["messageType"])
            == ("Pending", None, copy.message_type),
            f"{where}: row {row['resolutionStatus']}/{row['pendingSubStatus']}/{row['messageType']}",
        )
        return "settled"
    parked = (row["resolutionStatus"], row["pendingSubStatus"]) == ("Pending", "Handoff")
    if audits:
        # An audit without a message: only the documented residual (no duplicate detection, the send's
        # outcome unknown), and then it is listed for operators.
        listed = p.event_id in unconfirmed_ids(call, p.endpoint)
        TALLY.check(
            AREA, residual_ok and listed, f"{where}: {len(audits)} audits, no message, listed {listed}"
        )
        TALLY.check(AREA, len(audits) == 1 and parked, f"{where}: residual with {len(audits)} audits")
        return "residual"
    TALLY.check(AREA, not accepted, f"{where}: 202 {ids} but nothing reached the endpoint and no audit")
    TALLY.check(AREA, parked and history == [], f"{where}: nothing sent, row {row['resolutionStatus']}")
    return "open"


BEHAVIOURS = ("ok", "refuse", "deliver-then-raise", "lost-before")


def chooser(seed: int, weights: tuple[int, ...]) -> Callable[[], str]:
    rng = random.Random(seed)
    lock = threading.Lock()

    def choose() -> str:
        with lock:
            return rng.choices(BEHAVIOURS, weights)[0]

    return choose


def race(call: Caller, p: Parked, threads: int, tries: int) -> list[HttpResult]:
    """``threads`` different callers settle ``p`` at the same instant, each retrying a 503 ``tries`` times."""
    barrier = threading.Barrier(threads)
    answers: list[HttpResult] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        barrier.wait()
        for _ in range(tries):
            result = settle(call, p, "complete" if i % 2 else "fail", settledBy=f"agent-{i}")
            with lock:
                answers.append(result)
            if result.status != 503:
                break
        FAULTS.disarm()

    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    TALLY.add(AREA, operations=len(answers), races=1)
    return answers


class ReleaseFails(BrokerTransport):
    """Like its base, and a refused send's claim release fails too (its next storage request)."""

    def send(self, topic: str, message: Any) -> None:
        try:
            super().send(topic, message)
        except Exception as exc:
            if type(exc).__name__ == "SendRefused":
                FAULTS.arm(1, "before")
            raise


@pytest.mark.parametrize(
    ("duplicate_detection", "release_fails"),
    [(True, False), (True, True), (False, False)],
    ids=["duplicate-detection", "release-fails-too", "no-duplicate-detection"],
)
def test_racing_settlements_through_every_send_failure_settle_each_handoff_exactly_once(
    broker, functions, call, duplicate_detection, release_fails
):
    # Given parked hand-offs and a transport whose sends succeed, are refused, deliver then raise, or
    # fail without telling, at random
    if not duplicate_detection:
        broker.window = None
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    handoffs = [park(functions, endpoint) for _ in range(sized(16, 4))]
    kind = ReleaseFails if release_fails else BrokerTransport
    transport = kind(broker, chooser=chooser(7, (4, 2, 2, 2)))
    service.use_transport(transport)
    # When eight different callers race to settle each one (complete or fail), retrying 503s
    answers = {p.event_id: race(call, p, threads=8, tries=3) for p in handoffs}
    TALLY.add(AREA, faults=sum(1 for a in transport.attempts if a != "ok"))
    # And time passes: the timer's reconciler runs, the broker forwards to the resolver
    transport.chooser = None
    reconcile_until_quiet(broker)
    # Then each hand-off was settled exactly once, or (never sent) is still open and settles now
    outcomes = []
    for p in handoffs:
        where = f"hand-off {p.event_id}"
        outcome = check_exactly_once(
            call, broker, p, answers[p.event_id], where, residual_ok=not duplicate_detection
        )
        if outcome == "open":
            TALLY.check(AREA, settle(call, p).status == 202, f"{where}: could not be settled afterwards")
            broker.pump()
            outcome = check_exactly_once(call, broker, p, [], f"{where} (settled afterwards)")
        outcomes.append(outcome)
    if duplicate_detection:
        TALLY.check(AREA, "residual" not in outcomes, f"residuals with duplicate detection on: {outcomes}")
    TALLY.add(AREA, operations=len(handoffs))


def test_a_storage_fault_at_any_request_of_a_settlement_still_settles_exactly_once(broker, functions, call):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    install(broker)
    # Given how many storage requests a clean settlement makes
    p = park(functions, endpoint)
    with FAULTS.plan() as plan:
        assert settle(call, p).status == 202
    requests = len(plan.requests)
    TALLY.check(AREA, requests == 3, f"a clean settlement made {plan.requests}")
    for index in range(1, requests + 2):  # +1: the read-back after an unknown claim outcome
        for when in ("before", "after"):
            where = f"settlement, request #{index} fails {when}"
            p = park(functions, endpoint)
            # When request N fails and the caller retries its 503s
            answers = []
            with FAULTS.plan(index, when) as plan:
                for _ in range(3):
                    answers.append(settle(call, p))
                    if answers[-1].status != 503:
                        break
            TALLY.add(AREA, operations=len(answers), faults=len(plan.injected))
            reconcile_until_quiet(broker)
            # Then exactly one message, one audit, the row settled
            outcome = check_exactly_once(call, broker, p, answers, where)
            TALLY.check(AREA, outcome == "settled", f"{where}: {outcome} after {[a.status for a in answers]}")


def test_the_reconciler_under_random_storage_faults_still_closes_every_claim(broker, functions, call):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    transport = install(broker)
    handoffs = [park(functions, endpoint) for _ in range(sized(10, 3))]
    answers = {}
    for p in handoffs:
        transport.then(["lost-before"])  # every send's outcome unknown: all left to the reconciler
        answers[p.event_id] = [settle(call, p)]
    settlement = service.settlement_service()
    faults = 0
    try:
        for round_, minute in enumerate((3, 3.5, 4, 4.5, 5, 6, 7, 8)):
            settlement.clock = lambda m=minute: utcnow() + timedelta(minutes=m)  # type: ignore[misc]
            when = random.Random(round_).choice(WHENS)
            with FAULTS.plan(rate=0.3, when=when, seed=round_) as plan:
                try:
                    service.reconciler().run()
                except Exception as exc:  # the endpoint list was unreadable: this tick fails, the next runs
                    TALLY.check(AREA, "injected fault" in repr(exc), f"reconciler raised {exc!r}")
            faults += len(plan.injected)
            broker.pump()
    finally:
        settlement.clock = utcnow
    TALLY.add(AREA, operations=8, faults=faults)
    reconcile_until_quiet(broker, minutes=(8.5,))
    for p in handoffs:
        outcome = check_exactly_once(call, broker, p, answers[p.event_id], f"hand-off {p.event_id}")
        TALLY.check(AREA, outcome == "settled", f"{p.event_id}: {outcome}")


def test_a_different_settlement_after_a_sent_one_is_refused_however_late(broker, functions, call):
    install(broker, script=["deliver-then-raise"])
    p = park(functions, "Billing-" + uuid.uuid4().hex[:8])
    first = settle(call, p, settledBy="erp-checker")
    answers = [first]
    settlement = service.settlement_service()
    try:
        for minutes in (6, 11, 60, 24 * 60):
            settlement.clock = lambda m=minutes: utcnow() + timedelta(minutes=m)  # type: ignore[misc]
            late = settle(call, p, "fail", settledBy="operator")
            TALLY.check(
                AREA,
                late.status == 409 and late.json["type"] == "urn:settle:problem:settlement-in-flight",
                f"a takeover {minutes} min later answered {late.status} {late.body!r}",
            )
            answers.append(late)
    finally:
        settlement.clock = utcnow
    TALLY.add(AREA, operations=len(answers), faults=1)
    reconcile_until_quiet(broker)
    TALLY.check(AREA, check_exactly_once(call, broker, p, answers, "takeover") == "settled", "not settled")
    TALLY.check(AREA, [c.message_type for c in broker.delivered] == ["HandoffCompletedRequest"], "kinds")


def test_a_large_result_resent_by_the_reconciler_is_byte_identical(broker, functions, call):
    install(broker, script=["deliver-then-raise"])
    p = park(functions, "Billing-" + uuid.uuid4().hex[:8])
    result = {"lines": ["é" * 50_000, '"\\' * 10_000, "\u0001" * 1_000]}
    first = settle(call, p, result=result)
    TALLY.check(AREA, first.status == 202, f"large result: {first.status} {first.body[:300]!r}")
    settlement = service.settlement_service()
    settlement.clock = lambda: utcnow() + timedelta(minutes=3)  # the resolver has not projected it yet
    try:
        service.reconciler().run()
    finally:
        settlement.clock = utcnow
    reconcile_until_quiet(broker)
    [kept] = broker.for_event(p.event_id)
    TALLY.check(AREA, len(broker.dropped) == 1, f"{len(broker.dropped)} copies re-sent")
    [again] = broker.dropped
    TALLY.check(AREA, (again.body, again.properties) == (kept.body, kept.properties), "the re-send differs")
    body = json.loads(kept.body)
    TALLY.check(
        AREA, json.loads(body["EventContent"]["EventJson"]) == result, "the result changed on the way"
    )
    TALLY.add(AREA, operations=2, faults=1)
    check_exactly_once(call, broker, p, [first], "large result")


# --- the sweeper racing agents -------------------------------------------------------------------


def test_the_sweeper_racing_agents_settles_each_overdue_handoff_once(broker, functions, call):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    overdue = (utcnow() - timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    handoffs = [park(functions, endpoint, expected_by=overdue) for _ in range(sized(20, 5))]
    transport = install(broker, chooser=chooser(11, (6, 1, 2, 1)))
    answers: dict[str, list[HttpResult]] = {p.event_id: [] for p in handoffs}
    lock = threading.Lock()
    barrier = threading.Barrier(5)

    def agent(i: int) -> None:
        barrier.wait()
        for p in handoffs[i::2] if i < 2 else handoffs:
            result = settle(call, p, settledBy=f"agent-{i}")
            with lock:
                answers[p.event_id].append(result)

    def sweeper() -> None:
        barrier.wait()
        Sweeper(service.settlement_service()).sweep()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=sweeper) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    TALLY.add(AREA, races=1, operations=sum(len(a) for a in answers.values()) + 2)
    TALLY.add(AREA, faults=sum(1 for a in transport.attempts if a != "ok"))
    transport.chooser = None
    # The next sweeper run and the reconciler finish whatever the race left (one sweeper period later)
    Sweeper(service.settlement_service()).sweep()
    reconcile_until_quiet(broker)
    for p in handoffs:
        where = f"hand-off {p.event_id}"
        agents = [a for a in answers[p.event_id] if a.status == 202]
        TALLY.check(
            AREA, check_exactly_once(call, broker, p, agents, where) == "settled", f"{where}: not settled"
        )
        [copy] = broker.for_event(p.event_id)
        auditor = [a["auditorName"] for a in event(call, p)["audits"] if a["auditType"] in AUDITS.values()]
        if copy.message_type == "HandoffFailedRequest":
            TALLY.check(AREA, auditor == ["Sweeper"], f"{where}: a timeout audited by {auditor}")
            TALLY.check(AREA, not agents, f"{where}: an agent got 202 but the sweeper's failure was sent")
        else:
            TALLY.check(AREA, auditor and auditor[0].startswith("agent-"), f"{where}: audited by {auditor}")


# --- several OS processes, and processes killed between any two steps ------------------------------


def run_children(
    args_list: list[dict[str, Any]], timeout: float = 120
) -> list[subprocess.CompletedProcess[str]]:
    return children.finish(children.start(children.SETTLE_CHILD, args_list), timeout)


def answers_of(done: subprocess.CompletedProcess[str]) -> list[HttpResult]:
    out = []
    for line in done.stdout.splitlines():
        data = json.loads(line)
        body = json.dumps(data["json"]).encode() if data["json"] is not None else b""
        ctype = "application/json" if data["status"] == 202 else "application/problem+json"
        out.append(HttpResult(data["status"], {"content-type": ctype}, body))
    return out


def load_topic(broker: Broker, path: Path) -> int:
    lines = read_topic_file(path)
    for line in lines:
        broker.receive(line["topic"], line["message"], at=line["at"])
    return len(lines)


def test_settlers_on_several_processes_send_one_message_per_handoff(broker, functions, call, tmp_path):
    endpoint = "Billing-" + uuid.uuid4().hex[:8]
    handoffs = [park(functions, endpoint) for _ in range(sized(12, 4))]
    topic = tmp_path / "topic.jsonl"
    start_at = time.time() + 4.0  # after every child has imported the app
    children = []
    for i in range(4):
        requests = [
            {
                "function": "handoff_complete" if i % 2 else "handoff_fail",
                "body": p.body("complete" if i % 2 else "fail", settledBy=f"process-{i}"),
            }
            for p in handoffs
        ]
        children.append(
            {"topic_file": str(topic), "window_s": 600, "requests": requests, "start_at": start_at}
        )
    done = run_children(children)
    for d in done:
        TALLY.check(AREA, d.returncode == 0, f"child failed: {d.stderr[-2000:]}")
    answers: dict[str, list[HttpResult]] = {p.event_id: [] for p in handoffs}
    for d in done:
        for p, a in zip(handoffs, answers_of(d), strict=True):
            answers[p.event_id].append(a)
    TALLY.add(AREA, races=len(handoffs), operations=4 * len(handoffs))
    TALLY.check(AREA, load_topic(broker, topic) == len(handoffs), "more messages than hand-offs in the topic")
    broker.pump()
    for p in handoffs:
        where = f"hand-off {p.event_id}"
        TALLY.check(
            AREA, [a.status for a in answers[p.event_id]].count(202) == 1, f"{where}: {answers[p.event_id]}"
        )
        TALLY.check(AREA, check_exactly_once(call, broker, p, answers[p.event_id], where) == "settled", where)


KILL_POINTS = ("claim-applied", "before-send", "after-send")


@pytest.mark.parametrize("duplicate_detection", [True, False], ids=["duplicate-detection", "none"])
@pytest.mark.parametrize("kill", KILL_POINTS)
def test_a_settling_process_killed_between_two_steps_is_finished_by_the_reconciler(
    broker, functions, call, tmp_path, kill, duplicate_detection
):
    # Given a parked hand-off, and a settling process that is killed at that point
    if not duplicate_detection:
        broker.window = None
    install(broker)
    p = park(functions, "Billing-" + uuid.uuid4().hex[:8])
    topic = tmp_path / "topic.jsonl"
    args = {
        "topic_file": str(topic),
        "kill": kill,
        "window_s": 600 if duplicate_detection else None,
        "requests": [{"function": "handoff_complete", "body": p.body(settledBy="checker")}],
    }
    [done] = run_children([args])
    TALLY.check(
        AREA, done.returncode == -9, f"{kill}: the child exited {done.returncode}: {done.stderr[-1000:]}"
    )
    TALLY.add(AREA, operations=1, faults=1)
    load_topic(broker, topic)  # what reached the endpoint topic before the process died
    # When the timer's reconciler runs (nobody else does anything)
    reconcile_until_quiet(broker)
    # Then exactly once; only without duplicate detection may a send whose outcome is unknown remain
    # (here never sent: killed before it), and it is shown as unconfirmed
    outcome = check_exactly_once(call, broker, p, [], f"killed {kill}", residual_ok=not duplicate_detection)
    expected = "settled" if duplicate_detection or kill == "after-send" else "residual"
    TALLY.check(AREA, outcome == expected, f"killed {kill}: {outcome}, expected {expected}")
    # And the caller, who never got an answer, retries: the same settlement, nothing more is sent
    retry = settle(call, p, settledBy="checker")
    claim = service.store().get_claim(p.endpoint, p.event_id, p.park_id)
    TALLY.check(
        AREA,
        retry.status == 202
        and retry.json["replayed"]
        and claim is not None
        and retry.json["controlMessageId"] == claim.control_message_id,
        f"killed {kill}: retry {retry.status} {retry.body!r}",
    )
    TALLY.add(AREA, operations=1)
    broker.pump()
    check_exactly_once(
        call, broker, p, [retry], f"killed {kill}, retried", residual_ok=not duplicate_detection
    )
