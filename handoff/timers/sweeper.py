"""Timeout sweeper (opt-in, NimBus FR-050): fail parked events whose ExpectedBy has passed, exactly once.

For each endpoint that ever parked, it reads the due parks (ADR-0022 change 5): the ``ex|``…``hq}`` range
of each shard (``keys.OVERDUE_RANGE``) filtered by storage on ``ExpectedBy`` before now
(:meth:`~handoff.storage.store.HandoffStore.expired`), following continuation tokens, at most
``rows_per_endpoint`` rows per run; where a run stops, the endpoint row keeps a cursor per shard
(``SweepCursor``, ``If-Match`` its ETag), so the next run on any instance continues there and rows that
cannot be swept never hide the ones behind them. Every due row goes through the normal settlement path
(claim → send → audit) with errorType ``TimeoutExpired``:

* exactly once: the claim is the outbox (:mod:`handoff.settlement.settler`); a run that meets its own claim
  (the claim transaction applied but its answer was lost) is the same settlement and continues from it; a
  row whose event is no longer parked, or no longer due by the event row, is skipped;
* no audit without a message: a send that certainly reached nothing releases the claim, and with it the
  audit rendered from it;
* another settlement in flight (an agent was faster) wins: the row is skipped;
* one row's or one endpoint's failure is reported and the run goes on.

**Order**: the ``ex|`` rows of parks written before change 5 first (ExpectedBy order), then the queue rows
``hq|`` in **parked order** (oldest park first), no longer in ExpectedBy order: a run bounded by
``rows_per_endpoint`` fails the oldest due parks first, not the most overdue. Every due park is still
reached within a cycle of the cursor. **Cost** per tick and shard: one filtered range query (more pages
when storage stops one early), which storage answers by examining every parked hand-off of the shard:
linear in the endpoint's parked hand-offs, not in its table (the ``ex|`` read before change 5 read the
due rows only).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from common import telemetry
from common.clock import iso
from common.errors import Conflict, NotFound
from handoff.messages.contract import Coordinates, MessageType
from handoff.settlement.settler import Settlement
from handoff.storage import keys
from handoff.storage.records import EndpointRow
from handoff.storage.store import HandoffStore
from handoff.timers.endpoint_pass import EndpointPass

if TYPE_CHECKING:
    from handoff.timers.reconciler import Reconciler

log = logging.getLogger("settle.sweeper")

SWEEPER = "Sweeper"
TIMEOUT_ERROR_TYPE = "TimeoutExpired"
ROWS_PER_ENDPOINT = 500


@dataclass
class SweepReport:
    """Event ids failed (newly or by finishing an earlier run's claim), skipped, and errors per endpoint."""

    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: dict[str, dict[str, str]] = field(default_factory=dict)


# Gauges count at most this many index rows per endpoint and tick (10 pages of keys; beyond it the gauge
# says "at least this many", which is enough to alert on).
GAUGE_CAP = 10_000


def report_parked(
    store: HandoffStore, now: datetime, *, sweeping: bool, endpoint_ids: Sequence[str] | None = None
) -> None:
    """``settle.handoff.parked`` and ``settle.handoff.overdue`` per endpoint, from the queue rows and the
    due parks (keys only, the latter filtered on ``ExpectedBy``: both linear in the parked hand-offs; run on
    the sweeper tick, and only when telemetry is on). ``endpoint_ids``: the tick's endpoint list (read here
    when not given)."""
    if not telemetry.enabled():
        return
    for endpoint_id in store.endpoints() if endpoint_ids is None else endpoint_ids:
        try:
            low, high = keys.QUEUE_RANGE
            parked = store.count_range(endpoint_id, low, high, cap=GAUGE_CAP)
            overdue = store.count_due(endpoint_id, now, cap=GAUGE_CAP)
        except Exception:
            log.warning("could not count the parked hand-offs of %s", endpoint_id, exc_info=True)
            continue
        telemetry.gauge("settle.handoff.parked", parked, endpoint=endpoint_id)
        telemetry.gauge(
            "settle.handoff.overdue", overdue, endpoint=endpoint_id, sweeper="on" if sweeping else "off"
        )


class Sweeper(EndpointPass):
    ROWS_PER_ENDPOINT = ROWS_PER_ENDPOINT

    @property
    def clock(self) -> Callable[[], datetime]:
        return self._clock or self.settlement.clock

    @clock.setter
    def clock(self, value: Callable[[], datetime]) -> None:
        self._clock = value

    def sweep(self, endpoints: Sequence[EndpointRow] | None = None) -> SweepReport:
        """One pass over ``endpoints`` (the tick's endpoint rows; read here when not given)."""
        report = SweepReport()
        self.each_endpoint(
            self.store.endpoint_rows() if endpoints is None else endpoints,
            lambda endpoint: self._sweep_endpoint(endpoint, report),
            endpoint_of=lambda endpoint: endpoint.endpoint_id,
            errors=report.errors,
            log=log,
            doing="sweeping",
        )
        log.info(
            "sweeper: %d timed out, %d skipped, %d endpoints with errors",
            len(report.failed),
            len(report.skipped),
            len(report.errors),
        )
        return report

    def _sweep_endpoint(self, endpoint: EndpointRow, report: SweepReport) -> None:
        now = self.clock()
        cursor = endpoint.sweep_cursor or None
        after = _cursors(endpoint.endpoint_id, cursor)
        entries = self.store.expired(endpoint.endpoint_id, now, after=after, limit=self.rows_per_endpoint)
        for entry in entries:
            event_id = str(entry["EventId"])
            try:
                self._sweep_one(endpoint.endpoint_id, event_id, now, report)
            except Exception as exc:
                log.warning("sweeping %s/%s failed", endpoint.endpoint_id, event_id, exc_info=True)
                report.errors.setdefault(endpoint.endpoint_id, {})[event_id] = f"{type(exc).__name__}: {exc}"
        # Stopped at the bound: continue after the last row next time; reached the end: start over.
        new_cursor = None
        if len(entries) >= self.rows_per_endpoint:
            for entry in entries:  # per shard: behind the last row taken from it
                after[str(entry["PartitionKey"])] = str(entry["RowKey"])
            new_cursor = _cursor_text(endpoint.endpoint_id, after)
        if new_cursor != cursor:
            self.store.save_sweep_cursor(endpoint, new_cursor)

    def _sweep_one(self, endpoint_id: str, event_id: str, now: datetime, report: SweepReport) -> None:
        row = self.store.get_event(endpoint_id, event_id)
        if row is None or not row.is_pending_handoff or row.expected_by is None or row.expected_by > now:
            report.skipped.append(event_id)
            return
        coords = Coordinates(
            event_id=row.event_id,
            session_id=row.session_id,
            message_id=row.last_message_id or "",
            event_type_id=row.event_type_id,
            correlation_id=row.correlation_id,
            originating_message_id=row.originating_message_id,
        )
        try:
            self.settlement.settle(
                Settlement(
                    kind=MessageType.HandoffFailedRequest,
                    endpoint_id=endpoint_id,
                    coordinates=coords,
                    settled_by=SWEEPER,
                    error_text=f"Hand-off expired: ExpectedBy {iso(row.expected_by)} passed.",
                    error_type=TIMEOUT_ERROR_TYPE,
                ),
                current=row,
            )
        except (Conflict, NotFound) as exc:
            # Another settlement holds it, or it moved on meanwhile: nothing for the sweeper to do.
            log.info("sweeper skipped %s/%s: %s", endpoint_id, event_id, exc.detail)
            report.skipped.append(event_id)
            return
        report.failed.append(event_id)


def tick(
    store: HandoffStore,
    reconciler: Reconciler,
    fold_all: Callable[[Sequence[str]], object],
    sweeper: Sweeper | None,
    *,
    gauges_at: Callable[[], datetime] | None = None,
) -> SweepReport | None:
    """One tick of the ``handoff_sweeper`` timer: reconcile open claims, fold the counts' deltas, then
    (``sweeper`` given: ``HANDOFF_SWEEPER_ENABLED``) fail overdue hand-offs, and (``gauges_at`` given:
    telemetry on) report the parked and overdue gauges. The endpoint list is read **once** and passed to
    each pass: it only grows (an endpoint's row is inserted once) and only the sweep writes it, its cursor
    ``If-Match`` the ETag read here, so a later read would give the passes nothing new."""
    endpoints = store.endpoint_rows()
    endpoint_ids = [row.endpoint_id for row in endpoints]
    reconciler.run(endpoint_ids)
    fold_all(endpoint_ids)
    report = sweeper.sweep(endpoints) if sweeper is not None else None
    if gauges_at is not None:
        report_parked(store, gauges_at(), sweeping=sweeper is not None, endpoint_ids=endpoint_ids)
    return report


def _cursors(endpoint_id: str, text: str | None) -> dict[str, str]:
    """The sweeper's cursor per shard: a plain RowKey (the unsharded partition, as before shards) or a JSON
    object ``{PartitionKey: RowKey}`` (``ex|`` and ``hq|`` keys never start with ``{``). A cursor written
    before ADR-0022 change 5 names an ``ex|`` row: the range read goes on behind it, as before."""
    if not text:
        return {}
    if text.startswith("{"):
        loaded = json.loads(text)
        return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}
    return {keys.partition(endpoint_id): text}


def _cursor_text(endpoint_id: str, cursors: dict[str, str]) -> str | None:
    if not cursors:
        return None
    if list(cursors) == [keys.partition(endpoint_id)]:
        return cursors[keys.partition(endpoint_id)]
    return json.dumps(cursors, sort_keys=True)
