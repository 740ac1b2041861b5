"""What the sync and async clients share: settings, and reading an answer into a result or an error."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, TypeVar

import httpx

from settle_client._calls import Call, Requests
from settle_client._version import VERSION
from settle_client.auth import Auth, TokenCredentialLike
from settle_client.errors import NOT_FOUND, TransportFailure, error_from_response, problem_of
from settle_client.models import Handler
from settle_client.retry import NOT_SENT, RetryPolicy

T = TypeVar("T")

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


class ClientBase:
    """Settings and answer handling of :class:`SettleClient` and :class:`AsyncSettleClient`."""

    def __init__(
        self,
        base_url: str,
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

    def timeout_for(self, call: Call[Any]) -> httpx.Timeout:
        t = self.timeout
        if call.wait <= 0 or t.read is None:
            return t
        return httpx.Timeout(connect=t.connect, read=t.read + call.wait, write=t.write, pool=t.pool)

    def request_kwargs(self, call: Call[Any], auth_headers: dict[str, str]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"headers": auth_headers, "timeout": self.timeout_for(call)}
        if call.body is not None:
            kwargs["json"] = call.body
        if call.params:
            kwargs["params"] = list(call.params)
        return kwargs


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
