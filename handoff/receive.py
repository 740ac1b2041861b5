"""Agent receive (oldest parked event, non-claiming) and the read lookups. Index reads only, never a scan."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime

from common.clock import iso, utcnow
from common.errors import NotFound
from handoff.models import EventView, PendingHandoffView, UnconfirmedClaim, UnconfirmedList
from handoff.store import HandoffStore, classify_event_rows

_POLL_INTERVAL_S = 0.5


class ReceiveService:
    """Reads for agents and operators."""

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
    ) -> PendingHandoffView | None:
        """The oldest Pending + Handoff event not being settled, polling up to ``wait_seconds``; else None."""
        deadline = self.monotonic() + max(0.0, wait_seconds)
        while True:
            found = self._next_once(endpoint_id, event_type_ids)
            if found is not None or self.monotonic() + _POLL_INTERVAL_S > deadline:
                return found
            self.sleep(_POLL_INTERVAL_S)

    def _next_once(self, endpoint_id: str, event_type_ids: Sequence[str]) -> PendingHandoffView | None:
        for entry in self.store.queued(
            endpoint_id, claimed_before=iso(self.clock()), event_type_ids=event_type_ids
        ):
            row = self.store.get_event(endpoint_id, entry.event_id)
            # The index changes with the event row in one transaction; the check only guards a reader
            # that saw the index just before a projection removed it.
            if row is not None and row.is_pending_handoff and row.last_message_id == entry.parked_message_id:
                return PendingHandoffView.of(row)
        return None

    def job(self, endpoint_id: str, external_job_id: str) -> PendingHandoffView:
        """The parked event carrying ``external_job_id``, or 404."""
        for entry in self.store.jobs(endpoint_id, external_job_id):
            row = self.store.get_event(endpoint_id, entry.event_id)
            if row is not None and row.is_pending_handoff and row.external_job_id == external_job_id:
                return PendingHandoffView.of(row)
        raise NotFound(f"No parked hand-off with external job id {external_job_id!r} on {endpoint_id!r}.")

    def event(self, endpoint_id: str, event_id: str) -> EventView:
        """The event row with its history and audits (one range query), or 404."""
        row, history, audits = classify_event_rows(self.store.event_rows(endpoint_id, event_id))
        if row is None:
            raise NotFound(f"Event {event_id!r} is unknown on endpoint {endpoint_id!r}.")
        return EventView.of(row, history, audits)

    def unconfirmed(self, endpoint_id: str) -> UnconfirmedList:
        """Settlements that could neither be confirmed nor safely re-sent (one range read)."""
        rows = self.store.unconfirmed(endpoint_id)
        items = [
            UnconfirmedClaim(
                event_id=r.event_id,
                parked_message_id=r.parked_message_id,
                control_message_id=r.control_message_id,
                message_type=r.message_type.name,
                settled_by=r.settled_by,
                claimed_at=r.claimed_at,
                since=r.since,
            )
            for r in rows
        ]
        return UnconfirmedList(endpoint_id=endpoint_id, count=len(items), items=items)
