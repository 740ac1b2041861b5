"""The table clients' retry policy: the SDK's own, and for a write that must not be sent twice, a resend only
of what storage never received.

A call passes :data:`common.table_options.RESEND_UNRECEIVED_ONLY` when sending it again after it was
applied would write twice or meet its own write (the state store's head writes settle such an answer by
reading the head back). Such a call is sent again only when the failure proves the request was not received:

* 503 ``ServerBusy``: "The server is currently unable to receive requests. Please retry your request."
  (Azure Storage's common REST API error codes; ``common.errors.is_refused_unreceived`` says more);
* a connection that never carried the request (azure-core's ``ServiceRequestError``, which its own retry
  policy calls the errors "when we're fairly sure that the server did not receive the request").

up to :data:`UNRECEIVED_RESENDS` times, after an exponential back-off with jitter; whatever the client's own
retry settings say (the reliability suite turns those off for every call). Every other failure (500
``OperationTimedOut``, a 503 without storage's code, a lost answer) reaches the caller at once. Any other
call keeps the SDK's retry policy unchanged.

Inside an invocation (``common.invocation``) every call, whichever kind, is bounded by what is left of its
deadline: that is the call's total (attempts and back-off together), each attempt's connection and read
timeouts are cut to what is left of it, a back-off never sleeps past it, and once it is spent nothing more
is sent (the call raises the SDK's timeout error, which the HTTP layer answers 503).

This module imports ``azure.data.tables``; ``common.tables`` imports it only when it builds a client.
"""

from __future__ import annotations

import random
from typing import Any

from azure.data.tables._policies import TablesRetryPolicy

from common import invocation
from common.table_options import RESEND_UNRECEIVED_ONLY, refused_unreceived

# How often a write refused unreceived is sent again, and the back-off before the n-th resend: between half
# and all of UNRECEIVED_BACKOFF_S * 2**(n-1) seconds.
UNRECEIVED_RESENDS = 3
UNRECEIVED_BACKOFF_S = 0.1

_OPTION = next(iter(RESEND_UNRECEIVED_ONLY))


class SettleRetryPolicy(TablesRetryPolicy):
    """``TablesRetryPolicy``, but a call marked :data:`~common.table_options.RESEND_UNRECEIVED_ONLY` is sent
    again only when storage never received it (see the module docstring)."""

    def configure_retries(self, options: dict[str, Any]) -> dict[str, Any]:
        settings: dict[str, Any] = super().configure_retries(options)
        left = invocation.remaining()
        if left is not None:  # the whole call, retries included, ends with the invocation's deadline
            settings["timeout"] = min(settings["timeout"], left)
        settings["unreceived_only"] = bool(options.pop(_OPTION, False))
        if settings["unreceived_only"]:
            # Only connect and status retries happen; ``read`` 0 means none after a request went out.
            n = UNRECEIVED_RESENDS
            settings.update(total=n, connect=n, status=n, read=0, resent=0)
        return settings

    def is_retry(self, settings: dict[str, Any], response: Any) -> bool:
        if settings["unreceived_only"]:
            return refused_unreceived(response.http_response)
        return bool(super().is_retry(settings, response))

    def _is_method_retryable(self, settings: dict[str, Any], request: Any, response: Any = None) -> bool:
        if settings["unreceived_only"] and response is None:
            return True  # an exception: ``increment`` decides by its kind
        return bool(super()._is_method_retryable(settings, request, response=response))

    def increment(self, settings: dict[str, Any], response: Any = None, error: Any = None) -> bool:
        if settings["unreceived_only"] and error is not None and not self._is_connection_error(error):
            return False  # it may have been received (and applied): never sent again from here
        return bool(super().increment(settings, response=response, error=error))

    def _configure_timeout(self, request: Any, absolute_timeout: float, is_response_error: bool) -> None:
        # Each attempt's connection and read timeouts are cut to what is left of the call's total (a
        # storage that accepted the connection and went quiet is waited for no longer than that). azure-core
        # does it for the connection alone, and only on a transport with its own ``connection_config``: a
        # table client's (azure-data-tables' TransportWrapper) keeps it on the transport it wraps.
        super()._configure_timeout(request, absolute_timeout, is_response_error)
        options = request.context.options
        config = _connection_config(request.context.transport)
        for option, configured in (("connection_timeout", "timeout"), ("read_timeout", "read_timeout")):
            value = options.get(option) or getattr(config, configured, None)
            if isinstance(value, int | float) and absolute_timeout < value:
                options[option] = absolute_timeout

    def sleep(self, settings: dict[str, Any], transport: Any, response: Any = None) -> None:
        transport = _Bounded(transport)
        if not settings["unreceived_only"]:
            super().sleep(settings, transport, response=response)
            return
        settings["resent"] += 1
        transport.sleep(UNRECEIVED_BACKOFF_S * 2 ** (settings["resent"] - 1) * random.uniform(0.5, 1.0))


def _connection_config(transport: Any) -> Any:
    """The connection settings of ``transport`` or of the transport it wraps (None: not known)."""
    for _ in range(4):
        if transport is None or hasattr(transport, "connection_config"):
            break
        transport = getattr(transport, "_transport", None)
    return getattr(transport, "connection_config", None)


class _Bounded:
    """A transport whose ``sleep`` never passes the invocation's deadline (the attempt after it then finds
    no time left and raises instead of sending)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def sleep(self, seconds: float) -> None:
        left = invocation.remaining()
        self._transport.sleep(seconds if left is None else min(seconds, left))
