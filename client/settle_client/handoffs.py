"""Hand-offs for agents: receive the oldest parked one, settle it, look it up; an agent loop.

:meth:`Handoffs.receive` is Settle's leased receive: it claims the oldest parked hand-off no one holds
for a lease, so agents sharing an endpoint split the work; a settlement made through the received
hand-off carries the lease token and is fenced by it. :meth:`Handoffs.watch` uses it by default: it
renews the lease while the loop body runs and releases it when the body raises (or the loop stops) with
the hand-off unsettled; a body that returns without settling leaves the lease to run out, so the
hand-off comes back (to any agent) one lease later.

``next`` is the non-claiming, oldest-first read (NimBus-compatible): ``watch(leased=False)`` uses it
and waits ``revisit_seconds`` before handing out again the very hand-off it handed out last and that
was not settled through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

from pydantic import PrivateAttr

from settle_client._calls import Call, Requests
from settle_client._core import AsyncPart, Part, operation
from settle_client.errors import Conflict, NotFound, SettleError, TransportFailure, Unavailable
from settle_client.models import Coordinates, HandoffView, SettlementAccepted
from settle_client.retry import RetryPolicy

T = TypeVar("T")

# The server holds ``next`` at most 20 s (handoff.functions.MAX_WAIT_SECONDS); a longer wait is clamped there.
DEFAULT_WAIT_SECONDS = 20.0
DEFAULT_REVISIT_SECONDS = 5.0
# Leased receive: the server's default lease (5 min; 10 s to 1 h), renewed every third of it.
DEFAULT_LEASE_SECONDS = 300.0


class _Received(HandoffView):
    """What a received hand-off of either client builds: its settlement, lease renewal and release calls
    (fenced by its lease when it has one), and whether it was settled."""

    _settled: bool = PrivateAttr(default=False)

    @property
    def settled(self) -> bool:
        """True once :meth:`complete` or :meth:`fail` was accepted."""
        return self._settled

    def _completion(
        self, requests: Requests, result: Any, settled_by: str | None
    ) -> Call[SettlementAccepted]:
        lease_token = self.lease.token if self.lease else None
        return requests.complete(
            self.endpoint_id, self.coordinates, result=result, settled_by=settled_by, lease_token=lease_token
        )

    def _failure(
        self, requests: Requests, error_text: str, error_type: str | None, settled_by: str | None
    ) -> Call[SettlementAccepted]:
        lease_token = self.lease.token if self.lease else None
        return requests.fail(
            self.endpoint_id,
            self.coordinates,
            error_text,
            error_type=error_type,
            settled_by=settled_by,
            lease_token=lease_token,
        )

    def _accepted(self, accepted: SettlementAccepted) -> SettlementAccepted:
        self._settled = True
        return accepted

    def _leasing(self, requests: Requests, action: str, lease_seconds: float | None) -> Call[dict[str, Any]]:
        if self.lease is None:
            raise RuntimeError("this hand-off was not received with a lease")
        return requests.lease(
            self.endpoint_id, action, self.coordinates.event_id, self.lease.token, lease_seconds
        )

    def _renewed(self, answer: dict[str, Any]) -> datetime:
        assert self.lease is not None
        self.lease = self.lease.model_copy(update={"expires_at": datetime.fromisoformat(answer["expiresAt"])})
        return self.lease.expires_at


class Handoff(_Received):
    """A parked hand-off, settled with :meth:`complete` or :meth:`fail`."""

    _handoffs: Handoffs | None = PrivateAttr(default=None)

    def _api(self) -> Handoffs:
        if self._handoffs is None:
            raise RuntimeError("this hand-off was not received through a SettleClient")
        return self._handoffs

    def complete(self, result: Any = None, settled_by: str | None = None) -> SettlementAccepted:
        """Send exactly one HandoffCompletedRequest for it (202). ``result``: any JSON.

        Received with a lease: fenced by it (:class:`LeaseLost` if another agent holds it now)."""
        api = self._api()
        return self._accepted(api.send(self._completion(api.requests, result, settled_by)))

    def fail(
        self, error_text: str, error_type: str | None = None, settled_by: str | None = None
    ) -> SettlementAccepted:
        """Send exactly one HandoffFailedRequest for it (202)."""
        api = self._api()
        return self._accepted(api.send(self._failure(api.requests, error_text, error_type, settled_by)))

    def renew(self, lease_seconds: float | None = None) -> datetime:
        """Extend the lease (received with one); when it now ends. :class:`LeaseLost` if it was lost."""
        api = self._api()
        return self._renewed(api.send(self._leasing(api.requests, "renew", lease_seconds)))

    def release(self) -> None:
        """Give the hand-off back at once (another agent's receive gets it)."""
        api = self._api()
        api.send(self._leasing(api.requests, "release", None))


class AsyncHandoff(_Received):
    """A parked hand-off received through :class:`AsyncSettleClient` (:class:`Handoff`, awaited)."""

    _handoffs: AsyncHandoffs | None = PrivateAttr(default=None)

    def _api(self) -> AsyncHandoffs:
        if self._handoffs is None:
            raise RuntimeError("this hand-off was not received through an AsyncSettleClient")
        return self._handoffs

    async def complete(self, result: Any = None, settled_by: str | None = None) -> SettlementAccepted:
        api = self._api()
        return self._accepted(await api.send(self._completion(api.requests, result, settled_by)))

    async def fail(
        self, error_text: str, error_type: str | None = None, settled_by: str | None = None
    ) -> SettlementAccepted:
        api = self._api()
        return self._accepted(await api.send(self._failure(api.requests, error_text, error_type, settled_by)))

    async def renew(self, lease_seconds: float | None = None) -> datetime:
        api = self._api()
        return self._renewed(await api.send(self._leasing(api.requests, "renew", lease_seconds)))

    async def release(self) -> None:
        api = self._api()
        await api.send(self._leasing(api.requests, "release", None))


CoordinatesLike = Coordinates | Mapping[str, Any]


def _ident(handoff: HandoffView) -> tuple[str, str | None]:
    return handoff.coordinates.event_id, handoff.coordinates.message_id


class _Settling:
    """What both clients' ``handoffs`` share: settling by coordinates, each call built once."""

    requests: Requests

    complete = operation(Requests.complete)
    fail = operation(Requests.fail)
    renew_lease = operation(Requests.renew_lease)
    release_lease = operation(Requests.release_lease)


class Handoffs(_Settling, Part):
    """``client.handoffs``: receive, look up and settle parked hand-offs."""

    def _bind(self, handoff: Handoff | None) -> Handoff | None:
        if handoff is not None:
            handoff._handoffs = self
        return handoff

    def next(
        self, endpoint: str, event_types: Iterable[str] | None = None, wait_seconds: float = 0
    ) -> Handoff | None:
        """The oldest parked hand-off of ``endpoint`` (of one of ``event_types``), waiting up to
        ``wait_seconds`` (at most 20) for one; ``None`` when there is none. Does not claim it."""
        call = self.requests.next_handoff(
            endpoint, Handoff, event_types=event_types, wait_seconds=wait_seconds
        )
        return self._bind(self.send(call))

    def receive(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        wait_seconds: float = 0,
        *,
        lease_seconds: float | None = None,
    ) -> Handoff | None:
        """Lease the oldest parked hand-off of ``endpoint`` no one holds (waiting up to ``wait_seconds``),
        or ``None``. Settle it through the returned hand-off (fenced by its lease), renew or release it."""
        call = self.requests.receive_handoff(
            endpoint, Handoff, event_types=event_types, wait_seconds=wait_seconds, lease_seconds=lease_seconds
        )
        return self._bind(self.send(call))

    def job(self, endpoint: str, job_id: str) -> Handoff | None:
        """The parked hand-off carrying external job id ``job_id``, or ``None``."""
        return self._bind(self.send(self.requests.job(endpoint, job_id, Handoff)))

    def watch(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        *,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        stop: threading.Event | None = None,
        revisit_seconds: float = DEFAULT_REVISIT_SECONDS,
        leased: bool = True,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Iterator[Handoff]:
        """Yield parked hand-offs as they come, long-polling ``wait_seconds`` at a time.

        ``leased`` (default): each hand-off is leased to this agent (agents sharing the endpoint never
        get the same one); the lease is renewed while the loop body runs, released if the body raises
        or the loop stops with it unsettled. ``leased=False``: the non-claiming ``next``.

        Stops cleanly when the loop body breaks, or when ``stop`` is set (noticed when the current
        poll returns, so within ``wait_seconds``). While Settle is unavailable it backs off and goes on.
        """
        stop = stop or threading.Event()
        types = list(event_types) if event_types is not None else None
        watching = _Watching(self._client.retry, revisit_seconds=revisit_seconds, leased=leased)
        while not stop.is_set():
            try:
                if leased:
                    handoff = self.receive(endpoint, types, wait_seconds, lease_seconds=lease_seconds)
                else:
                    handoff = self.next(endpoint, types, wait_seconds)
            except (Unavailable, TransportFailure):
                if stop.wait(watching.unavailable()):
                    return
                continue
            pause = watching.polled(handoff, stopping=stop.is_set())
            if handoff is None or pause is not None:
                if pause and stop.wait(pause):
                    return
                continue
            done, renewer = threading.Event(), None
            if leased:
                renewer = threading.Thread(
                    target=_renew_until,
                    args=(handoff, done, lease_seconds),
                    name="settle-lease-renewal",
                    daemon=True,
                )
                renewer.start()
            body_returned = False
            try:
                yield handoff
                body_returned = True
            finally:
                done.set()
                if renewer is not None:
                    renewer.join()
                if leased and not body_returned and not handoff.settled:
                    # The body raised (or the loop stopped) with the hand-off in hand: give it back now.
                    with contextlib.suppress(SettleError):
                        handoff.release()
            watching.handed_out(handoff)


def _renew_until(handoff: Handoff, done: threading.Event, lease_seconds: float) -> None:
    """Renew ``handoff``'s lease every third of it until ``done`` (or the lease is lost / settled)."""
    while not done.wait(max(1.0, lease_seconds / 3)) and not handoff.settled:
        try:
            handoff.renew(lease_seconds)
        except SettleError as error:
            if not _renewable(error):
                return


def _renewable(error: SettleError) -> bool:
    """Go on renewing after ``error``? Not when the lease is lost or the hand-off settled or projected
    away (409, 404): nothing more to hold. Settle unavailable: try again at the next third."""
    return not isinstance(error, Conflict | NotFound)


class _Watching:
    """The decisions of a watch loop, the same for both clients: the pause after each poll."""

    def __init__(self, retry: RetryPolicy, *, revisit_seconds: float, leased: bool) -> None:
        self._retry = retry
        self._revisit_seconds = revisit_seconds
        self._leased = leased
        self._failures = 0
        self._unsettled: tuple[str, str | None] | None = None

    def unavailable(self) -> float:
        """Settle could not be asked: the pause before polling again (backing off)."""
        self._failures += 1
        return self._retry.backoff_for(min(self._failures, 8))

    def polled(self, handoff: HandoffView | None, *, stopping: bool) -> float | None:
        """After a poll answered: ``None`` to hand ``handoff`` out now, else the pause before polling
        again: none when nothing came (or the loop stops: a leased hand-off is still handed out, so its
        lease is given back), ``revisit_seconds`` when, without a lease, it is the hand-off handed out
        last and left unsettled."""
        self._failures = 0
        if handoff is None or (stopping and not self._leased):
            return 0.0
        if not self._leased and _ident(handoff) == self._unsettled:
            self._unsettled = None
            return self._revisit_seconds
        return None

    def handed_out(self, handoff: _Received) -> None:
        if not self._leased:
            self._unsettled = None if handoff.settled else _ident(handoff)


class AsyncHandoffs(_Settling, AsyncPart):
    """``client.handoffs`` of :class:`AsyncSettleClient`."""

    def _bind(self, handoff: AsyncHandoff | None) -> AsyncHandoff | None:
        if handoff is not None:
            handoff._handoffs = self
        return handoff

    async def next(
        self, endpoint: str, event_types: Iterable[str] | None = None, wait_seconds: float = 0
    ) -> AsyncHandoff | None:
        call = self.requests.next_handoff(
            endpoint, AsyncHandoff, event_types=event_types, wait_seconds=wait_seconds
        )
        return self._bind(await self.send(call))

    async def receive(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        wait_seconds: float = 0,
        *,
        lease_seconds: float | None = None,
    ) -> AsyncHandoff | None:
        call = self.requests.receive_handoff(
            endpoint,
            AsyncHandoff,
            event_types=event_types,
            wait_seconds=wait_seconds,
            lease_seconds=lease_seconds,
        )
        return self._bind(await self.send(call))

    async def job(self, endpoint: str, job_id: str) -> AsyncHandoff | None:
        return self._bind(await self.send(self.requests.job(endpoint, job_id, AsyncHandoff)))

    async def watch(
        self,
        endpoint: str,
        event_types: Iterable[str] | None = None,
        *,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        stop: asyncio.Event | None = None,
        revisit_seconds: float = DEFAULT_REVISIT_SECONDS,
        leased: bool = True,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> AsyncIterator[AsyncHandoff]:
        """As :meth:`Handoffs.watch`; cancelling the task that iterates also stops it (at once)."""
        stop = stop or asyncio.Event()
        types = list(event_types) if event_types is not None else None
        watching = _Watching(self._client.retry, revisit_seconds=revisit_seconds, leased=leased)
        while not stop.is_set():
            try:
                if leased:
                    handoff = await self.receive(endpoint, types, wait_seconds, lease_seconds=lease_seconds)
                else:
                    handoff = await self.next(endpoint, types, wait_seconds)
            except (Unavailable, TransportFailure):
                if await _wait(stop, watching.unavailable()):
                    return
                continue
            pause = watching.polled(handoff, stopping=stop.is_set())
            if handoff is None or pause is not None:
                if pause and await _wait(stop, pause):
                    return
                continue
            renewer = asyncio.ensure_future(_renew_async(handoff, lease_seconds)) if leased else None
            body_returned = False
            try:
                yield handoff
                body_returned = True
            finally:
                if renewer is not None:
                    renewer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await renewer
                if leased and not body_returned and not handoff.settled:
                    with contextlib.suppress(SettleError):
                        await handoff.release()
            watching.handed_out(handoff)


async def _renew_async(handoff: AsyncHandoff, lease_seconds: float) -> None:
    while True:
        await asyncio.sleep(max(1.0, lease_seconds / 3))
        if handoff.settled:
            return
        try:
            await handoff.renew(lease_seconds)
        except SettleError as error:
            if not _renewable(error):
                return


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when it was."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


class Events(Part):
    """``client.events``: an endpoint's event row with its history and audits."""

    get = operation(Requests.event)


class AsyncEvents(AsyncPart):
    get = operation(Requests.event)
