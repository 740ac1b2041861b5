"""How the client proves who it is: a function key (``x-functions-key``) or a bearer token.

A token comes from any object with ``get_token(*scopes)`` returning ``.token`` and ``.expires_on``
(epoch seconds): azure-core's ``TokenCredential`` (e.g. ``azure.identity.DefaultAzureCredential``) or its
async twin. The client never imports azure-core; install ``settle-client[azure]`` for the types.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any, Protocol

# Renew this long before the token expires, so a request never leaves with a token about to lapse.
_REFRESH_MARGIN_S = 300


class AccessTokenLike(Protocol):
    token: str
    expires_on: int


class TokenCredentialLike(Protocol):
    def get_token(self, *scopes: str, **kwargs: Any) -> Any: ...


class Auth:
    """The auth headers of every request (thread-safe; tokens cached until shortly before expiry)."""

    def __init__(
        self,
        *,
        function_key: str | None = None,
        credential: TokenCredentialLike | None = None,
        token_scope: str | None = None,
    ) -> None:
        if function_key is not None and credential is not None:
            raise ValueError("give function_key or credential, not both")
        if credential is not None and not token_scope:
            raise ValueError(
                "token_scope is required with a credential (the App ID URI of the function app's "
                "Entra registration, e.g. 'api://<client-id>/.default')"
            )
        if credential is not None and not callable(getattr(credential, "get_token", None)):
            raise TypeError("credential must have get_token(*scopes) (an azure-core TokenCredential)")
        self._function_key = function_key
        self._credential = credential
        self._scope = token_scope or ""
        self._token: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self._async_credential = credential is not None and inspect.iscoroutinefunction(credential.get_token)

    def _cached(self) -> str | None:
        if self._token is not None and self._token[1] - _REFRESH_MARGIN_S > time.time():
            return self._token[0]
        return None

    def _keep(self, access: Any) -> str:
        token, expires_on = str(access.token), float(access.expires_on)
        self._token = (token, expires_on)
        return token

    def headers(self) -> dict[str, str]:
        if self._function_key is not None:
            return {"x-functions-key": self._function_key}
        if self._credential is None:
            return {}
        if self._async_credential:
            raise TypeError("an async credential needs AsyncSettleClient")
        with self._lock:
            token = self._cached() or self._keep(self._credential.get_token(self._scope))
        return {"Authorization": f"Bearer {token}"}

    async def aheaders(self) -> dict[str, str]:
        if self._credential is None or self._function_key is not None:
            return self.headers()
        token = self._cached()
        if token is None:
            if self._async_credential:
                access = await self._credential.get_token(self._scope)
            else:  # a sync credential may do network I/O: keep it off the event loop
                access = await asyncio.to_thread(self._credential.get_token, self._scope)
            token = self._keep(access)
        return {"Authorization": f"Bearer {token}"}
