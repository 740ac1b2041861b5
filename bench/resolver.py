"""Figure 5: resolver throughput against a floor it cannot beat.

NimBus messages (each event: EventRequest, PendingHandoffResponse, HandoffCompletedRequest,
ResolutionResponse) are projected one after another through the ``resolver`` function. While Settle
projects a message, every Table call it makes (``get_entity``, ``submit_transaction``,
``create_entity``, ...) is recorded with its arguments and outcome. The **floor** replays exactly those
calls **that the documented minimum allows** (docs/tables.md: one point read of the event row and one
transaction, and the lookup index inserts sent beside the read; any other call Settle makes, such as an
extra read, is left out of the floor, so it shows as a slower Settle instead of moving both sides), in the
same order, through a Table client of the same service client Settle uses, on replica tables that went
through the same calls before (so every read finds the same rows, every conditional
write the same versions: the ETags a call used are mapped to the replica's). It is the storage work of
the projection with none of Settle's own (parsing, models, the status map, building the operations), so
Settle cannot come out faster than it except by noise. The two interleave message by message (Settle's
message *i* next to the floor's replay of message *i-1*, the order rotating), so a busy machine slows
both alike; the messages are then grouped in blocks and the ratio is the median of the per-block ratios.
Target: Settle at least 0.8 of the floor's messages/s.

For context, raw single-entity upserts/s are timed in the same steps (the old baseline; a projection
is one read and one transaction, so it cannot reach the upsert rate).
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from azure.data.tables import TableClient

from bench.harness import Environment, Figure, median, missing, verdict_at_least
from bench.workload import event_messages, raw_entity, unique_row
from common import runtime
from handoff.storage.keys import IDS_TABLE

SECTION = "resolver"
TARGET = 0.8
REPLICA = "rp"  # logical-name prefix of the replica tables
RECORDED = (
    "get_entity",
    "create_entity",
    "update_entity",
    "upsert_entity",
    "delete_entity",
    "submit_transaction",
)
# Reads that change nothing: recorded (they are Settle's work) but never replayed, so never the floor's.
READS = ("query_entities", "list_entities")


class FloorMismatch(Exception):
    """The replay did not behave as the recorded call did: the floor would not be the same work."""


@dataclass
class Call:
    """One Table call Settle made: where, what, with which arguments, and what came back."""

    table: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    etags: list[str] = field(default_factory=list)
    error: type[BaseException] | None = None


def _etags(method: str, result: Any) -> list[str]:
    """The ETags a call's result carries, in order."""
    if method == "get_entity":
        etag = getattr(result, "metadata", {}).get("etag")
        return [etag] if etag else []
    if method == "submit_transaction":
        return [str(r.get("etag")) for r in result or [] if r.get("etag")]
    if isinstance(result, dict) and result.get("etag"):
        return [str(result["etag"])]
    return []


def _copy_entity(entity: Any) -> Any:
    copied = copy.copy(entity)
    if hasattr(entity, "_metadata"):
        copied._metadata = dict(entity._metadata)
    return copied


class Recorder:
    """Records every ``TableClient`` call made while :meth:`recording` is open (class-level wrappers)."""

    def __init__(self) -> None:
        self.active = False
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._originals: dict[str, Any] = {}

    @contextmanager
    def installed(self) -> Iterator[Recorder]:

        for name in (*RECORDED, *READS):
            original = getattr(TableClient, name)
            self._originals[name] = original
            setattr(TableClient, name, self._wrap(name, original))
        try:
            yield self
        finally:
            for name, original in self._originals.items():
                setattr(TableClient, name, original)

    @contextmanager
    def recording(self) -> Iterator[list[Call]]:
        self.calls = []
        self.active = True
        try:
            yield self.calls
        finally:
            self.active = False

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def wrapper(client: Any, *args: Any, **kwargs: Any) -> Any:
            if not recorder.active:
                return original(client, *args, **kwargs)
            if name == "submit_transaction":
                operations = [
                    (op[0], _copy_entity(op[1]), *(dict(o) for o in op[2:])) for op in list(args[0])
                ]
                args = (operations, *args[1:])
                kept: tuple[Any, ...] = ([tuple(op) for op in operations], *args[1:])
            else:
                kept = tuple(_copy_entity(a) if isinstance(a, dict) else a for a in args)
            call = Call(str(client.table_name), name, kept, dict(kwargs))
            with recorder._lock:
                recorder.calls.append(call)
            try:
                result = original(client, *args, **kwargs)
            except Exception as exc:
                call.error = type(exc)
                raise
            call.etags = _etags(name, result)
            return result

        return wrapper


class Replica:
    """Replays recorded calls on replica tables through Settle's own service client."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.etags: dict[str, str] = {}
        self._clients: dict[str, Any] = {}

    def client(self, table: str) -> Any:
        found = self._clients.get(table)
        if found is None:
            logical = table[len(self.prefix) :] if table.startswith(self.prefix) else table
            found = runtime.tables().table(REPLICA + logical)  # created on first use (never while timed)
            self._clients[table] = found
        return found

    def prepare(self, calls: list[Call]) -> None:
        """Create the replica clients (and tables) the calls need, outside any timing."""
        for call in calls:
            self.client(call.table)

    def _etag(self, value: Any) -> Any:
        return self.etags.get(value, value) if isinstance(value, str) else value

    def _entity(self, entity: Any) -> Any:
        metadata = getattr(entity, "_metadata", None)
        if metadata and metadata.get("etag") in self.etags:
            entity = _copy_entity(entity)
            entity._metadata["etag"] = self.etags[metadata["etag"]]
        return entity

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if "etag" not in kwargs:
            return kwargs
        return {**kwargs, "etag": self._etag(kwargs["etag"])}

    def replay(self, calls: list[Call]) -> None:
        for call in calls:
            if call.method in READS:
                continue  # a read changes no row: the replica is the same without it
            client = self._clients.get(call.table) or self.client(call.table)
            if call.method == "submit_transaction":
                ops = [
                    (op[0], self._entity(op[1]), *(self._kwargs(o) for o in op[2:])) for op in call.args[0]
                ]
                args: tuple[Any, ...] = (ops, *call.args[1:])
            else:
                args = tuple(self._entity(a) for a in call.args)
            try:
                result = getattr(client, call.method)(*args, **self._kwargs(call.kwargs))
            except Exception as exc:
                if call.error is None or not isinstance(exc, call.error):
                    raise FloorMismatch(
                        f"{call.method} on {call.table}: {exc!r}, recorded {call.error}"
                    ) from exc
                continue
            if call.error is not None:
                raise FloorMismatch(
                    f"{call.method} on {call.table} succeeded, recorded {call.error.__name__}"
                )
            for original, replayed in zip(call.etags, _etags(call.method, result), strict=False):
                self.etags[original] = replayed


# A projection: one point read of the event row, one transaction (docs/tables.md); and the lookup index
# inserts of the ids the process has not indexed yet (sent beside the read): per event of the workload, its
# four message ids, its event id and session id, its job id: 7 over 4 messages.
INDEX_INSERTS_PER_MESSAGE = 7 / 4
DOCUMENTED_REQUESTS = 2 + INDEX_INSERTS_PER_MESSAGE


def documented_minimum(calls: list[Call]) -> list[Call]:
    """The calls a projection needs by the documented design: the first point read, the transactions
    (one; an ETag race would add read + transaction pairs, which the bench's sequential messages never
    meet) and the lookup index inserts (replayed one after another, where Settle sends them beside its
    read). Everything else Settle did is its own cost, never the floor's."""

    first_read = next((c for c in calls if c.method == "get_entity"), None)
    return [
        c
        for c in calls
        if c is first_read
        or c.method == "submit_transaction"
        or (c.method == "create_entity" and c.table.endswith(IDS_TABLE))
    ]


class _ResolverFailed(Exception):
    """The resolver (the code under test) raised; reported as a finding, not a benchmark crash."""


def run(env: Environment) -> list[Figure]:
    name = "messages/s / floor (the documented minimum of Table calls, replayed)/s"
    target = f">= {TARGET}x"
    if not env.app.has("resolver"):
        return [missing(SECTION, name, target, "resolver not registered", unit="msg/s")]
    prefix = env.use_fresh_prefix()
    events = env.sizes.resolver_events
    blocks = env.sizes.resolver_blocks
    messages: list[Any] = [m for n in range(events) for _, m in event_messages("Billing", n)]
    table = env.raw_table("upsert")
    raw_rows = [raw_entity(f"p-{n % 50}", unique_row()) for n in range(len(messages))]
    recorder = Recorder()
    replica = Replica(runtime.tables().settings.table_name(""))
    recorded: list[list[Call]] = []
    settle_s = [0.0] * len(messages)
    floor_s = [0.0] * len(messages)
    raw_s = [0.0] * len(messages)

    def project(i: int) -> None:
        with recorder.recording() as calls:
            start = time.perf_counter()
            try:
                env.app.message("resolver", messages[i])
            except Exception as exc:  # a crash in the code under test is a finding
                raise _ResolverFailed(repr(exc)) from exc
            settle_s[i] = time.perf_counter() - start
        recorded.append(list(calls))

    def floor(i: int) -> None:
        allowed = documented_minimum(recorded[i])
        replica.prepare(allowed)
        start = time.perf_counter()
        replica.replay(allowed)
        floor_s[i] = time.perf_counter() - start

    def upsert(i: int) -> None:
        start = time.perf_counter()
        table.upsert_entity(raw_rows[i])
        raw_s[i] = time.perf_counter() - start

    with recorder.installed():
        try:
            # Warm-up (tables, endpoint registration, connections), replayed on the replica untimed.
            table.upsert_entity(raw_entity("warm", "warm"))
            with recorder.recording() as warm:
                for _, message in event_messages("Billing", 10_000_000):
                    env.app.message("resolver", message)
            replica.prepare(warm)
            replica.replay(list(warm))
            project(0)
            for i in range(1, len(messages)):
                steps: list[Callable[[], None]] = [
                    functools.partial(project, i),
                    functools.partial(floor, i - 1),
                    functools.partial(upsert, i),
                ]
                for step in steps[i % 3 :] + steps[: i % 3]:
                    step()
            floor(len(messages) - 1)
            upsert(0)
        except _ResolverFailed as exc:
            return [missing(SECTION, name, target, f"resolver raised {exc}", unit="msg/s")]
        except FloorMismatch as exc:
            return [missing(SECTION, name, target, f"the floor's replay diverged: {exc}", unit="msg/s")]
    per_block = max(4, len(messages) // blocks // 4 * 4)  # whole events: every block has the same mix
    spans = [range(b, min(b + per_block, len(messages))) for b in range(0, len(messages), per_block)]

    def rate(seconds: list[float], span: range) -> float:
        return len(span) / sum(seconds[i] for i in span)

    settle_rates = [rate(settle_s, span) for span in spans]
    floor_rates = [rate(floor_s, span) for span in spans]
    raw_rates = [rate(raw_s, span) for span in spans]
    ratios = [s / f for s, f in zip(settle_rates, floor_rates, strict=True)]
    value = median(ratios)
    calls_per_message = sum(len(c) for c in recorded) / len(recorded)
    queries = sum(1 for calls in recorded for call in calls if call.method in READS)
    env.details["resolver"] = {
        "messages": len(messages),
        "events": events,
        "blocks": len(ratios),
        "messages_per_s": settle_rates,
        "floor_messages_per_s": floor_rates,
        "raw_upserts_per_s": raw_rates,
        "ratios": ratios,
        "table_calls_per_message": calls_per_message,
        "queries": queries,
        "prefix": prefix,
    }
    return [
        Figure(
            section=SECTION,
            name="Table requests per message / documented minimum",
            settle=round(calls_per_message, 3),
            baseline=DOCUMENTED_REQUESTS,
            ratio=round(calls_per_message / DOCUMENTED_REQUESTS, 3),
            target=f"<= {DOCUMENTED_REQUESTS} (+ one insert per endpoint and process)",
            verdict="met" if calls_per_message <= DOCUMENTED_REQUESTS + 0.01 else "missed",
            unit="requests",
            note="the documented minimum of a projection, independent of Settle's calls",
        ),
        Figure(
            section=SECTION,
            name=name,
            settle=median(settle_rates),
            baseline=median(floor_rates),
            ratio=value,
            target=target,
            verdict=verdict_at_least(value, TARGET),
            unit="msg/s",
            note=(
                f"{len(messages)} messages over {events} events; {len(ratios)} blocks, per-block ratios "
                f"{min(ratios):.2f}-{max(ratios):.2f}; {calls_per_message:.2f} Table calls per message"
                f" ({queries} of them queries in all, Settle's own work, never replayed by the floor)"
            ),
        ),
        Figure(
            section=SECTION,
            name="messages/s / raw upserts/s",
            settle=median(settle_rates),
            baseline=median(raw_rates),
            ratio=median([s / r for s, r in zip(settle_rates, raw_rates, strict=True)]),
            target="(context)",
            verdict="info",
            unit="msg/s",
            note="single-entity upserts of a row as large as a state row, interleaved in the same steps",
        ),
    ]
