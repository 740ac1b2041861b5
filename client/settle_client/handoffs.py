"""Hand-offs for agents: receive the oldest parked one, settle it, look it up; an agent loop.

``next`` is Settle's non-claiming, oldest-first read: a hand-off an agent leaves unsettled comes back
on the next read. :meth:`Handoffs.watch` therefore waits ``revisit_seconds`` before handing out again
the very hand-off it handed out last and that was not settled through it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import PrivateAttr

from settle_client.errors import TransportFailure, Unavailable
from settle_client.models import Coordinates, Event, HandoffView, SettlementAccepted

if TYPE_CHECKING:
    from settle_client.aio import AsyncSettleClient
    from settle_client.client import SettleClient

# The server holds ``next`` at most 20 s (handoff.models.MAX_WAIT_SECONDS); a longer wait is clamped there.
DEFAULT_WAIT_SECONDS = 20.0
DEFAULT_REVISIT_SECONDS = 5.0


class Handoff(HandoffView):
    """A parked hand-off, settled with :meth:`complete` or :meth:`fail`."""

    _handoffs: Handoffs | None = PrivateAttr(default=None)
    _settled: bool = PrivateAttr(default=False)

    @property
    def settled(self) -> bool:
        """True once :meth:`complete` or :meth:`fail` was accepted."""
        return self._settled

    def _api(self) -> Handoffs:
        if self._handoffs is None:
            raise RuntimeError("this hand-off was not received through a SettleClient")
        return self._handoffs

    def complete(self, result: Any = None, settled_by: str | None = None) -> SettlementAccepted:
        """Send exactly one HandoffCompletedRequest for it (202). ``result``: any JSON."""
        accepted = self._api().complete(
            self.endpoint_id, self.coordinates, result=result, settled_by=settled_by
        )
        self._settled = True
        return accepted

    def fail(
        self, error_text: str, error_type: str | None = None, settled_by: str | None = None
    ) -> SettlementAccepted:
        """Send exactly one HandoffFailedRequest for it (202)."""
        accepted = self._api().fail(
            self.endpoint_id, self.coordinates, error_text, error_type=error_type, settled_by=settled_by
        )
        self._settled = True
        return accepted


class AsyncHandoff(HandoffView):
    """A parked hand-off received through :class:`AsyncSettleClient`."""

    _handoffs: AsyncHandoffs | None = PrivateAttr(default=None)
    _settled: bool = PrivateAttr(default=False)

    @property
    def settled(self) -> bool:
        return self._settled

    def _api(self) -> AsyncHandoffs:
        if self._handoffs is None:
            raise RuntimeError("this hand-off was not received through an AsyncSettleClient")
        return self._handoffs

    async def complete(self, result: Any = None, settled_by: str | None = None) -> SettlementAccepted:
        accepted = await self._api().complete(
            self.endpoint_id, self.coordinates, result=result, settled_by=settled_by
        )
        self._settled = True
        return accepted

    async def fail(
        self, error_text: str, error_type: str | None = None, settled_by: str | None = None
    ) -> SettlementAccepted:
        accepted = await self._api().fail(
            self.endpoint_id, self.coordinates, error_text, error_type=error_type, settled_by=settled_by
        )
        self._settled = True
        return accepted


CoordinatesLike = Coordinates | Mapping[str, Any]


def _ident(handoff: HandoffView) -> tuple[str, str | None]:
    return handoff.coordinates.event_id, handoff.coordinates.message_id


class Handoffs:
    """``client.handoffs``: receive, look up and settle parked hand-offs."""

    def __init__(self, client: SettleClient) -> None:
        self._client = client

    def _bind(self, handoff: Handoff | None) -> Handoff | None:
        if handoff is not None:
            handoff._handoffs = self
        return handoff

    def next(
        self, endpoint: str, event_types: Iterable[str] | None = None, wait_seconds: float = 0
    ) -> Handoff | None:
        """The oldest parked hand-off of ``endpoint`` (of one of ``event_types``), waiting up to
        ``wait_seconds`` (at most 20) for one; ``None`` when there is none. Does not claim it."""
        call = self._client.requests.next_handoff(
            endpoint, Handoff, event_types=event_types, wait_seconds=wait_seconds
        )
        return self._bind(self._client.send(call))

    def job(self, endpoint: str, job_id: str) -> Handoff | None:
        """The parked hand-off carrying external job id ``job_id``, or ``None``."""
        return self._bind(self._client.send(self._client.requests.job(endpoint, job_id, Handoff)))

    def complete(
        self,
        endpoint: str,
        coordinates: CoordinatesLike,
        *,
        result: Any = None,
        settled_by: str | None = None,
    ) -> SettlementAccepted:
        """Complete a parked hand-off by its coordinates (409 :class:`Conflict` if it is not parked)."""
        call = self._client.requests.complete(endpoint, coordinates, result=result, settled_by=settled_by)
        return self._client.send(call)

    def fail(
        self,
        endpoint: str,
        coordinates: CoordinatesLike,
        error_text: str,
        *,
        error_type: str | None = None,
        settled_by: str | None = None,
    ) -> SettlementAccepted:
        """Fail a parked hand-off by its coordinates."""
        call = self._client.requests.fail(
            endpoint, coordinates, error_text=error_text, error_type=error_type, settled_by=settled_by
        )
        return self._client.send(call)

    def watch(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        *,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        stop: threading.Event | None = None,
        revisit_seconds: float = DEFAULT_REVISIT_SECONDS,
    ) -> Iterator[Handoff]:
        """Yield parked hand-offs as they come, long-polling ``wait_seconds`` at a time.

        Stops cleanly when the loop body breaks, or when ``stop`` is set (noticed when the current
        poll returns, so within ``wait_seconds``). While Settle is unavailable it backs off and goes on.
        """
        stop = stop or threading.Event()
        types = list(event_types) if event_types is not None else None
        unsettled: tuple[str, str | None] | None = None
        failures = 0
        while not stop.is_set():
            try:
                handoff = self.next(endpoint, types, wait_seconds)
            except (Unavailable, TransportFailure):
                failures += 1
                if stop.wait(self._client.retry.backoff_for(min(failures, 8))):
                    return
                continue
            failures = 0
            if handoff is None or stop.is_set():
                continue
            if _ident(handoff) == unsettled:
                unsettled = None
                if stop.wait(revisit_seconds):
                    return
                continue
            yield handoff
            unsettled = None if handoff.settled else _ident(handoff)


class AsyncHandoffs:
    """``client.handoffs`` of :class:`AsyncSettleClient`."""

    def __init__(self, client: AsyncSettleClient) -> None:
        self._client = client

    def _bind(self, handoff: AsyncHandoff | None) -> AsyncHandoff | None:
        if handoff is not None:
            handoff._handoffs = self
        return handoff

    async def next(
        self, endpoint: str, event_types: Iterable[str] | None = None, wait_seconds: float = 0
    ) -> AsyncHandoff | None:
        call = self._client.requests.next_handoff(
            endpoint, AsyncHandoff, event_types=event_types, wait_seconds=wait_seconds
        )
        return self._bind(await self._client.send(call))

    async def job(self, endpoint: str, job_id: str) -> AsyncHandoff | None:
        return self._bind(await self._client.send(self._client.requests.job(endpoint, job_id, AsyncHandoff)))

    async def complete(
        self,
        endpoint: str,
        coordinates: CoordinatesLike,
        *,
        result: Any = None,
        settled_by: str | None = None,
    ) -> SettlementAccepted:
        call = self._client.requests.complete(endpoint, coordinates, result=result, settled_by=settled_by)
        return await self._client.send(call)

    async def fail(
        self,
        endpoint: str,
        coordinates: CoordinatesLike,
        error_text: str,
        *,
        error_type: str | None = None,
        settled_by: str | None = None,
    ) -> SettlementAccepted:
        call = self._client.requests.fail(
            endpoint, coordinates, error_text=error_text, error_type=error_type, settled_by=settled_by
        )
        return await self._client.send(call)

    async def watch(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        *,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        stop: asyncio.Event | None = None,
        revisit_seconds: float = DEFAULT_REVISIT_SECONDS,
    ) -> AsyncIterator[AsyncHandoff]:
        """As :meth:`Handoffs.watch`; cancelling the task that iterates also stops it (at once)."""
        stop = stop or asyncio.Event()
        types = list(event_types) if event_types is not None else None
        unsettled: tuple[str, str | None] | None = None
        failures = 0
        while not stop.is_set():
            try:
                handoff = await self.next(endpoint, types, wait_seconds)
            except (Unavailable, TransportFailure):
                failures += 1
                if await _wait(stop, self._client.retry.backoff_for(min(failures, 8))):
                    return
                continue
            failures = 0
            if handoff is None or stop.is_set():
                continue
            if _ident(handoff) == unsettled:
                unsettled = None
                if await _wait(stop, revisit_seconds):
                    return
                continue
            yield handoff
            unsettled = None if handoff.settled else _ident(handoff)


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when it was."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


class Events:
    """``client.events``: an endpoint's event row with its history and audits."""

    def __init__(self, client: SettleClient) -> None:
        self._client = client

    def get(self, endpoint: str, event_id: str) -> Event | None:
        """The event row, or ``None`` when the event is unknown on ``endpoint``."""
        return self._client.send(self._client.requests.event(endpoint, event_id))


class AsyncEvents:
    def __init__(self, client: AsyncSettleClient) -> None:
        self._client = client

    async def get(self, endpoint: str, event_id: str) -> Event | None:
        return await self._client.send(self._client.requests.event(endpoint, event_id))
