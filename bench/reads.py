"""Operator reads at one busy endpoint: requests, entities read and bytes at the wire (issue 46).

Every operator read must keep a bound that is measured, not assumed: the overview (``GET v1/endpoints``),
an endpoint's events page by page (all, and each status), overdue hand-offs (a page and their count), the
unconfirmed settlements, find by each kind of id, failed across endpoints, one event, and an agent's
``next``. Each is called through the app's own HTTP function (``bench.harness.App``), alone between two
quiet waits, and counted by the counting proxy (``bench.proxy``): every Table request reaching Azurite,
the entities its answers held and the bytes both ways.

**The seed** (not measured): ONE endpoint, one partition (``SETTLE_HANDOFF_SHARDS=1``), :data:`FULL_EVENTS`
events (:data:`SMOKE_EVENTS` in a smoke run; ``SETTLE_BENCH_READS_EVENTS`` overrides) in the mix of
:data:`MIX`: mostly Completed (half of them through a hand-off), parked hand-offs (a share overdue),
Failed, DeadLettered, Deferred, Skipped. Each event's NimBus messages are typed by the production parser
(``parse_message``) and decided and planned by the production rules (``project``, ``plan_projection``) in
order, each over the row the previous decision wrote, and the operations are applied to a local copy of the
event's rows; its final rows are then inserted in 100-row transactions (sent while the next events are
built). So the seed follows the layout whatever it becomes. The count deltas the projections wrote are
summed into one delta row (the rules' own ``delta_entity``) and folded as the sweeper's timer does
(``Overview.fold_all``). The lookup index (``hoids``) gets the rows the resolver writes (``ids.refs_of``):
every event id (their partitions are shared: in transactions), and the session, message and job ids of
every :data:`EXACT_ID_SAMPLE`-th event (each has a partition of its own). A second endpoint with no event
is listed too (the overview and failed-across-endpoints walk every endpoint). The seed is checked before
anything is measured: the endpoint's counts must be the mix. No settlement is unconfirmed (usually none
is): that listing is measured empty.

**The bounds** (:data:`READS`): each read's documented request count as a formula of what the seed holds
(``Seeded``), so a read that starts scanning the partition misses its figure here and fails
``tests/bench/test_reads.py``.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

from bench.harness import Environment, Figure, HttpAnswer, log, missing, verdict_at_most
from bench.proxy import CountingProxy, Tally, tally

SECTION = "operator reads"
ENDPOINT = "Ledger"
OTHER_ENDPOINT = "Warehouse"  # a second endpoint with no event: the overview and failed list it too
FULL_EVENTS = 10_000  # make bench stays within 10 minutes; 100,000: SETTLE_BENCH_READS_EVENTS=100000
SMOKE_EVENTS = 1_500
EVENTS_SETTING = "SETTLE_BENCH_READS_EVENTS"
STATUSES = ("Pending", "PendingHandoff", "Completed", "Failed", "DeadLettered", "Deferred", "Skipped")
PAGE = 50
SMOKE_PAGE = 20  # every status has a second page in a smoke run (2% of 1,500 is 30)
BATCH = 100  # operations of one entity-group transaction
LOAD_WORKERS = 6
IN_FLIGHT = 4 * LOAD_WORKERS  # transactions sent and not yet answered while the seed is built
EVENT_TYPE = "Ledger.InvoicePosted"
# Session, message and job ids (the lookup index's exact ids) are written for every 97th event only (97 is
# prime to the mix's period of 100: every kind is sampled): each id has a partition of its own (one row, one
# insert: 400,000 single requests at 100,000 events), and a find reads that id's partition alone, whatever
# the others hold. Event ids share partitions (their first three characters): every one is written, in
# transactions.
EXACT_ID_SAMPLE = 97

# Events per 100, by what happens to them.
MIX: dict[str, int] = {
    "completed": 39,  # request, resolution
    "completed via hand-off": 39,  # request, park, settlement, resolution
    "parked": 7,  # request, park (ExpectedBy tomorrow)
    "overdue": 3,  # request, park (ExpectedBy an hour after it, long past)
    "failed": 5,  # request, error
    "dead-lettered": 2,  # the request, dead-lettered by the broker
    "deferred": 3,  # request, deferral
    "skipped": 2,  # request, skip
}
assert sum(MIX.values()) == 100


# ------------------------------------------------------------------------------------------------ seed


@dataclass
class Seeded:
    """What the seed holds, and what loading it cost (the bounds are formulas of these)."""

    events: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    event_rows: int = 0  # rows written in the endpoint's partition
    id_rows: int = 0  # rows of the lookup index
    build_s: float = 0.0  # projecting every message (the events' rows sent meanwhile)
    load_s: float = 0.0  # the rows still in flight when the last event was built
    load_ids_s: float = 0.0
    fold_s: float = 0.0
    samples: dict[str, str] = field(default_factory=dict)  # ids to find

    @property
    def parked(self) -> int:
        return self.by_kind.get("parked", 0) + self.by_kind.get("overdue", 0)

    @property
    def overdue(self) -> int:
        return self.by_kind.get("overdue", 0)

    @property
    def failed(self) -> int:
        return self.by_kind.get("failed", 0) + self.by_kind.get("dead-lettered", 0)

    def expected_counts(self) -> dict[str, int]:
        """The endpoint's counts the mix must give (the overview's figures)."""
        k = self.by_kind.get
        return {
            "Pending": self.parked,
            "PendingHandoff": self.parked,
            "Deferred": k("deferred", 0),
            "Failed": k("failed", 0),
            "DeadLettered": k("dead-lettered", 0),
            "Unsupported": 0,
            "Completed": k("completed", 0) + k("completed via hand-off", 0),
            "Skipped": k("skipped", 0),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "by_kind": self.by_kind,
            "event_partition_rows": self.event_rows,
            "lookup_index_rows": self.id_rows,
            "build_and_send_s": round(self.build_s, 1),
            "load_rest_s": round(self.load_s, 1),
            "load_lookup_index_s": round(self.load_ids_s, 1),
            "fold_s": round(self.fold_s, 1),
        }


def _kinds(n: int) -> list[str]:
    """The kind of each of ``n`` events: the mix's pattern of 100, spread evenly."""
    pattern = [kind for kind, share in MIX.items() for _ in range(share)]
    # Interleave so every stretch of events holds every kind (listings by status see them throughout).
    order = sorted(range(100), key=lambda i: (i * 37) % 100)
    spread = [pattern[i] for i in order]
    return [spread[i % 100] for i in range(n)]


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.0000000Z")


def _message(
    kind: str,
    *,
    event_id: str,
    message_id: str,
    session_id: str,
    enqueued: datetime,
    parent: str = "self",
    extra: dict[str, Any] | None = None,
    error: str | None = None,
) -> ServiceBusMessage:
    """A message as the Resolver subscription delivers it (NimBus's properties and body)."""
    is_request = kind.endswith("Request")
    props: dict[str, Any] = {
        "MessageType": kind,
        "EventId": event_id,
        "To": ENDPOINT if is_request else "Resolver",
        "From": ("Manager" if kind.startswith("Handoff") else "Storefront") if is_request else ENDPOINT,
        "OriginatingMessageId": "self",
        "ParentMessageId": parent,
        "RetryCount": 0,
        "OriginatingFrom": "self",
        "EventTypeId": EVENT_TYPE,
    }
    props.update(extra or {})
    body: dict[str, Any] = {
        "EventContent": {"EventTypeId": EVENT_TYPE, "EventJson": json.dumps({"invoice": event_id})},
        "ErrorContent": None,
    }
    if error is not None:
        body["ErrorContent"] = {
            "ErrorText": error,
            "ErrorType": "InvalidOperationException",
            "ExceptionStackTrace": None,
            "ExceptionSource": None,
        }
    return ServiceBusMessage(
        body=json.dumps(body).encode(),
        message_id=message_id,
        session_id=session_id,
        correlation_id=event_id,
        enqueued_time_utc=enqueued,
        delivery_count=1,
        application_properties=props,
        user_properties={},
    )


def event_messages(kind: str, n: int, tag: str, at: datetime, now: datetime) -> list[ServiceBusMessage]:
    """Event ``n``'s messages in the order the resolver receives them, the first enqueued at ``at``."""
    event_id = f"{tag}-{n:07d}"
    session = f"order-{tag}-{n}"
    request_id = f"req-{tag}-{n}"
    park_id = f"park-{tag}-{n}"
    step = timedelta(seconds=2)
    request = _message(
        "EventRequest", event_id=event_id, message_id=request_id, session_id=session, enqueued=at
    )
    if kind == "dead-lettered":
        return [
            _message(
                "EventRequest",
                event_id=event_id,
                message_id=request_id,
                session_id=session,
                enqueued=at,
                extra={
                    "DeadLetterReason": "MaxDeliveryCountExceeded",
                    "DeadLetterErrorDescription": "Message could not be consumed after 10 delivery attempts.",
                },
            )
        ]

    def response(message_type: str, offset: int, **kw: Any) -> ServiceBusMessage:
        return _message(
            message_type,
            event_id=event_id,
            message_id=kw.pop("message_id", f"{message_type[:4].lower()}-{tag}-{n}"),
            session_id=session,
            enqueued=at + offset * step,
            parent=kw.pop("parent", request_id),
            **kw,
        )

    def park(expected_by: datetime) -> ServiceBusMessage:
        extra = {
            "HandoffReason": "awaiting ERP import",
            "ExternalJobId": f"JOB-{tag}-{n}",
            "ExpectedBy": _stamp(expected_by),
        }
        return response("PendingHandoffResponse", 1, message_id=park_id, extra=extra)

    if kind == "completed":
        return [request, response("ResolutionResponse", 1)]
    if kind == "completed via hand-off":
        settle = f"settle-{tag}-{n}"
        return [
            request,
            park(at + timedelta(hours=1)),
            _message(
                "HandoffCompletedRequest",
                event_id=event_id,
                message_id=settle,
                session_id=session,
                enqueued=at + 2 * step,
                parent=park_id,
            ),
            response("ResolutionResponse", 3, parent=settle),
        ]
    if kind == "parked":
        return [request, park(now + timedelta(days=1))]
    if kind == "overdue":
        return [request, park(at + timedelta(hours=1))]
    if kind == "failed":
        return [request, response("ErrorResponse", 1, error="ERP rejected the invoice: period closed")]
    if kind == "deferred":
        return [request, response("DeferralResponse", 1)]
    if kind == "skipped":
        return [request, response("SkipResponse", 1, error="Duplicate invoice")]
    raise ValueError(kind)


def _apply(rows: dict[str, dict[str, Any]], ops: Iterable[tuple[Any, ...]]) -> None:
    """A transaction's operations on the local copy of the partition (as storage would apply them)."""
    from azure.data.tables import UpdateMode

    for op in ops:
        action, entity = op[0], op[1]
        key = str(entity["RowKey"])
        if action == "create":
            if key in rows:
                raise RuntimeError(f"the seed inserted {key} twice")
            rows[key] = dict(entity)
        elif action == "update":
            mode = op[2].get("mode") if len(op) > 2 else UpdateMode.MERGE
            if mode == UpdateMode.MERGE and key in rows:
                rows[key].update(entity)
            else:
                rows[key] = dict(entity)
        elif action == "upsert":
            rows[key] = (
                {**rows.get(key, {}), **entity}
                if op[2:] and op[2].get("mode") == UpdateMode.MERGE
                else dict(entity)
            )
        elif action == "delete":
            rows.pop(key, None)
        else:
            raise RuntimeError(f"the seed met an operation it cannot apply: {action}")


def _insert(table: Any, batch: list[dict[str, Any]]) -> None:
    """One transaction of inserts, sent again when the connection broke (a 100,000-event seed once met a
    reset connection); a conflict on a repeat means the first one was applied."""
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError
    from azure.data.tables import TableTransactionError

    for attempt in range(1, 4):
        try:
            table.submit_transaction([("create", e) for e in batch])
            return
        except (ServiceRequestError, ServiceResponseError):
            if attempt == 3:
                raise
            time.sleep(attempt)
        except TableTransactionError as exc:
            if attempt > 1 and exc.status_code == 409:
                return
            raise


def _insert_one(table: Any, entity: dict[str, Any]) -> None:
    """One insert, sent again when the connection broke (a conflict on a repeat: the first was applied)."""
    from azure.core.exceptions import ResourceExistsError, ServiceRequestError, ServiceResponseError

    for attempt in range(1, 4):
        try:
            table.create_entity(entity)
            return
        except (ServiceRequestError, ServiceResponseError):
            if attempt == 3:
                raise
            time.sleep(attempt)
        except ResourceExistsError:
            if attempt > 1:
                return
            raise


def _submit_all(table: Any, batches: list[list[dict[str, Any]]]) -> None:
    with ThreadPoolExecutor(max_workers=LOAD_WORKERS) as pool:
        # list(): a failed transaction raises here instead of being dropped.
        list(pool.map(partial(_insert, table), batches))


def _in_batches(
    entities: Iterable[dict[str, Any]],
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Transactions of up to 100 rows of one partition, and the rows alone in their partition."""
    by_pk: dict[str, list[dict[str, Any]]] = {}
    for entity in entities:
        by_pk.setdefault(str(entity["PartitionKey"]), []).append(entity)
    batches, single = [], []
    for group in by_pk.values():
        if len(group) == 1:
            single.append(group[0])
            continue
        batches += [group[i : i + BATCH] for i in range(0, len(group), BATCH)]
    return batches, single


def _raw_table(name: str) -> Any:
    """A plain SDK client of the app's table ``name`` (created by the app's store first): the seed's
    transactions skip the app's policies (its meter, retries and telemetry)."""
    from azure.data.tables import TableServiceClient

    from handoff import service

    full = service.store().table(name).table_name
    return TableServiceClient.from_connection_string(os.environ["SETTLE_TABLES"]).get_table_client(full)


def seed(events: int, *, tag: str | None = None) -> Seeded:
    """Project ``events`` events of :data:`ENDPOINT` by the production rules and load the rows (see the
    module docstring); the app must point at the tables to fill (``SETTLE_HANDOFF_SHARDS=1``). Each event's
    rows are final once its last message is projected: they are sent while the next events are built."""
    from handoff import service
    from handoff.messages.contract import parse_message
    from handoff.projection.rules import delta_entity, plan_projection, project
    from handoff.storage import counts, ids, keys
    from handoff.storage.records import EventRow

    tag = tag or "e" + uuid.uuid4().hex[:5]
    store = service.store()
    store.register_endpoint(ENDPOINT)
    store.register_endpoint(OTHER_ENDPOINT)
    events_table, ids_table = _raw_table(keys.EVENTS_TABLE), _raw_table(keys.IDS_TABLE)
    out = Seeded(events=events)
    started = time.perf_counter()
    real_now = datetime.now(UTC)
    # The events arrive over the last 30 days, the newest two hours ago (an overdue park's ExpectedBy, an
    # hour after its event, is past).
    last = real_now - timedelta(hours=2)
    spacing = timedelta(days=30) / max(events, 1)
    id_rows: dict[tuple[str, str], dict[str, Any]] = {}
    low, high = keys.COUNTS_RANGE
    total: dict[str, int] = {}
    pending: list[dict[str, Any]] = []
    sent: deque[Future[Any]] = deque()
    pk = ""
    pool = ThreadPoolExecutor(max_workers=LOAD_WORKERS)

    def send(batch: list[dict[str, Any]]) -> None:
        while len(sent) >= IN_FLIGHT:  # the building waits for storage (a failed transaction raises here)
            sent.popleft().result()
        sent.append(pool.submit(_insert, events_table, batch))
        out.event_rows += len(batch)

    try:
        for n, kind in enumerate(_kinds(events)):
            out.by_kind[kind] = out.by_kind.get(kind, 0) + 1
            at = last - spacing * (events - 1 - n)
            current: EventRow | None = None
            rows: dict[str, dict[str, Any]] = {}  # this event's rows (its listing and count rows too)
            for msg in event_messages(kind, n, tag, at, real_now):
                m = parse_message(msg, now=real_now)
                where = store.event_partition(ENDPOINT, m.event_id)
                if pk and where != pk:
                    raise RuntimeError("the seed's endpoint spans partitions (SETTLE_HANDOFF_SHARDS > 1)")
                pk = where
                clock = m.enqueued_time_utc + timedelta(milliseconds=500)
                decision = project(m, current, now=clock)
                if not decision.applied:
                    raise RuntimeError(f"the seed's {m.message_type.name} of a {kind} event was refused")
                _apply(rows, plan_projection(pk, m, current, decision, now=clock))
                current = EventRow.from_entity(rows[keys.event_row(m.event_id)])
                for ref in ids.refs_of(m):
                    if ref.kind != "eventId" and n % EXACT_ID_SAMPLE:
                        continue  # an exact id's partition holds that id alone: a sample is written
                    entity = ref.entity()
                    id_rows[(entity["PartitionKey"], entity["RowKey"])] = entity
            for key, entity in rows.items():
                if low <= key < high and key != keys.COUNTS_SNAPSHOT:
                    total = counts.add(total, counts.read_columns(entity))  # summed into one delta row
                else:
                    pending.append(entity)
            while len(pending) >= BATCH:
                send(pending[:BATCH])
                del pending[:BATCH]
            if n and not n % 10_000:
                log(
                    f"reads: {n:,} events built, {out.event_rows:,} rows sent or in flight "
                    f"({time.perf_counter() - started:.0f} s)"
                )
            if kind == "completed via hand-off" and kind not in out.samples and not n % EXACT_ID_SAMPLE:
                out.samples[kind] = f"{tag}-{n:07d}"
        # The count deltas the projections wrote, summed (what a fold would have added up).
        change = {bucket: v for bucket, v in total.items() if v}
        if change:
            pending.append(delta_entity(pk, real_now - timedelta(hours=1), change))
        for i in range(0, len(pending), BATCH):
            send(pending[i : i + BATCH])
        out.build_s = time.perf_counter() - started
        started = time.perf_counter()
        for future in sent:
            future.result()  # a failed transaction raises here instead of being dropped
    finally:
        pool.shutdown(cancel_futures=True)  # stopped early (SIGTERM, an error): what is queued is dropped
    out.load_s = time.perf_counter() - started

    started = time.perf_counter()
    out.id_rows = len(id_rows)
    batches, single = _in_batches(id_rows.values())
    _submit_all(ids_table, batches)
    with ThreadPoolExecutor(max_workers=LOAD_WORKERS * 2) as pool:
        list(pool.map(partial(_insert_one, ids_table), single))
    out.load_ids_s = time.perf_counter() - started

    started = time.perf_counter()
    errors = service.overview().fold_all([ENDPOINT, OTHER_ENDPOINT])
    if errors:
        raise RuntimeError(f"folding the seed's counts failed: {errors}")
    out.fold_s = time.perf_counter() - started
    return out


# ----------------------------------------------------------------------------------------------- reads


@dataclass(frozen=True)
class Read:
    """One operator read: how it is called, and its documented request count as a formula of the seed."""

    name: str
    bound: str  # the formula, as the docs say it
    requests: Callable[[Seeded], int]


def _pages(rows: int, per_page: int = 1000) -> int:
    """Requests a keys-only count of ``rows`` index rows takes (1,000 a page, one even when empty)."""
    return max(1, math.ceil(rows / per_page))


def _capped(rows: int) -> int:
    """A count stops at ``management.rules.COUNT_CAP`` (1,000): its pages."""
    from management.rules import COUNT_CAP

    return _pages(min(rows, COUNT_CAP))


# Per read (ADR-0022): 1 (the endpoint list) where a read walks the endpoints; the tallies (Completed,
# Skipped, Poison) are 2 requests per counts partition (the range of ``ct|`` rows, then the snapshot's ETag);
# the open statuses are counted from their listing rows, keys only, 1,000 a page (one page even when
# empty): the overview reads three ranges (DeadLettered..Failed, Pending, Unsupported), a listing's count
# its own status's range; a listing page is 1 read per listed status and shard (all events: 7).


def _status_count(s: Seeded, status: str) -> int:
    """Requests of a first page's count of ``status``."""
    counts = s.expected_counts()
    if status in ("Completed", "Skipped"):
        return 2
    listed = "Pending" if status == "PendingHandoff" else status
    return _pages(counts[listed])


def _open_ranges(s: Seeded) -> int:
    """Requests of the overview's read of the open events (three ranges)."""
    c = s.expected_counts()
    return (
        _pages(c["DeadLettered"] + c["Deferred"] + c["Failed"])
        + _pages(c["Pending"])
        + _pages(c["Unsupported"])
    )


READS: tuple[Read, ...] = (
    Read(
        "overview (GET v1/endpoints)",
        "1 (endpoint list) + per endpoint (2 tallies + ⌈open DeadLettered..Failed/1000⌉ + ⌈Pending/1000⌉ + "
        "⌈Unsupported/1000⌉ (at least 1 each) + ⌈min(unconfirmed, 1000)/1000⌉ + ⌈min(overdue, 1000)/1000⌉) "
        "+ 2 unattributed counts; 2 endpoints here",
        # the busy endpoint, then the other one (no event), then poison that names no endpoint
        lambda s: 1 + (2 + _open_ranges(s) + 1 + _capped(s.overdue)) + (2 + 3 + 1 + 1) + 2,
    ),
    Read("events, all: first page", "7 page reads (one per status's range, merged)", lambda s: 7),
    Read("events, all: next page", "7 page reads", lambda s: 7),
    *(
        r
        for status in (
            "Pending",
            "PendingHandoff",
            "Completed",
            "Failed",
            "DeadLettered",
            "Deferred",
            "Skipped",
        )
        for r in (
            Read(
                f"events, {status}: first page",
                "1 page read + its count (an open status: its rows, keys only, ⌈n/1000⌉; a tally: 2)",
                lambda s, status=status: 1 + _status_count(s, status),  # type: ignore[misc]
            ),
            Read(f"events, {status}: next page", "1 page read", lambda s: 1),
        )
    ),
    Read(
        "overdue: first page + count",
        "1 page read + ⌈min(overdue, 1000)/1000⌉ (keys-only count)",
        lambda s: 1 + _capped(s.overdue),
    ),
    Read(
        "overdue: next page + count",
        "1 page read + ⌈min(overdue, 1000)/1000⌉",
        lambda s: 1 + _capped(s.overdue),
    ),
    Read(
        "unconfirmed: first page + count",
        "1 page read + ⌈min(unconfirmed, 1000)/1000⌉",
        lambda s: 2,
    ),
    Read("find by event id", "2 index reads (sent together) + 1 point read per hand-off found", lambda s: 3),
    Read("find by message id", "2 index reads + 1 point read per hand-off found", lambda s: 3),
    Read("find by external job id", "2 index reads + 1 point read per hand-off found", lambda s: 3),
    Read("find by session id", "2 index reads + 1 point read per hand-off found", lambda s: 3),
    Read(
        "failed across endpoints: first page",
        "1 (endpoint list) + 2 buckets x shards per endpoint",
        lambda s: 1 + 2 * 2,
    ),
    Read("failed across endpoints: next page", "1 + 2 buckets x shards per endpoint", lambda s: 1 + 2 * 2),
    Read("one event (history, audits, claim)", "1 range read of the event's rows", lambda s: 1),
    Read("agent's next", "the queue's first rows (1 per shard) + the event row", lambda s: 2),
)


def _window(proxy: CountingProxy, quiet_s: float, call: Callable[[], Any]) -> tuple[Tally, Any]:
    proxy.wait_quiet(quiet_s)
    start = proxy.count
    answer = call()
    proxy.wait_quiet(quiet_s)
    return tally(proxy.since(start)), answer


def _ok(answer: HttpAnswer, what: str) -> Any:
    if answer.status != 200:
        raise RuntimeError(f"{what} answered {answer.status}: {answer.body[:300]!r}")
    return answer.json


@dataclass
class Measured:
    """Each read's cost at the wire, by name (None: not measured, with why)."""

    costs: dict[str, Tally] = field(default_factory=dict)
    why_not: dict[str, str] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)


def measure(
    env: Environment, proxy: CountingProxy, seeded: Seeded, *, page: int = PAGE, quiet_s: float | None = None
) -> Measured:
    """Every read of :data:`READS`, each alone, through the app's HTTP functions."""
    app = env.app
    quiet = env.sizes.roundtrip_quiet_s if quiet_s is None else quiet_s
    out = Measured()
    endpoint = {"endpointId": ENDPOINT}

    def get(function: str, route: dict[str, str] | None = None, **params: str) -> Callable[[], HttpAnswer]:
        return partial(app.http, function, method="GET", route=route, params=params)

    def counted(name: str, call: Callable[[], HttpAnswer]) -> Any:
        cost, answer = _window(proxy, quiet, call)
        out.costs[name] = cost
        body = _ok(answer, name)
        out.answers[name] = body
        return body

    def paged(
        name: str, function: str, route: dict[str, str] | None = None, suffix: str = "", **params: str
    ) -> None:
        """The first page, then the page its token names."""
        first = counted(f"{name}: first page{suffix}", get(function, route, **params))
        token = first.get("continuationToken")
        later = f"{name}: next page{suffix}"
        if token:
            counted(later, get(function, route, **params, continuationToken=token))
        else:
            out.why_not[later] = "one page holds them all"

    # Warm: the tables listed, the layout read, the clients made (a process's first read pays for them).
    _ok(get("endpoints_overview")(), "warm-up overview")
    _ok(get("find_events", q="warm-up")(), "warm-up find")

    counted("overview (GET v1/endpoints)", get("endpoints_overview"))
    paged("events, all", "endpoint_events", endpoint, pageSize=str(page))
    for status in STATUSES:
        paged(f"events, {status}", "endpoint_events", endpoint, pageSize=str(page), status=status)
    paged("overdue", "endpoint_overdue", endpoint, " + count", pageSize=str(page))
    # Settlements that could be neither confirmed nor re-sent: usually none (the seed holds none).
    counted("unconfirmed: first page + count", get("endpoint_unconfirmed", endpoint, pageSize=str(page)))
    sample = seeded.samples["completed via hand-off"]
    tag, n = sample.rsplit("-", 1)
    number = str(int(n))
    ids = {
        "event id": sample,
        "message id": f"park-{tag}-{number}",
        "external job id": f"JOB-{tag}-{number}",
        "session id": f"order-{tag}-{number}",
    }
    for kind, value in ids.items():
        body = counted(f"find by {kind}", get("find_events", q=value))
        found = [item["eventId"] for item in body.get("items", [])]
        if found != [sample]:
            raise RuntimeError(f"find by {kind} {value!r} found {found}, not {sample}")
    paged("failed across endpoints", "failed_events", pageSize=str(page))
    counted("one event (history, audits, claim)", get("endpoint_event", {**endpoint, "eventId": sample}))
    counted("agent's next", get("handoff_next", endpoint))
    return out


def _figure(read: Read, seeded: Seeded, cost: Tally | None, why_not: str | None) -> Figure:
    name = f"{read.name} ({seeded.events:,} events)"
    bound = read.requests(seeded)
    if cost is None:
        return missing(SECTION, name, f"<= {bound} requests", why_not or "not measured", unit="requests")
    return Figure(
        section=SECTION,
        name=name,
        settle=float(cost.requests),
        baseline=None,
        ratio=None,
        target=f"<= {bound} requests",
        verdict=verdict_at_most(cost.requests, bound),
        unit="requests",
        note=f"{cost.read:,} entities read, {cost.sent + cost.received:,} bytes "
        f"({cost.received:,} received); bound: {read.bound}",
    )


def events_for(env: Environment) -> int:
    given = os.environ.get(EVENTS_SETTING)
    if given:
        return int(given)
    return SMOKE_EVENTS if env.smoke else FULL_EVENTS


def seeded_and_measured(
    env: Environment, events: int, *, page: int = PAGE, quiet_s: float | None = None
) -> tuple[Seeded, Measured]:
    """Seed ``events`` events on fresh tables (one shard), check the counts, then measure every read."""
    from handoff import service

    previous = os.environ.get("SETTLE_HANDOFF_SHARDS")
    try:
        prefix = env.use_fresh_prefix(SETTLE_HANDOFF_SHARDS="1")
        log(f"reads: seeding {events:,} events on one endpoint ...")
        seeded = seed(events)
        log(
            f"reads: seeded {seeded.event_rows:,} rows + {seeded.id_rows:,} index rows (build "
            f"{seeded.build_s:.0f} s, load {seeded.load_s:.0f} + {seeded.load_ids_s:.0f} s, fold "
            f"{seeded.fold_s:.1f} s)"
        )
        counted = {k: v for k, v in service.overview().counts(ENDPOINT).items() if k != "Poison"}
        if counted != seeded.expected_counts():
            raise RuntimeError(f"the seed's counts are {counted}, not the mix's {seeded.expected_counts()}")
        with CountingProxy(env.table_endpoint()) as proxy:
            env.use_fresh_prefix(prefix=prefix, connection=proxy.connection_string(env.connection))
            measured = measure(env, proxy, seeded, page=page, quiet_s=quiet_s)
    finally:
        if previous is None:
            os.environ.pop("SETTLE_HANDOFF_SHARDS", None)
        else:
            os.environ["SETTLE_HANDOFF_SHARDS"] = previous
        env.use_fresh_prefix()
    return seeded, measured


def run(env: Environment) -> list[Figure]:
    needed = ("endpoints_overview", "endpoint_events", "endpoint_overdue", "find_events", "handoff_next")
    if not all(env.app.has(f) for f in needed):
        return [missing(SECTION, "operator reads", "", "an operator read function is not registered")]
    page = SMOKE_PAGE if env.smoke else PAGE
    seeded, measured = seeded_and_measured(env, events_for(env), page=page)
    figures = [_figure(r, seeded, measured.costs.get(r.name), measured.why_not.get(r.name)) for r in READS]
    mix = ", ".join(f"{kind} {count:,}" for kind, count in seeded.by_kind.items())
    figures.append(
        Figure(
            section=SECTION,
            name=f"seed: {seeded.events:,} events on one endpoint (not a read)",
            settle=round(seeded.build_s + seeded.load_s + seeded.load_ids_s + seeded.fold_s, 1),
            baseline=None,
            ratio=None,
            target="(context)",
            verdict="info",
            unit="s",
            note=f"{seeded.event_rows:,} rows in the endpoint's partition, {seeded.id_rows:,} lookup index "
            f"rows; projected by the production rules in {seeded.build_s:.0f} s, loaded in "
            f"{seeded.load_s:.0f} + {seeded.load_ids_s:.0f} s, counts folded in {seeded.fold_s:.1f} s; {mix}",
        )
    )
    env.details["reads"] = {
        "seed": seeded.as_dict(),
        "page_size": page,
        "reads": {
            r.name: {
                **measured.costs[r.name].as_dict(),
                "bound_requests": r.requests(seeded),
                "bound": r.bound,
            }
            for r in READS
            if r.name in measured.costs
        },
        "not_measured": measured.why_not,
    }
    return figures
