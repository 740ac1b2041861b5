"""Timeout sweeper (opt-in, NimBus FR-050): fail parked events whose ExpectedBy has passed, once.

It walks the endpoints that ever parked and reads each one's ``ex|`` index range up to now; every hit is
failed through the normal settlement path (claim → send → audit) with errorType ``TimeoutExpired``. It
never takes over a claim (even an expired one), so an event is timed out at most once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from common.clock import iso, utcnow
from common.errors import SettleError
from handoff.contract import Coordinates, MessageType
from handoff.settlement import Settlement, SettlementService

log = logging.getLogger("settle.sweeper")

SWEEPER = "Sweeper"
TIMEOUT_ERROR_TYPE = "TimeoutExpired"


@dataclass
class SweepReport:
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Sweeper:
    def __init__(self, settlement: SettlementService, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.settlement = settlement
        self.store = settlement.store
        self.clock = clock

    def sweep(self) -> SweepReport:
        report = SweepReport()
        now = self.clock()
        for endpoint_id in self.store.endpoints():
            for entry in self.store.expired(endpoint_id, now):
                event_id = str(entry["EventId"])
                row = self.store.get_event(endpoint_id, event_id)
                if (
                    row is None
                    or not row.is_pending_handoff
                    or row.expected_by is None
                    or row.expected_by > now
                ):
                    report.skipped.append(event_id)
                    continue
                coords = Coordinates(
                    event_id=row.event_id,
                    session_id=row.session_id or "",
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
                        take_over_expired=False,
                    )
                except SettleError as exc:
                    log.info("sweeper skipped %s/%s: %s", endpoint_id, event_id, exc.detail)
                    report.skipped.append(event_id)
                    continue
                report.failed.append(event_id)
        return report
