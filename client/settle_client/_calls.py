"""Every Settle operation as a request description plus the parser of its answer.

The sync and async clients only differ in how they send a :class:`Call`; what is sent, how safe a
retry is, and how the answer is read are defined once, here (sent by :mod:`settle_client._core`).

Ids travel in the query string, never in the path: the deployed Functions host decodes ``%2F`` in a path
before it matches routes, so an endpoint, event, job or poison id holding ``/`` in a path segment is a 404
in Azure. Every route that takes an id has a twin that takes it as a query parameter (``GET
v1/events?endpointId=...&eventId=...``), and the client always calls the twin.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from settle_client.enums import Scope, Status
from settle_client.errors import ServerError
from settle_client.models import (
    Coordinates,
    Event,
    ExtendResult,
    Handler,
    HandoffView,
    Key,
    KeyLike,
    LockResult,
    Meta,
    Metadata,
    MetadataLike,
    Record,
    RecordPage,
    SettlementAccepted,
)
from settle_client.retry import Safety

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
H = TypeVar("H", bound=HandoffView)

# The form ids travel in: True, the query-string twin routes (every host routes them alike); False, the
# older path form (ids as percent-encoded path segments), for a server that predates the twins.
IDS_IN_QUERY = True

Params = tuple[tuple[str, str], ...]

# The server keeps at most 32,000 characters of error text; leave room and say it was cut.
MAX_ERROR_TEXT = 8000


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing: its items, the token of the next (``None``: this is the last) and, where the
    answer counts them, how many match in all (``at_least``: counting stopped at ``count``)."""

    items: list[T]
    token: str | None
    count: int | None = None
    at_least: bool = False


@dataclass(frozen=True)
class Pages(Generic[T]):
    """A listing read page by page: ``page(token)`` is the call of the page after ``token`` (``None``:
    the first). ``empty``: there is nothing to ask for."""

    page: Callable[[str | None], Call[Page[T]]]
    empty: bool = False


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request and how to read its answer.

    ``none_if_not_found``: a Settle ``not-found`` problem (404) is an answer (``parse`` gets it), not
    an error; ``wait``: seconds the server may hold the request (long poll), added to the read timeout.
    """

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    safety: Safety
    body: Any = None
    params: Params = ()
    none_if_not_found: bool = False
    wait: float = 0.0


def model(cls: type[M], response: httpx.Response) -> M:
    try:
        return cls.model_validate_json(response.content)
    except ValidationError as exc:
        raise ServerError(
            f"Settle answered {response.status_code} with a body the client cannot read as "
            f"{cls.__name__}: {exc.errors(include_url=False)[0]['msg']}",
            status=response.status_code,
        ) from exc


def parse_as(cls: type[M]) -> Callable[[httpx.Response], M]:
    """The parser of an answer that is a ``cls``."""
    return lambda response: model(cls, response)


def present(**fields: Any) -> dict[str, Any]:
    """The ``fields`` a request body carries: those given, ``None`` left out."""
    return {k: v for k, v in fields.items() if v is not None}


def maybe(cls: type[M]) -> Callable[[httpx.Response], M | None]:
    def parse(response: httpx.Response) -> M | None:
        if response.status_code in (204, 404):
            return None
        return model(cls, response)

    return parse


def iso(value: datetime) -> str:
    if value.tzinfo is None:
        raise ValueError("give aware datetimes (UTC), not naive ones")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` as JSON data (pydantic models dumped), or a TypeError saying what cannot be stored."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"Settle stores JSON data; this value is not JSON: {exc}") from exc
    return value


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 1] + "…"


def addressed(twin: str, path_form: str, ids: Mapping[str, str]) -> tuple[str, Params]:
    """The route and query of a call naming ``ids`` (``{"endpointId": ..., "eventId": ...}``): ``twin``
    with the ids as query parameters, or (:data:`IDS_IN_QUERY` off) ``path_form`` with each ``{name}``
    replaced by its id as one percent-encoded segment."""
    for name, value in ids.items():
        if not value:
            raise ValueError(f"{name} must not be empty")
    if IDS_IN_QUERY:
        return twin, tuple(ids.items())
    return path_form.format(**{name: quote(value, safe="") for name, value in ids.items()}), ()


class Requests:
    """Builds the calls of one client (its route prefix and handler)."""

    def __init__(self, *, prefix: str, handler: Handler | None) -> None:
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.handler = handler

    def call(
        self,
        method: str,
        route: str,
        parse: Callable[[httpx.Response], T],
        safety: Safety,
        *,
        ids: Mapping[str, str] | None = None,
        path_form: str = "",
        params: Params = (),
        **options: Any,
    ) -> Call[T]:
        """A call of ``route`` (under the prefix); with ``ids``, addressed as :func:`addressed` says,
        the ids first in the query."""
        if ids:
            route, addressing = addressed(route, path_form, ids)
            params = addressing + params
        return Call(method, f"{self.prefix}/{route}", parse, safety, params=params, **options)

    def found(self, cls: type[M], route: str, path_form: str, ids: Mapping[str, str]) -> Call[M | None]:
        """The read of the one thing ``ids`` name (addressed as :meth:`call` says): it, or ``None`` when
        Settle answers ``not-found``."""
        return self.call(
            "GET", route, maybe(cls), Safety.IDEMPOTENT, ids=ids, path_form=path_form, none_if_not_found=True
        )

    def _keyed(self, key: KeyLike, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"key": Key.of(key).to_wire()}
        if self.handler is not None:
            body["handler"] = self.handler.model_dump()
        body.update(present(**extra))
        return body

    def _state(
        self,
        route: str,
        body: Any,
        parse: Callable[[httpx.Response], T],
        safety: Safety,
        *,
        none_if_not_found: bool = False,
    ) -> Call[T]:
        return self.call(
            "POST", f"v1/state/{route}", parse, safety, body=body, none_if_not_found=none_if_not_found
        )

    # -- state (each is also a method of both clients, with this docstring) -------------------------
    def meta(self) -> Call[Meta]:
        """The server's scopes, statuses and handlers (``GET v1/state/meta``)."""
        return self.call("GET", "v1/state/meta", parse_as(Meta), Safety.IDEMPOTENT)

    def exists(self, key: KeyLike) -> Call[bool]:
        """True when the item is Processed or Skipped. Retried (a read)."""

        def parse(response: httpx.Response) -> bool:
            body = response.json()
            return bool(body.get("exists")) if isinstance(body, dict) else False

        return self._state("exists", self._keyed(key), parse, Safety.IDEMPOTENT)

    def get(self, key: KeyLike) -> Call[Record | None]:
        """The current record, or ``None`` when there is none. Retried (a read)."""
        return self._state("get", self._keyed(key), maybe(Record), Safety.IDEMPOTENT, none_if_not_found=True)

    def lock(
        self, key: KeyLike, *, lock_seconds: int | None = None, request_id: str | None = None
    ) -> Call[LockResult]:
        """Try to take the processing lock. A ``request_id`` is generated when not given, so a retry
        after a lost answer gets the same lock back (``replayed``); retried."""
        # Without a requestId a retry after a lost answer would meet our own lock and be refused.
        body = self._keyed(key, lockSeconds=lock_seconds, requestId=request_id or uuid.uuid4().hex)
        return self._state("lock", body, parse_as(LockResult), Safety.IDEMPOTENT)

    def extend(self, key: KeyLike, lock_token: str, *, lock_seconds: int | None = None) -> Call[ExtendResult]:
        """Extend a held lock (fenced: :class:`LockLost` when it is no longer held). Retried."""
        body = self._keyed(key, lockToken=lock_token, lockSeconds=lock_seconds)
        return self._state("lock/extend", body, parse_as(ExtendResult), Safety.IDEMPOTENT)

    def set(
        self,
        key: KeyLike,
        status: Status | int | str,
        *,
        data: Any = None,
        metadata: MetadataLike | None = None,
        substatus: str | None = None,
        error: str | None = None,
        lock_token: str | None = None,
    ) -> Call[Record | None]:
        """Record Processed, Skipped or Failed. Retried only with ``lock_token`` (fenced); ``None`` from
        the null handler."""
        meta = Metadata.of(metadata)
        body = self._keyed(
            key,
            status=Status.parse(status).label,
            data=jsonable(data),
            metadata=meta.to_wire() if meta else None,
            substatus=substatus,
            error=error,
            lockToken=lock_token,
        )
        return self._state("set", body, maybe(Record), _fenced(lock_token))

    def upsert(
        self,
        key: KeyLike,
        data: Any,
        *,
        metadata: MetadataLike | None = None,
        substatus: str | None = None,
        lock_token: str | None = None,
    ) -> Call[Record | None]:
        """Record Processed with new data (the previous version is Superseded). Retried only when fenced."""
        meta = Metadata.of(metadata)
        body = self._keyed(
            key,
            data=jsonable(data),
            metadata=meta.to_wire() if meta else None,
            substatus=substatus,
            lockToken=lock_token,
        )
        return self._state("upsert", body, maybe(Record), _fenced(lock_token))

    def release(self, key: KeyLike, error: str, *, lock_token: str | None = None) -> Call[Record | None]:
        """Release the lock as Failed with ``error``. Retried only when fenced."""
        body = self._keyed(key, error=error, lockToken=lock_token)
        return self._state("release", body, maybe(Record), _fenced(lock_token))

    def history(self, key: KeyLike, *, page_size: int | None = None) -> Pages[Record]:
        """Every version of the record, newest first; pages are fetched as the iteration needs them."""
        parsed = Key.of(key)

        def page(token: str | None) -> Call[Page[Record]]:
            body = self._keyed(parsed, pageSize=page_size, continuationToken=token)
            return self._state("history", body, _records, Safety.IDEMPOTENT)

        return Pages(page)

    def query(
        self,
        tenant_id: int,
        *,
        scope: Scope | int | str | None = None,
        entity_id: int | None = None,
        entity_execution_id: int | None = None,
        item_entity_key: str | None = None,
        status: Status | int | str | None = None,
        updated_from: datetime | None = None,
        updated_to: datetime | None = None,
        page_size: int | None = None,
    ) -> Pages[Record]:
        """Current records of a tenant matching every filter given; pages followed lazily."""
        filters = {
            "tenantId": tenant_id,
            "scopeId": int(Scope.parse(scope)) if scope is not None else None,
            "entityId": entity_id,
            "entityExecutionId": entity_execution_id,
            "itemEntityKey": item_entity_key,
            "status": Status.parse(status).label if status is not None else None,
            "updatedFrom": iso(updated_from) if updated_from is not None else None,
            "updatedTo": iso(updated_to) if updated_to is not None else None,
            "pageSize": page_size,
        }

        def page(token: str | None) -> Call[Page[Record]]:
            body = present(**filters, continuationToken=token)
            if self.handler is not None:
                body["handler"] = self.handler.model_dump()
            return self._state("query", body, _records, Safety.IDEMPOTENT)

        return Pages(page)

    # -- hand-offs --------------------------------------------------------------------------------
    def next_handoff(
        self, endpoint: str, cls: type[H], *, event_types: Iterable[str] | None, wait_seconds: float
    ) -> Call[H | None]:
        return self._poll("GET", "next", cls, Safety.IDEMPOTENT, endpoint, event_types, wait_seconds)

    def receive_handoff(
        self,
        endpoint: str,
        cls: type[H],
        *,
        event_types: Iterable[str] | None,
        wait_seconds: float,
        lease_seconds: float | None,
    ) -> Call[H | None]:
        lease: Params = () if lease_seconds is None else (("leaseSeconds", str(_seconds(lease_seconds))),)
        # Not retried after a lost answer: a retry would lease another hand-off (the first one's lease
        # then simply runs out).
        return self._poll("POST", "receive", cls, Safety.UNSAFE, endpoint, event_types, wait_seconds, lease)

    def _poll(
        self,
        method: str,
        verb: str,
        cls: type[H],
        safety: Safety,
        endpoint: str,
        event_types: Iterable[str] | None,
        wait_seconds: float,
        extra: Params = (),
    ) -> Call[H | None]:
        """A long poll for the oldest parked hand-off of ``endpoint`` (``next`` or ``receive``), held up to
        ``wait_seconds``; ``None`` when none came."""
        return self.call(
            method,
            f"v1/handoffs/{verb}",
            maybe(cls),
            safety,
            ids={"endpointId": endpoint},
            path_form=f"v1/handoffs/{{endpointId}}/{verb}",
            params=_polling(event_types, wait_seconds) + extra,
            wait=wait_seconds,
        )

    def lease(
        self, endpoint: str, action: str, event_id: str, token: str, lease_seconds: float | None = None
    ) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"eventId": event_id, "leaseToken": token}
        if lease_seconds is not None:
            body["leaseSeconds"] = _seconds(lease_seconds)
        return self.call(
            "POST",
            f"v1/handoffs/leases/{action}",
            lambda r: dict(r.json()),
            Safety.IDEMPOTENT,
            ids={"endpointId": endpoint},
            path_form=f"v1/handoffs/{{endpointId}}/leases/{action}",
            body=body,
        )

    def renew_lease(
        self, endpoint: str, event_id: str, lease_token: str, *, lease_seconds: float | None = None
    ) -> Call[dict[str, Any]]:
        """Extend the lease ``lease_token`` holds on ``event_id``'s hand-off (from a shell or another
        process than the one that received it); answers ``{expiresAt, ...}``; 409 if it was lost."""
        return self.lease(endpoint, "renew", event_id, lease_token, lease_seconds)

    def release_lease(self, endpoint: str, event_id: str, lease_token: str) -> Call[dict[str, Any]]:
        """Give the hand-off ``lease_token`` holds back at once (another agent's receive gets it)."""
        return self.lease(endpoint, "release", event_id, lease_token)

    def job(self, endpoint: str, job_id: str, cls: type[H]) -> Call[H | None]:
        ids = {"endpointId": endpoint, "externalJobId": job_id}
        return self.found(cls, "v1/handoffs/jobs", "v1/handoffs/{endpointId}/jobs/{externalJobId}", ids)

    def event(self, endpoint: str, event_id: str) -> Call[Event | None]:
        """The event row with its history and audits, or ``None`` when the event is unknown on
        ``endpoint``."""
        ids = {"endpointId": endpoint, "eventId": event_id}
        return self.found(Event, "v1/events", "v1/events/{endpointId}/{eventId}", ids)

    def complete(
        self,
        endpoint: str,
        coordinates: Coordinates | Mapping[str, Any],
        *,
        result: Any = None,
        settled_by: str | None = None,
        lease_token: str | None = None,
    ) -> Call[SettlementAccepted]:
        """Complete a parked hand-off by its coordinates (409 :class:`Conflict` if it is not parked)."""
        return self._settle(
            "complete", endpoint, coordinates, settled_by, lease_token, result=jsonable(result)
        )

    def fail(
        self,
        endpoint: str,
        coordinates: Coordinates | Mapping[str, Any],
        error_text: str,
        *,
        error_type: str | None = None,
        settled_by: str | None = None,
        lease_token: str | None = None,
    ) -> Call[SettlementAccepted]:
        """Fail a parked hand-off by its coordinates."""
        return self._settle(
            "fail", endpoint, coordinates, settled_by, lease_token, errorText=error_text, errorType=error_type
        )

    def _settle(
        self,
        route: str,
        endpoint: str,
        coordinates: Coordinates | Mapping[str, Any],
        settled_by: str | None,
        lease_token: str | None,
        **outcome: Any,
    ) -> Call[SettlementAccepted]:
        body = present(
            endpointId=endpoint,
            coordinates=_coordinates(coordinates),
            **outcome,
            settledBy=settled_by,
            leaseToken=lease_token,
        )
        # Settle answers a retry of the same settlement from its claim (same controlMessageId, ``replayed``),
        # so a lost answer may be retried; a different settlement stays a 409.
        parse = parse_as(SettlementAccepted)
        return self.call("POST", f"v1/handoffs/{route}", parse, Safety.IDEMPOTENT, body=body)


def _coordinates(value: Coordinates | Mapping[str, Any]) -> dict[str, Any]:
    return (value if isinstance(value, Coordinates) else Coordinates.model_validate(value)).to_wire()


def _fenced(lock_token: str | None) -> Safety:
    """An unfenced write may have been applied when its answer was lost; a fenced one answers a repeat
    with the record it wrote."""
    return Safety.IDEMPOTENT if lock_token else Safety.UNSAFE


def _records(response: httpx.Response) -> Page[Record]:
    page = model(RecordPage, response)
    return Page(page.items, page.continuation_token)


def _polling(event_types: Iterable[str] | None, wait_seconds: float) -> Params:
    params = tuple(("eventTypeId", t) for t in (event_types or ()))
    if wait_seconds > 0:
        params += (("waitSeconds", f"{wait_seconds:g}"),)
    return params


def _seconds(value: float) -> float | int:
    """A lease length as the server takes it: whole seconds as an integer (``300.0`` is sent as ``300``); a
    fraction is sent as it is, and the server refuses it naming ``leaseSeconds``."""
    return int(value) if float(value).is_integer() else value
