"""No acknowledged write is lost when the development host is SIGKILLed at random moments under real
HTTP traffic.

The host runs as a subprocess (``python -m devtools.host``, the loopback transport, catch-up and the
sweeper on fast schedules, so kills land inside timers too). Threads drive it over HTTP: state workers
lock keys (with a ``requestId``) and then set, release or abandon them; a hand-off worker parks events
through the admin endpoint (as a Service Bus delivery) and settles most of them, leaving the rest to the
sweeper. At a random moment the host is killed with ``SIGKILL`` and started again, many times.

Afterwards, with the host gone, catch-up, the reconciler and the sweeper run as their timers would (time
moved forward), and the checks are the issue's: no lock left Processing past its expiry, head and
history agree for every record, no hand-off got two control messages, every control message has exactly
one audit in its event's view (rendered from its claim, ADR-0022 change 3), every 202 names the message
that was sent, and nothing is still parked past ExpectedBy.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.clock import iso, utcnow
from handoff import service
from handoff.messages.transport import LoopbackTransport
from tests.conftest import Caller, _use_tables, new_prefix
from tests.reliability.tally import TALLY, sized
from tests.reliability.test_state_adversary import catch_up_until_quiet, check_every_lock_concluded
from tests.support.children import HostProcess, start_devhost
from tests.support.devhost import host_environment

pytestmark = pytest.mark.slow

AREA = "crash"
ROOT = Path(__file__).resolve().parents[2]
CONTROL = {"HandoffCompletedRequest": "CompleteHandoff", "HandoffFailedRequest": "FailHandoff"}
# Settings a developer's shell may carry that would point the host elsewhere.


@dataclass
class Traffic:
    """What the drivers asked for and what they were told (the test process is never killed)."""

    lock = threading.Lock()
    keys: list[dict[str, Any]] = field(default_factory=list)
    parked: dict[str, tuple[str, str]] = field(default_factory=dict)  # event id -> (endpoint, park id)
    answers: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)  # event -> (status, id)
    requests: int = 0
    lost: int = 0  # requests whose answer the kill took

    def count(self, *, lost: bool = False) -> None:
        with self.lock:
            self.requests += 1
            self.lost += lost


class Host:
    """The development host of this test, started again after each kill (tests/support/children.py)."""

    def __init__(self, connection: str, prefix: str, folder: Path) -> None:
        self.connection, self.prefix, self.folder = connection, prefix, folder
        self.running: HostProcess | None = None
        self.url = ""
        self.starts = 0

    def start(self) -> None:
        environ = host_environment(
            self.connection,
            self.prefix,
            STATE_CATCHUP_SCHEDULE="*/2 * * * * *",
            HANDOFF_SWEEPER_ENABLED="true",
            HANDOFF_SWEEPER_SCHEDULE="*/3 * * * * *",
        )
        self.starts += 1
        self.running = start_devhost(
            self.folder,
            environ,
            log_name=f"host-{self.starts}.log",
            ready_path="/api/v1/health",
            ready_status=200,
        )
        self.url = self.running.base_url

    def kill(self) -> int | None:
        assert self.running is not None
        return self.running.kill()

    def log_tail(self) -> str:
        return (self.folder / f"host-{self.starts}.log").read_text(errors="replace")[-3000:]


def state_worker(url: str, traffic: Traffic, stop: threading.Event, rng: random.Random) -> None:
    with httpx.Client(base_url=url, timeout=10.0) as http:
        while not stop.is_set():
            key = {
                "tenantId": 7,
                "scopeId": 4,
                "entityId": rng.randrange(4),
                "itemEntityKey": "crash",
                "itemKey": uuid.uuid4().hex[:12],
            }
            with traffic.lock:
                traffic.keys.append(key)  # before the call: a lock whose answer is lost still counts
            try:
                answer = http.post(
                    "/api/v1/state/lock",
                    json={"key": key, "lockSeconds": rng.choice((1, 2)), "requestId": uuid.uuid4().hex},
                )
                traffic.count()
                TALLY.check(AREA, answer.status_code < 500, f"lock answered {answer.status_code}")
                body = answer.json()
                if not body.get("acquired"):
                    continue
                token = body["lockToken"]
                choice = rng.random()
                if choice < 0.5:
                    step = http.post(
                        "/api/v1/state/set",
                        json={"key": key, "status": "Processed", "data": {"n": 1}, "lockToken": token},
                    )
                elif choice < 0.7:
                    step = http.post(
                        "/api/v1/state/release", json={"key": key, "error": "crash", "lockToken": token}
                    )
                elif choice < 0.8:
                    step = http.post("/api/v1/state/lock/extend", json={"key": key, "lockToken": token})
                else:
                    continue  # abandoned: catch-up must fail it
                traffic.count()
                TALLY.check(AREA, step.status_code < 500, f"{step.url.path} answered {step.status_code}")
            except httpx.TransportError:
                traffic.count(lost=True)
                return  # the host is gone


def nimbus_delivery(kind: str, message_id: str, parent: str, event_id: str, endpoint: str) -> dict[str, Any]:
    """A Resolver-subscription copy as the admin endpoint takes it (the Functions host's JSON shape)."""
    props: dict[str, Any] = {
        "MessageType": kind,
        "EventId": event_id,
        "To": endpoint if kind == "EventRequest" else "Resolver",
        "From": "Storefront" if kind == "EventRequest" else endpoint,
        "ParentMessageId": parent,
        "OriginatingMessageId": "self",
        "EventTypeId": "Billing.InvoiceCreated",
    }
    if kind == "PendingHandoffResponse":
        expected = datetime.now(UTC) + timedelta(seconds=2)
        props.update(HandoffReason="Awaiting import", ExternalJobId=f"job-{message_id}")
        props["ExpectedBy"] = iso(expected)
    return {
        "body": {"EventContent": {"EventTypeId": "Billing.InvoiceCreated", "EventJson": '{"invoice": 1}'}},
        "messageId": message_id,
        "sessionId": event_id,
        "correlationId": event_id,
        "applicationProperties": props,
    }


def handoff_worker(url: str, traffic: Traffic, stop: threading.Event, rng: random.Random) -> None:
    endpoint = "Billing"
    with httpx.Client(base_url=url, timeout=10.0) as http:
        while not stop.is_set():
            event_id, request_id, park_id = str(uuid.uuid4()), uuid.uuid4().hex, uuid.uuid4().hex
            with traffic.lock:
                traffic.parked[event_id] = (endpoint, park_id)
            try:
                for kind, message, parent in (
                    ("EventRequest", request_id, "self"),
                    ("PendingHandoffResponse", park_id, request_id),
                ):
                    delivered = http.post(
                        "/admin/functions/resolver",
                        json=nimbus_delivery(kind, message, parent, event_id, endpoint),
                    )
                    traffic.count()
                    TALLY.check(AREA, delivered.status_code == 202, f"resolver {delivered.status_code}")
                if rng.random() < 0.25:
                    continue  # nobody settles it: the sweeper must fail it once ExpectedBy passed
                kind = rng.choice(("complete", "fail"))
                body: dict[str, Any] = {
                    "endpointId": endpoint,
                    "coordinates": {"eventId": event_id, "messageId": park_id},
                    "settledBy": "crash-agent",
                }
                body.update({"result": {"ok": True}} if kind == "complete" else {"errorText": "rejected"})
                for _ in range(2):  # an agent retries a 503 once
                    answer = http.post(f"/api/v1/handoffs/{kind}", json=body)
                    traffic.count()
                    TALLY.check(AREA, answer.status_code < 500 or answer.status_code == 503, "settlement 5xx")
                    control = answer.json().get("controlMessageId") if answer.status_code == 202 else None
                    with traffic.lock:
                        traffic.answers.setdefault(event_id, []).append((answer.status_code, control))
                    if answer.status_code != 503:
                        break
            except httpx.TransportError:
                traffic.count(lost=True)
                return


@pytest.fixture
def crash_tables(azurite_connection: str, settle_tables: str) -> Iterator[str]:
    prefix = new_prefix()
    _use_tables(azurite_connection, prefix)
    service.reset()
    yield prefix
    service.reset()
    _use_tables(azurite_connection, settle_tables)


def test_the_development_host_killed_at_random_moments_loses_and_doubles_nothing(
    azurite_connection: str, crash_tables: str, call: Caller, tmp_path: Path
) -> None:
    # Given the development host under state and hand-off traffic, SIGKILLed at random moments
    host = Host(azurite_connection, crash_tables, tmp_path)
    traffic = Traffic()
    rng = random.Random(20261201)
    kills = sized(24, 6)
    for n in range(kills):
        host.start()
        stop = threading.Event()
        workers = [
            threading.Thread(target=state_worker, args=(host.url, traffic, stop, random.Random(rng.random())))
            for _ in range(2)
        ] + [threading.Thread(target=handoff_worker, args=(host.url, traffic, stop, random.Random(n)))]
        before = traffic.requests
        for w in workers:
            w.start()
        deadline = time.monotonic() + 60
        while traffic.requests < before + 8 and time.monotonic() < deadline:  # it is working
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))
        returncode = host.kill()
        stop.set()
        for w in workers:
            w.join(60)
        TALLY.check(AREA, returncode == -signal.SIGKILL, f"kill {n}: the host ended {returncode}")
        TALLY.add(AREA, faults=1)
    TALLY.add(AREA, operations=traffic.requests)
    TALLY.check(
        AREA,
        len(traffic.keys) >= kills * 3 and len(traffic.parked) >= kills and traffic.lost >= kills // 2,
        f"too little traffic: {len(traffic.keys)} keys, {len(traffic.parked)} hand-offs, {traffic.lost} lost",
    )

    # When, with the host gone, catch-up, the reconciler and the sweeper run as their timers would
    service.use_transport(LoopbackTransport(lambda msg: service.resolver_service().handle(msg)))
    time.sleep(2.5)  # every lock (1-2 s, or extended by 30 min) of the last run has expired or is live
    catch_up_until_quiet(utcnow() + timedelta(hours=1))
    settlement = service.settlement_service()
    try:
        for minutes in (6, 12, 40):
            settlement.clock = lambda m=minutes: utcnow() + timedelta(minutes=m)  # type: ignore[misc]
            report = service.reconciler().run()
            TALLY.check(AREA, not report.errors, f"reconciler errors: {report.errors}")
            swept = service.sweeper().sweep()
            TALLY.check(AREA, not swept.errors, f"sweeper errors: {swept.errors}")
            TALLY.add(AREA, operations=2)
    finally:
        settlement.clock = utcnow

    # Then no lock is left Processing and every record's versions agree with its head
    seen = check_every_lock_concluded(call, traffic.keys, "after the host's kills", area=AREA)
    TALLY.check(AREA, seen["expired"] > 0, f"no abandoned lock was caught up: {seen}")
    # and every hand-off got at most one control message, with exactly one audit, named by every 202
    outcomes = {"settled": 0, "never parked": 0}
    for event_id, (endpoint, park_id) in traffic.parked.items():
        where = f"event {event_id}"
        found = call("event_get", method="GET", route_params={"endpointId": endpoint, "eventId": event_id})
        accepted = {c for status, c in traffic.answers.get(event_id, []) if status == 202}
        if found.status == 404:
            outcomes["never parked"] += 1
            TALLY.check(AREA, not accepted, f"{where}: 202 for an event that does not exist")
            continue
        row = found.json
        sent = [h["messageId"] for h in row["history"] if h["messageType"] in CONTROL]
        audits = [a["auditType"] for a in row["audits"] if a["auditType"] in CONTROL.values()]
        parked_seen = any(h["messageId"] == park_id for h in row["history"])
        TALLY.check(AREA, len(sent) <= 1, f"{where}: {len(sent)} control messages {sent}")
        TALLY.check(AREA, len(audits) == len(sent), f"{where}: audits {audits} for messages {sent}")
        TALLY.check(AREA, accepted <= set(sent), f"{where}: 202 named {accepted}, sent {sent}")
        if parked_seen:
            TALLY.check(
                AREA,
                (row["resolutionStatus"], row["pendingSubStatus"]) != ("Pending", "Handoff"),
                f"{where}: parked past ExpectedBy: {row['resolutionStatus']}/{row['pendingSubStatus']}",
            )
            outcomes["settled"] += bool(sent)
    TALLY.check(AREA, outcomes["settled"] > 0, f"no hand-off was settled: {outcomes}")
    print(
        f"\ncrash test: {host.starts} host starts, {kills} kills, {traffic.requests} requests "
        f"({traffic.lost} answers lost to a kill), {len(traffic.keys)} keys, {seen}, "
        f"{len(traffic.parked)} hand-offs, {outcomes}"
    )
