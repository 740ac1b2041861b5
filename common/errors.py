"""Typed errors a caller can act on.

Inside the code they are exceptions; at the HTTP edge each becomes an ``application/problem+json``
answer whose ``type`` is stable (``urn:settle:problem:<slug>``) and, for bad input, names the field.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SettleError(Exception):
    """Base of every error Settle raises on purpose."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal-error"
    title: ClassVar[str] = "Internal error"

    def __init_subclass__(
        cls, *, status: int | None = None, slug: str | None = None, title: str | None = None, **kw: Any
    ) -> None:
        """A subclass names its problem type in its class line: ``class Gone(SettleError, status=410,
        slug="gone", title="Gone")``; what it leaves out it inherits."""
        super().__init_subclass__(**kw)
        if status is not None:
            cls.status = status
        if slug is not None:
            cls.slug = slug
        if title is not None:
            cls.title = title

    def __init__(self, detail: str, *, field: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.extra = extra

    @property
    def headers(self) -> dict[str, str]:
        """Extra HTTP headers of the problem answer."""
        return {}

    @property
    def type_uri(self) -> str:
        return f"urn:settle:problem:{self.slug}"

    def to_problem(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.type_uri,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.field is not None:
            body["field"] = self.field
        body.update(self.extra)
        return body


class InvalidInput(SettleError, status=400, slug="invalid-input", title="Invalid input"):
    """The request is not what the operation accepts (400)."""


class InvalidJson(InvalidInput, slug="invalid-json", title="The body is not valid JSON"):
    pass


class NestedTooDeep(InvalidInput, slug="nested-too-deep", title="The body nests too deeply"):
    """Valid JSON that nests arrays and objects deeper than Settle parses (``common.http.MAX_JSON_DEPTH``):
    a 400 naming the limit (``limit``), not "not valid JSON"."""


class KeyTooLong(InvalidInput, slug="key-too-long", title="Key too long for Table Storage"):
    pass


class NotFound(SettleError, status=404, slug="not-found", title="Not found"):
    pass


class Conflict(SettleError, status=409, slug="conflict", title="Conflict"):
    """The request is valid but the current state does not allow it (409)."""


class LockLost(Conflict, slug="lock-lost", title="The lock is no longer held by this token"):
    pass


class LengthRequired(SettleError, status=411, slug="length-required", title="Content-Length required"):
    """A body sent without Content-Length (chunked): Azure's Functions host drops such a body before
    Settle sees it, so the request is refused plainly instead of as "no body" (411)."""


class PayloadTooLarge(SettleError, status=413, slug="payload-too-large", title="Payload too large"):
    pass


class Unavailable(SettleError, status=503, slug="unavailable", title="A dependency is unavailable"):
    """A dependency (storage, Service Bus) is unreachable or throttling; retry later (503).

    ``retry_after``: seconds the caller should wait (sent as ``Retry-After`` and ``retryAfter``).
    """

    def __init__(self, detail: str, *, field: str | None = None, retry_after: int = 1, **extra: Any) -> None:
        super().__init__(detail, field=field, retryAfter=max(1, int(retry_after)), **extra)
        self.retry_after = max(1, int(retry_after))

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class LayoutNotReady(Unavailable):
    """The recorded shard layout cannot be routed by right now (a change about to take effect, an account
    this instance lacks: common/layouts.py). Transient like a storage fault: ask again, never poison."""


class StorageAnswerUnreadable(Exception):
    """Storage answered 2xx with a body that is not UTF-8 (``common.tables.StorageAnswerCheck``): what it
    said cannot be known, so it is transient (ask again), never read as an empty or partial answer."""


class StorageTableMissing(Exception):
    """Storage answered 404 TableNotFound: one of Settle's tables is gone (deleted by hand). Not "no such
    record": storage could not say, so nothing is answered as absent (503 naming the table; retried)."""

    def __init__(self, table: str) -> None:
        super().__init__(f"Settle's table {table!r} does not exist in storage (deleted?).")
        self.table = table


SERVER_BUSY = "ServerBusy"


def is_refused_unreceived(exc: BaseException) -> bool:
    """Storage refused the request before receiving it: 503 with error code ``ServerBusy`` (the account
    or a partition over its scalability target). Azure Storage's common REST API error codes define it as
    "The server is currently unable to receive requests. Please retry your request." (and "Operations per
    second is over the account limit."), and Storage Analytics bills no 503 ("ThrottlingError ... Billable:
    No") while it bills a timed-out 500: the request was not applied, so asking again needs no read-back.

    Anything else that is transient may have been applied (500 ``OperationTimedOut``: "could not be
    completed within the permitted time"; a lost connection; a 503 without storage's own code, from
    something in between): those outcomes stay open until the head is read back (``StateStore._write``)."""
    from azure.core.exceptions import HttpResponseError

    if not isinstance(exc, HttpResponseError) or exc.status_code != 503:
        return False
    code = getattr(exc, "error_code", None)
    response = getattr(exc, "response", None)
    if code is None and response is not None:
        code = response.headers.get("x-ms-error-code")
    return str(getattr(code, "value", code)) == SERVER_BUSY  # the Tables SDK gives an enum (TableErrorCode)


def is_unreadable_answer(exc: BaseException) -> bool:
    """An answer that arrived but could not be read: cut short or undecodable. Transient (ask again).

    The Tables SDK raises an undecodable success answer as a plain ``HttpResponseError`` carrying the
    answer's 2xx status, caused by the ``DecodeError`` (or ``IncompleteReadError``); so the cause chain is
    searched, and a success status raised as an error counts too.
    """
    from azure.core.exceptions import DecodeError, HttpResponseError

    seen: BaseException | None = exc
    for _ in range(8):  # causes are short; a cycle must not loop forever
        if seen is None:
            return False
        if isinstance(seen, DecodeError | StorageAnswerUnreadable):  # IncompleteReadError is one too
            return True
        if (
            isinstance(seen, HttpResponseError)
            and seen.status_code is not None
            and 200 <= seen.status_code < 300
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_transient_storage_fault(exc: BaseException) -> bool:
    """A storage or network fault worth asking again: unreachable, throttled, failing server-side, an
    answer that could not be read, a token-endpoint hiccup, or storage refusing Settle's identity (401/403:
    a role assignment missing or not yet propagated, which a deployment fixes, never the request).

    The one rule for every caller that retries instead of giving up (the resolver, poison counting)."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(
        exc,
        ServiceRequestError
        | ServiceResponseError
        | ClientAuthenticationError
        | TimeoutError
        | ConnectionError,
    ):
        return True
    if is_unreadable_answer(exc):  # IncompleteReadError and DecodeError, an undecodable 200 included
        return True
    if isinstance(exc, StorageTableMissing | LayoutNotReady):  # a deployment's state, never the message's
        return True
    if isinstance(exc, HttpResponseError):
        code = exc.status_code
        return code is None or code >= 500 or code in (401, 403, 408, 429)
    return False
