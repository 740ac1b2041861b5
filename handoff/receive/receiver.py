"""Agent receive and the read lookups. Index reads only, never a scan.

* ``next`` (NimBus-compatible): the oldest parked hand-off, non-claiming.
* leased receive: the oldest parked hand-off no one holds, claimed for a lease with one
  conditional write on its queue row (``ClaimedUntil`` = the lease's end, ``LeaseToken``); renewable,
  released on request, taken over by anyone once expired. A settlement carrying the token is fenced by it
  (:mod:`handoff.settlement.settler`). Its rules are :mod:`handoff.receive.leases`.
* Long-polls (``waitSeconds`` > 0) hold one of ``LONG_POLL_PERMITS`` per instance; beyond that, 429 with
  ``Retry-After`` (NimBus's ``nimbus-agent-receive`` concurrency limiter: PermitLimit 20).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from common import invocation
from common.clock import iso, utcnow
from common.errors import InvalidInput, NotFound, SettleError
from common.transactions import refusal
from handoff.receive import leases
from handoff.receive.leases import LeaseLost
from handoff.storage.records import AuditRow, EventRow, HistoryRow, QueueRow, UnconfirmedRow
from handoff.storage.store import HandoffStore, classify_event_rows

_POLL_INTERVAL_S = 0.5
# NimBus WebApp ``/api/agent/receive``: concurrency limiter PermitLimit 20, rejection 429 (contract §4.6).
LONG_POLL_PERMITS = 20
long_polls = threading.BoundedSemaphore(LONG_POLL_PERMITS)
DEFAULT_LEASE = timedelta(minutes=5)
MIN_LEASE = timedelta(seconds=10)
MAX_LEASE = timedelta(hours=1)
# Candidates read per page (one query page, never a scan): the first page, and the largest a receive reads
# when every candidate of its last page was taken by faster agents meanwhile.
_LEASE_CANDIDATES = 10
_LEASE_CANDIDATES_MAX = 100


class TooManyLongPolls(
    SettleError, status=429, slug="too-many-long-polls", title="Too many long-polls on this instance"
):
    """This instance already holds its long-polls' permits (429; ``Retry-After``)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


def lease_length(raw: str | int | None) -> timedelta:
    """``leaseSeconds`` (query or body): a whole number of seconds, 10 s to 1 h, default 5 min; 400 naming it
    otherwise (a fraction too: the lease reported is the lease applied, in whole seconds)."""
    if raw is None or str(raw).strip() == "":
        return DEFAULT_LEASE
    low, high = int(MIN_LEASE.total_seconds()), int(MAX_LEASE.total_seconds())
    text = str(raw).strip()
    if not (isinstance(raw, int) or (text.isascii() and text.isdigit() and len(text) <= 6)):
        raise InvalidInput(
            f"leaseSeconds must be a whole number of seconds, {low} to {high} (not {text[:40]!r}).",
            field="leaseSeconds",
        )
    seconds = int(text)
    if not low <= seconds <= high:
        raise InvalidInput(f"leaseSeconds must be {low} to {high}.", field="leaseSeconds")
    return timedelta(seconds=seconds)


@contextlib.contextmanager
def long_poll(wait_seconds: float) -> Iterator[None]:
    """Holds a permit while a call waits; a call that does not wait takes none. The wait comes on top of
    the call's deadline (``common.invocation``): its last poll still has the time of any other call."""
    if wait_seconds <= 0:
        yield
        return
    if not long_polls.acquire(blocking=False):
        raise TooManyLongPolls(
            f"This instance is serving {LONG_POLL_PERMITS} long-polls already; retry after a second "
            "(or poll without waitSeconds)."
        )
    budget = invocation.current()
    if budget is not None:
        budget.extend(wait_seconds)
    try:
        yield
    finally:
        long_polls.release()


@dataclass(frozen=True)
class Lease:
    """A lease a token holds on one parked hand-off, until ``expires_at``."""

    token: str
    expires_at: datetime
    lease_for: timedelta
    leased_by: str | None


@dataclass(frozen=True)
class Leased:
    """A parked hand-off (its event row) and the lease just written on it."""

    row: EventRow
    lease: Lease


@dataclass(frozen=True)
class EventRecord:
    """An event row with its message history and audits, as one range read found them."""

    row: EventRow
    history: list[HistoryRow]
    audits: list[AuditRow]


class ReceiveService:
    """Reads for agents and operators; answers with rows and leases (the blueprint shapes the views)."""

    def __init__(
        self,
        store_: HandoffStore,
        *,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store_
        self.clock = clock
        self.sleep = sleep
        self.monotonic = monotonic

    def next(
        self, endpoint_id: str, event_type_ids: Sequence[str] = (), wait_seconds: float = 0
    ) -> EventRow | None:
        """The oldest Pending + Handoff event not being settled, polling up to ``wait_seconds``; else None."""
        deadline = self.monotonic() + max(0.0, wait_seconds)
        while True:
            found = self._next_once(endpoint_id, event_type_ids)
            if found is not None or self.monotonic() + _POLL_INTERVAL_S > deadline:
                return found
            self.sleep(_POLL_INTERVAL_S)

    def _next_once(self, endpoint_id: str, event_type_ids: Sequence[str]) -> EventRow | None:
        for entry in self.store.queued(
            endpoint_id, claimed_before=iso(self.clock()), event_type_ids=event_type_ids
        ):
            row = self.store.get_event(endpoint_id, entry.event_id)
            # The index changes with the event row in one transaction; the check only guards a reader
            # that saw the index just before a projection removed it.
            if row is not None and row.is_pending_handoff and row.last_message_id == entry.parked_message_id:
                return row
        return None

    # -- leased receive ------------------------------------------------------------------------------

    def lease(
        self,
        endpoint_id: str,
        event_type_ids: Sequence[str] = (),
        wait_seconds: float = 0,
        *,
        lease_for: timedelta = DEFAULT_LEASE,
        agent_id: str | None = None,
    ) -> Leased | None:
        """Claim the oldest parked hand-off no one holds for ``lease_for``, polling up to ``wait_seconds``."""
        deadline = self.monotonic() + max(0.0, wait_seconds)
        while True:
            found = self._lease_once(endpoint_id, event_type_ids, lease_for, agent_id)
            if found is not None or self.monotonic() + _POLL_INTERVAL_S > deadline:
                return found
            self.sleep(_POLL_INTERVAL_S)

    def _lease_once(
        self, endpoint_id: str, event_type_ids: Sequence[str], lease_for: timedelta, agent_id: str | None
    ) -> Leased | None:
        """Lease the oldest free hand-off; None only when a read of the index found none free.

        A candidate we lose (another agent leased it, a settlement claimed it, or a projection removed it
        between our read and our write) is not free any more, so the next read skips it: we read again until
        a write wins or a read finds nothing, never giving up after a fixed number of rounds (that answered
        204 while hand-offs were free, with many agents racing). Every read but the first follows a page on
        which *every* candidate moved on, so the loop runs only while other agents are taking hand-offs; each
        read is one page of at most ``_LEASE_CANDIDATES_MAX`` rows, never a scan of the partition. After the
        oldest candidate is lost, the rest of the page is tried in random order so that racing agents spread
        over the page instead of all losing the same row, and the next page is read larger.
        """
        limit = _LEASE_CANDIDATES
        while True:
            now = self.clock()
            candidates = self.store.queued(
                endpoint_id, claimed_before=iso(now), event_type_ids=event_type_ids, limit=limit
            )
            if not candidates:
                return None
            lost = False
            for entry in [candidates[0], *random.sample(candidates[1:], len(candidates) - 1)]:
                row = self.store.get_event(endpoint_id, entry.event_id)
                if (
                    row is None
                    or not row.is_pending_handoff
                    or row.last_message_id != entry.parked_message_id
                ):
                    continue  # projected since the index read (the index row went with it): not free
                token = uuid.uuid4().hex
                until = now + lease_for
                if self._write_lease(endpoint_id, entry, token, until, agent_id, now):
                    return Leased(row, Lease(token, until, lease_for, agent_id))
                # another agent leased it (or a settlement claimed it) between our read and our write
                lost = True
            if not lost:
                # Every candidate was an index row whose event has moved on and which no agent is taking:
                # reading again would return the same rows (a loop that never ends), so none is free.
                return None
            limit = min(limit * 2, _LEASE_CANDIDATES_MAX)

    def _write_lease(
        self,
        endpoint_id: str,
        entry: QueueRow,
        token: str,
        until: datetime,
        agent_id: str | None,
        now: datetime,
    ) -> bool:
        pk = self.store.event_partition(endpoint_id, entry.event_id)
        try:
            self.store.submit([leases.plan_lease(pk, entry, token, until, agent_id, now)])
        except Exception as exc:
            if leases.lost(refusal(exc)):
                return False
            raise
        return True

    def renew(
        self, endpoint_id: str, event_id: str, token: str, *, lease_for: timedelta = DEFAULT_LEASE
    ) -> Lease:
        """Extend a lease the token still holds (also one that expired while no one took it)."""
        entry = self._held(endpoint_id, event_id, token)
        now = self.clock()
        until = now + lease_for
        if not self._write_lease(endpoint_id, entry, token, until, entry.leased_by, entry.leased_at or now):
            raise self._lost(event_id)
        return Lease(token, until, lease_for, entry.leased_by or None)

    def release(self, endpoint_id: str, event_id: str, token: str) -> None:
        """Give the hand-off back at once (the next receive gets it)."""
        entry = self._held(endpoint_id, event_id, token)
        pk = self.store.event_partition(endpoint_id, entry.event_id)
        try:
            self.store.submit([leases.plan_give_back(pk, entry)])
        except Exception as exc:
            if leases.lost(refusal(exc)):
                raise self._lost(event_id) from exc
            raise

    def _held(self, endpoint_id: str, event_id: str, token: str) -> QueueRow:
        """The queue row while ``token`` holds it and no settlement was claimed; else 409 lease-lost."""
        row = self.store.get_event(endpoint_id, event_id)
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        entry = self.store.get_queue_row(endpoint_id, event_id, row.queue_key) if row.queue_key else None
        if entry is None or not leases.held(entry, token):
            raise self._lost(event_id)
        return entry

    @staticmethod
    def _lost(event_id: str) -> LeaseLost:
        return LeaseLost(
            f"The lease on event {event_id!r} is not held by this token any more (released, settled, or "
            "expired and taken by another agent).",
            field="leaseToken",
        )

    def job(self, endpoint_id: str, external_job_id: str) -> EventRow:
        """The parked event carrying ``external_job_id``, or 404: the events the lookup index names for it
        (or, for parks written before ADR-0022, their job rows), each checked on its event row."""
        event_ids = self.store.job_events(endpoint_id, external_job_id) or [
            entry.event_id for entry in self.store.legacy_jobs(endpoint_id, external_job_id)
        ]
        for event_id in event_ids:
            row = self.store.get_event(endpoint_id, event_id)
            if row is not None and row.is_pending_handoff and row.external_job_id == external_job_id:
                return row
        raise NotFound(f"No parked hand-off with external job id {external_job_id!r} on {endpoint_id!r}.")

    def event(self, endpoint_id: str, event_id: str) -> EventRecord:
        """The event row with its history and audits (one range query), or 404."""
        row, history, audits = classify_event_rows(self.store.event_rows(endpoint_id, event_id))
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        return EventRecord(row, history, audits)

    def unconfirmed(self, endpoint_id: str) -> list[UnconfirmedRow]:
        """Settlements that could neither be confirmed nor safely re-sent (one range read)."""
        return self.store.unconfirmed(endpoint_id)
