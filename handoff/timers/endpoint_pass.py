"""What the timer's passes over every endpoint (the sweeper, the reconciler) are built on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from handoff.settlement.settler import SettlementService


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

    @staticmethod
    def each_endpoint[T](
        items: Iterable[T],
        work: Callable[[T], None],
        *,
        endpoint_of: Callable[[T], str],
        errors: dict[str, dict[str, str]],
        log: logging.Logger,
        doing: str,
    ) -> None:
        """``work`` on each endpoint; one that fails is logged and named in ``errors``, the others go on."""
        for item in items:
            try:
                work(item)
            except Exception as exc:
                endpoint_id = endpoint_of(item)
                log.exception("%s endpoint %s failed; the others go on", doing, endpoint_id)
                errors.setdefault(endpoint_id, {})["*"] = f"{type(exc).__name__}: {exc}"
