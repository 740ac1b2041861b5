"""The client's sans-I/O core: what the sync and async clients share, written once.

A :class:`~settle_client._calls.Call` (built in :mod:`settle_client._calls`) says what to send and how to
read the answer. Here it becomes an ``httpx.Request`` (ids in the query string, a JSON body with its
Content-Length, never chunked), and an :class:`Exchange` decides after each attempt what comes next: the
result, the typed error, or a wait before sending again. No I/O happens here: :class:`SettleClient` and
:class:`AsyncSettleClient` only send the requests it builds and sleep the waits it decides, as ``h11``
leaves the socket to its caller, so the two cannot drift apart and each decision is tested without a server.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypedDict, TypeVar, overload
from urllib.parse import quote

import httpx

from settle_client._calls import Call, Page, Pages, Requests
from settle_client._version import VERSION
from settle_client.address import default_url
from settle_client.auth import Auth, TokenCredentialLike
from settle_client.errors import NOT_FOUND, TransportFailure, error_from_response, problem_of, retry_after_of
from settle_client.models import Handler
from settle_client.retry import NOT_SENT, RetryPolicy, may_retry_answer, may_retry_transport

log = logging.getLogger("settle_client")

T = TypeVar("T")
P = ParamSpec("P")

DEFAULT_TIMEOUT_S = 30.0
# processing(): a crashed worker's item is free again this soon; the lock is extended meanwhile.
DEFAULT_LOCK_SECONDS = 60

HandlerLike = Handler | str | Mapping[str, Any]


def as_handler(value: HandlerLike | None) -> Handler | None:
    if value is None or isinstance(value, Handler):
        return value
    if isinstance(value, str):
        return Handler(key=value)
    return Handler.model_validate(value)


class ClientSettings(TypedDict, total=False):
    """What both clients take besides ``base_url`` and their transport (see :class:`SettleClient`)."""

    function_key: str | None
    credential: TokenCredentialLike | None
    token_scope: str | None
    handler: HandlerLike | None
    timeout: float | httpx.Timeout
    retry: RetryPolicy | None
    agent_id: str | None
    route_prefix: str


@dataclass(frozen=True)
class Retry:
    """Send the call again after ``delay`` seconds."""

    delay: float


class Sends(Protocol):
    """Sends a call and returns its result: a client, or a part of one (``client.operator``)."""

    def send(self, call: Call[T]) -> T: ...


class SendsAsync(Protocol):
    def send(self, call: Call[T]) -> Coroutine[Any, Any, T]: ...


class Sender(Sends, Protocol):
    """What the parts built on a client need of it (so they need not import the client)."""

    requests: Requests
    retry: RetryPolicy


class AsyncSender(SendsAsync, Protocol):
    requests: Requests
    retry: RetryPolicy


S = TypeVar("S", Sender, AsyncSender)


class _PartOf(Generic[S]):
    def __init__(self, client: S) -> None:
        self._client: S = client
        self.requests = client.requests


class Part(_PartOf[Sender]):
    """A part of a client (``client.handoffs``, ``client.events``, ``client.operator``): it builds its
    calls with the client's :class:`Requests` and sends them through the client."""

    def send(self, call: Call[T]) -> T:
        return self._client.send(call)


class AsyncPart(_PartOf[AsyncSender]):
    """A :class:`Part` of :class:`AsyncSettleClient` (its calls awaited)."""

    async def send(self, call: Call[T]) -> T:
        return await self._client.send(call)


class _OnBothClients:
    """A method both clients get from one builder method (its signature and docstring); ``via`` names the
    client attribute holding the builder."""

    def __init__(self, build: Callable[..., Any], via: str) -> None:
        self.build = build
        self.via = via
        self.__doc__ = build.__doc__
        signature = inspect.signature(build)  # without its first parameter, the builder
        self.signature = signature.replace(parameters=list(signature.parameters.values())[1:])

    def _bound(self, method: Callable[..., Any]) -> Callable[..., Any]:
        functools.update_wrapper(method, self.build)
        del method.__wrapped__  # type: ignore[attr-defined]
        method.__signature__ = self.signature  # type: ignore[attr-defined]
        return method


class operation(_OnBothClients, Generic[P, T]):  # noqa: N801 (named like the decorators it stands with)
    """A method that sends one call: ``get = operation(Requests.get)`` gives ``SettleClient.get(key)`` and
    ``AsyncSettleClient.get(key)`` (awaited), both sending the call the builder returns."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]], *, via: str = "requests") -> None:
        super().__init__(build, via)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: SendsAsync, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: Sends, owner: type[Any]) -> Callable[P, T]: ...
    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self
        build, builder = self.build, getattr(client, self.via)
        if inspect.iscoroutinefunction(client.send):

            async def sent_async(*args: Any, **kwargs: Any) -> Any:
                return await client.send(build(builder, *args, **kwargs))

            return self._bound(sent_async)

        def sent(*args: Any, **kwargs: Any) -> Any:
            return client.send(build(builder, *args, **kwargs))

        return self._bound(sent)


class paged(_OnBothClients, Generic[P, T]):  # noqa: N801
    """A listing: ``history = paged(Requests.history)`` gives an iterator of the items (an async one on
    the async client); pages are fetched as the iteration needs them."""

    def __init__(self, build: Callable[Concatenate[Any, P], Pages[T]], *, via: str = "requests") -> None:
        super().__init__(build, via)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, client: SendsAsync, owner: type[Any]) -> Callable[P, AsyncIterator[T]]: ...
    @overload
    def __get__(self, client: Sends, owner: type[Any]) -> Callable[P, Iterator[T]]: ...
    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self
        build, builder = self.build, getattr(client, self.via)
        if inspect.iscoroutinefunction(client.send):

            def listed_async(*args: Any, **kwargs: Any) -> AsyncIterator[T]:
                return _pages_async(client, build(builder, *args, **kwargs))

            return self._bound(listed_async)

        def listed(*args: Any, **kwargs: Any) -> Iterator[T]:
            return read_pages(client, build(builder, *args, **kwargs))

        return self._bound(listed)


def read_pages(client: Sends, pages: Pages[T], seen: Callable[[Page[T]], None] | None = None) -> Iterator[T]:
    """The items of ``pages``, each page sent as the iteration needs it; ``seen`` gets every page (its
    count, where the answer has one)."""
    token: str | None = None
    while not pages.empty:
        page = client.send(pages.page(token))
        if seen is not None:
            seen(page)
        yield from page.items
        token = page.token
        if not token:
            return


async def _pages_async(client: SendsAsync, pages: Pages[T]) -> AsyncIterator[T]:
    token: str | None = None
    while not pages.empty:
        page = await client.send(pages.page(token))
        for item in page.items:
            yield item
        token = page.token
        if not token:
            return


class ClientCore:
    """Settings of :class:`SettleClient` and :class:`AsyncSettleClient`, the exchanges they drive, and the
    state operations both offer (each built once in :class:`Requests`, sent by the client's ``send``)."""

    meta = operation(Requests.meta)
    exists = operation(Requests.exists)
    get = operation(Requests.get)
    lock = operation(Requests.lock)
    extend = operation(Requests.extend)
    set = operation(Requests.set)
    upsert = operation(Requests.upsert)
    release = operation(Requests.release)
    history = paged(Requests.history)
    query = paged(Requests.query)

    def __init__(
        self,
        base_url: str | None = None,
        *,
        function_key: str | None = None,
        credential: TokenCredentialLike | None = None,
        token_scope: str | None = None,
        handler: HandlerLike | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        agent_id: str | None = None,
        route_prefix: str = "api",
    ) -> None:
        if base_url is None:
            base_url = default_url()
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.auth = Auth(function_key=function_key, credential=credential, token_scope=token_scope)
        self.requests = Requests(prefix=route_prefix, handler=as_handler(handler))
        self.default_headers = {"User-Agent": f"settle-client/{VERSION}"}
        if agent_id:
            self.default_headers["x-agent-id"] = agent_id  # the default settledBy of settlements
        self._rng = random.Random()

    def lock_seconds_for(self, given: int | None) -> int:
        """The lock length of a processing block: ``given``, else the handler's ``lockSeconds`` option
        (the client's settings), else :data:`DEFAULT_LOCK_SECONDS`. The block always sends it, since
        its extensions are timed from it."""
        if given is not None:
            return given
        options = self.requests.handler.options if self.requests.handler is not None else {}
        configured = options.get("lockSeconds", options.get("lock_seconds"))
        return configured if isinstance(configured, int) else DEFAULT_LOCK_SECONDS

    def exchange(self, call: Call[T]) -> Exchange[T]:
        return Exchange(self, call)

    def request(
        self, call: Call[Any], auth_headers: Mapping[str, str], *, timeout: httpx.Timeout | None = None
    ) -> httpx.Request:
        """The HTTP request of ``call``. A body is JSON bytes, so it goes with its Content-Length: the
        Functions host hands a chunked body to the app as empty."""
        url = self.base_url + call.path
        if call.params:
            url += "?" + query_string(call.params)
        return httpx.Request(
            call.method,
            url,
            headers={**self.default_headers, **auth_headers},
            json=call.body,
            extensions={"timeout": (timeout or timeout_for(self.timeout, call)).as_dict()},
        )


class Exchange(Generic[T]):
    """One call's attempts: the request of each, and after each the result, the error or a :class:`Retry`.

    ``IDEMPOTENT`` calls are sent again after 429/503 and after any transport failure; ``UNSAFE`` ones
    only when the request provably never left (see :mod:`settle_client.retry`). Waits follow the client's
    :class:`RetryPolicy`, never shorter than a ``Retry-After``.
    """

    def __init__(self, core: ClientCore, call: Call[T]) -> None:
        self.core = core
        self.call = call
        self.attempt = 0

    def request(self, auth_headers: Mapping[str, str]) -> httpx.Request:
        """The next attempt's request."""
        self.attempt += 1
        return self.core.request(self.call, auth_headers)

    def answered(self, response: httpx.Response) -> T | Retry:
        """The call's result (or its typed error, raised), or a wait before the next attempt."""
        call = self.call
        if may_retry_answer(call.safety, response.status_code):
            delay = self.core.retry.delay(
                self.attempt, retry_after=retry_after_of(response), rng=self.core._rng
            )
            if delay is not None:
                log.info("%s %s: %d; retrying in %.2fs", call.method, call.path, response.status_code, delay)
                return Retry(delay)
        return read(call, response)

    def failed(self, exc: httpx.TransportError) -> Retry:
        """The wait before sending again after ``exc``, or :class:`TransportFailure` (raised)."""
        call = self.call
        retryable = may_retry_transport(call.safety, exc)
        delay = self.core.retry.delay(self.attempt, rng=self.core._rng) if retryable else None
        if delay is None:
            raise transport_failure(call, exc) from exc
        log.info("%s %s: %s; retrying in %.2fs", call.method, call.path, type(exc).__name__, delay)
        return Retry(delay)


def query_string(params: tuple[tuple[str, str], ...]) -> str:
    """``name=value&...`` with every reserved character percent-encoded (``+`` as ``%2B``, a space as
    ``%20``), so no id can end the query, start a fragment or change its meaning on the way."""
    return "&".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in params)


def timeout_for(timeout: httpx.Timeout, call: Call[Any]) -> httpx.Timeout:
    """A long poll may be held ``call.wait`` seconds: the read timeout grows by that."""
    if call.wait <= 0 or timeout.read is None:
        return timeout
    return httpx.Timeout(
        connect=timeout.connect, read=timeout.read + call.wait, write=timeout.write, pool=timeout.pool
    )


def read(call: Call[T], response: httpx.Response) -> T:
    """The result of an answer, or the typed error it stands for."""
    if response.is_success:
        return call.parse(response)
    if (
        response.status_code == 404
        and call.none_if_not_found
        and problem_of(response).get("type") == NOT_FOUND
    ):
        return call.parse(response)
    raise error_from_response(response)


def transport_failure(call: Call[Any], exc: httpx.TransportError) -> TransportFailure:
    sent = not isinstance(exc, NOT_SENT)
    what = "no answer (it may have been applied)" if sent else "could not be sent"
    return TransportFailure(
        f"{call.method} {call.path}: {what}: {type(exc).__name__}: {exc}", maybe_applied=sent
    )
