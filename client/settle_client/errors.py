"""Every way a Settle call can go wrong, as a typed exception.

A problem+json answer becomes the exception of its ``type`` (``urn:settle:problem:lock-lost`` is
:class:`LockLost`), else of its HTTP status; each carries ``type``, ``status``, ``title``, ``detail`` and
``field`` from the answer. A refused lock is not an HTTP error (the server answers 200 with
``acquired: false``) but :meth:`~settle_client.SettleClient.processing` raises it as
:class:`AlreadyProcessed` or :class:`LockHeld`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

PROBLEM_PREFIX = "urn:settle:problem:"
LOCK_LOST = PROBLEM_PREFIX + "lock-lost"
LEASE_LOST = PROBLEM_PREFIX + "lease-lost"
NOT_FOUND = PROBLEM_PREFIX + "not-found"
# Types the client gives to errors no server answered (a refused lock, a dead connection, a bad key).
CLIENT_PREFIX = "urn:settle:client:"


class SettleError(Exception):
    """Base of every error the client raises.

    ``type``/``title``/``status``/``detail``/``field`` are the problem+json members (``status`` is
    ``None`` when no server answered); ``problem`` is the whole answer body.
    """

    def __init__(
        self,
        detail: str,
        *,
        type: str | None = None,
        title: str | None = None,
        status: int | None = None,
        field: str | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.type = type
        self.title = title
        self.status = status
        self.field = field
        self.problem = problem or {}

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        code = f"{self.status} " if self.status is not None else ""
        return f"{code}{self.detail}{where}"


class InvalidInput(SettleError, ValueError):
    """400: the request is not what the operation accepts (``field`` names the offender); also raised
    before sending when a key cannot be built from what was given."""


class Unauthorized(SettleError):
    """401/403: the function key or bearer token is missing or not accepted."""


UNAUTHORIZED_HINT = (
    "Settle needs a function key (SettleClient(function_key=...), sent as x-functions-key) or a bearer "
    "token (SettleClient(credential=..., token_scope='api://<app-client-id>/.default'))."
)
FORBIDDEN_HINT = (
    "Settle knew the caller but refused it: the function key is not one of this app's, or the bearer "
    "token lacks the app role the route needs."
)


class PayloadMismatch(SettleError, ValueError):
    """``@idempotent``: the key was already used with different arguments (their hash differs from the
    stored one), like Powertools' ``IdempotencyValidationError``. Nothing was run."""

    def __init__(self, detail: str, *, stored_hash: str, payload_hash: str) -> None:
        super().__init__(detail, type=CLIENT_PREFIX + "payload-mismatch", title="Payload mismatch")
        self.stored_hash = stored_hash
        self.payload_hash = payload_hash


class NotFound(SettleError):
    """404 that the client does not turn into ``None`` (e.g. a wrong base URL or route)."""


class Conflict(SettleError):
    """409: valid request, but the current state does not allow it (retry after reading the state)."""


class LockLost(Conflict):
    """409 ``lock-lost``: the lock token no longer holds the lock; nothing was written with it."""


class LeaseLost(Conflict):
    """409 ``lease-lost``: the lease token no longer holds the hand-off; nothing was sent with it."""


class PayloadTooLarge(SettleError):
    """413: the data is larger than Settle stores (the detail names the limit)."""


class Unavailable(SettleError):
    """503/429 still answered after the retries the call allows. ``retry_after``: seconds the server
    asked for (``None`` when it did not say)."""

    def __init__(self, detail: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.retry_after = retry_after


class ServerError(SettleError):
    """Any other unexpected answer (a 500, or a 2xx whose body the client cannot read)."""


class TransportFailure(SettleError):
    """No answer at all: the connection failed or timed out.

    ``maybe_applied`` is ``False`` only when the request provably never left (the connection was not
    opened); otherwise the server may have applied it and the answer was lost.
    """

    def __init__(self, detail: str, *, maybe_applied: bool) -> None:
        super().__init__(detail, type=CLIENT_PREFIX + "transport", title="No answer from Settle")
        self.maybe_applied = maybe_applied


class ContentTruncated(SettleError, ValueError):
    """A parked body Settle stored truncated (too large for a row): the whole body is not in Settle.
    Raised by ``payload_json()`` so a cut body is never read as an empty one."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            detail, type=CLIENT_PREFIX + "content-truncated", title="Body stored truncated", field="payload"
        )


class LockNotAcquired(SettleError):
    """The lock was refused. ``record_status``: the record's status (``Processed``, ``Processing``...);
    ``reason``: the server's explanation."""

    def __init__(self, reason: str, *, record_status: str, locked_until: datetime | None = None) -> None:
        super().__init__(reason, type=CLIENT_PREFIX + "lock-refused", title="Lock not acquired")
        self.reason = reason
        self.record_status = record_status
        self.locked_until = locked_until


class AlreadyProcessed(LockNotAcquired):
    """The item is already Processed or Skipped (terminal): do not act on it again."""


class ResultNotStored(AlreadyProcessed):
    """``@idempotent``: the function ran and its side effect happened, but its result could not be stored
    (not JSON, or beyond Settle's size limit); the key is Processed, so it is not run again, and there is
    no result to replay. ``reason`` says why it was not stored."""


class LockHeld(LockNotAcquired):
    """Another caller holds a valid lock (until ``locked_until``, by the server's clock)."""


_BY_STATUS: dict[int, type[SettleError]] = {
    400: InvalidInput,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: Unavailable,
    503: Unavailable,
}


def problem_of(response: httpx.Response) -> dict[str, Any]:
    """The problem+json body of an answer ({} when it has none or it is not JSON)."""
    try:
        body = json.loads(response.content) if response.content else None
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def retry_after_of(response: httpx.Response) -> float | None:
    """Seconds asked for by ``Retry-After`` (delta-seconds or an HTTP date) or ``retryAfter`` in the body."""
    header = response.headers.get("retry-after")
    if header:
        try:
            return max(0.0, float(header))
        except ValueError:
            try:
                when = parsedate_to_datetime(header)
            except (TypeError, ValueError):
                when = None
            if when is not None and when.tzinfo is not None:
                return max(0.0, (when - datetime.now(UTC)).total_seconds())
    value = problem_of(response).get("retryAfter")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(0.0, float(value))
    return None


def error_from_response(response: httpx.Response) -> SettleError:
    """The exception an error answer stands for."""
    problem = problem_of(response)
    status = response.status_code
    kind = problem.get("type") if isinstance(problem.get("type"), str) else None
    detail = problem.get("detail") if isinstance(problem.get("detail"), str) else None
    if detail is None:
        detail = response.reason_phrase or f"HTTP {status}"
    field = problem.get("field") if isinstance(problem.get("field"), str) else None
    title = problem.get("title") if isinstance(problem.get("title"), str) else None
    cls: type[SettleError]
    cls = {LOCK_LOST: LockLost, LEASE_LOST: LeaseLost}.get(kind or "") or _BY_STATUS.get(status, ServerError)
    common: dict[str, Any] = {
        "type": kind,
        "title": title,
        "status": status,
        "field": field,
        "problem": problem,
    }
    if cls is Unavailable:
        return Unavailable(detail, retry_after=retry_after_of(response), **common)
    if cls is Unauthorized:
        hint = UNAUTHORIZED_HINT if status == 401 else FORBIDDEN_HINT
        detail = hint if detail in ("Unauthorized", "Forbidden", f"HTTP {status}") else f"{detail} {hint}"
    return cls(detail, **common)
