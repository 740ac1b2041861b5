"""What the timer's passes over every endpoint (the sweeper, the reconciler) are built on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from handoff.settlement import SettlementService


class EndpointPass:
    """A pass over the endpoints: the settlement service and its store, a clock (the settlement's unless one
    is given) and how many rows it handles per endpoint in one run (the class's default unless given)."""

    ROWS_PER_ENDPOINT: ClassVar[int]

    def __init__(
        self,
        settlement: SettlementService,
        *,
        clock: Callable[[], datetime] | None = None,
        rows_per_endpoint: int | None = None,
    ) -> None:
        self.settlement = settlement
        self.store = settlement.store
        self._clock = clock
        self.rows_per_endpoint = self.ROWS_PER_ENDPOINT if rows_per_endpoint is None else rows_per_endpoint
