"""Every Settle operation as a request description plus the parser of its answer.

The sync and async clients only differ in how they send a :class:`Call`; what is sent, how safe a
retry is, and how the answer is read are defined once, here.
"""

from __future__ import annotations

import json
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

# The server keeps at most 32,000 characters of error text; leave room and say it was cut.
MAX_ERROR_TEXT = 8000


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
    params: tuple[tuple[str, str], ...] = ()
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


def segment(value: str) -> str:
    """One URL path segment (``/``, ``?`` and ``#`` in an endpoint or id must not change the route)."""
    if not value:
        raise ValueError("path segments must not be empty")
    return quote(value, safe="")


class Requests:
    """Builds the calls of one client (its route prefix and handler)."""

    def __init__(self, *, prefix: str, handler: Handler | None) -> None:
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.handler = handler

    def _path(self, route: str) -> str:
        return f"{self.prefix}/{route}"

    def _keyed(self, key: Key, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"key": key.to_wire()}
        if self.handler is not None:
            body["handler"] = self.handler.model_dump()
        body.update({k: v for k, v in extra.items() if v is not None})
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
        path = self._path(f"v1/state/{route}")
        return Call("POST", path, parse, safety, body=body, none_if_not_found=none_if_not_found)

    # -- state ------------------------------------------------------------------------------------
    def meta(self) -> Call[Meta]:
        return Call("GET", self._path("v1/state/meta"), lambda r: model(Meta, r), Safety.IDEMPOTENT)

    def exists(self, key: Key) -> Call[bool]:
        def parse(response: httpx.Response) -> bool:
            body = response.json()
            return bool(body.get("exists")) if isinstance(body, dict) else False

        return self._state("exists", self._keyed(key), parse, Safety.IDEMPOTENT)

    def get(self, key: Key) -> Call[Record | None]:
        return self._state("get", self._keyed(key), maybe(Record), Safety.IDEMPOTENT, none_if_not_found=True)

    def lock(self, key: Key, *, lock_seconds: int | None, request_id: str | None) -> Call[LockResult]:
        # Without a requestId a retry after a lost answer would meet our own lock and be refused.
        safety = Safety.IDEMPOTENT if request_id else Safety.UNSAFE
        body = self._keyed(key, lockSeconds=lock_seconds, requestId=request_id)
        return self._state("lock", body, lambda r: model(LockResult, r), safety)

    def extend(self, key: Key, *, lock_token: str, lock_seconds: int | None) -> Call[ExtendResult]:
        body = self._keyed(key, lockToken=lock_token, lockSeconds=lock_seconds)
        return self._state("lock/extend", body, lambda r: model(ExtendResult, r), Safety.IDEMPOTENT)

    def set(
        self,
        key: Key,
        status: Status | int | str,
        *,
        data: Any = None,
        metadata: MetadataLike | None = None,
        substatus: str | None = None,
        error: str | None = None,
        lock_token: str | None = None,
    ) -> Call[Record | None]:
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
        return self._state("set", body, maybe(Record), Safety.IDEMPOTENT if lock_token else Safety.UNSAFE)

    def upsert(
        self,
        key: Key,
        data: Any,
        *,
        metadata: MetadataLike | None = None,
        substatus: str | None = None,
        lock_token: str | None = None,
    ) -> Call[Record | None]:
        meta = Metadata.of(metadata)
        body = self._keyed(
            key,
            data=jsonable(data),
            metadata=meta.to_wire() if meta else None,
            substatus=substatus,
            lockToken=lock_token,
        )
        safety = Safety.IDEMPOTENT if lock_token else Safety.UNSAFE
        return self._state("upsert", body, maybe(Record), safety)

    def release(self, key: Key, error: str, *, lock_token: str | None = None) -> Call[Record | None]:
        body = self._keyed(key, error=error, lockToken=lock_token)
        safety = Safety.IDEMPOTENT if lock_token else Safety.UNSAFE
        return self._state("release", body, maybe(Record), safety)

    def history(self, key: Key, *, page_size: int | None, token: str | None) -> Call[RecordPage]:
        body = self._keyed(key, pageSize=page_size, continuationToken=token)
        return self._state("history", body, lambda r: model(RecordPage, r), Safety.IDEMPOTENT)

    def query(self, filters: Mapping[str, Any], *, token: str | None) -> Call[RecordPage]:
        body: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        if token is not None:
            body["continuationToken"] = token
        if self.handler is not None:
            body["handler"] = self.handler.model_dump()
        return self._state("query", body, lambda r: model(RecordPage, r), Safety.IDEMPOTENT)

    # -- hand-offs --------------------------------------------------------------------------------
    def next_handoff(
        self, endpoint: str, cls: type[H], *, event_types: Iterable[str] | None, wait_seconds: float
    ) -> Call[H | None]:
        params = tuple(("eventTypeId", t) for t in (event_types or ()))
        if wait_seconds > 0:
            params += (("waitSeconds", f"{wait_seconds:g}"),)
        path = self._path(f"v1/handoffs/{segment(endpoint)}/next")
        return Call("GET", path, maybe(cls), Safety.IDEMPOTENT, params=params, wait=wait_seconds)

    def receive_handoff(
        self,
        endpoint: str,
        cls: type[H],
        *,
        event_types: Iterable[str] | None,
        wait_seconds: float,
        lease_seconds: float | None,
    ) -> Call[H | None]:
        params = tuple(("eventTypeId", t) for t in (event_types or ()))
        if wait_seconds > 0:
            params += (("waitSeconds", f"{wait_seconds:g}"),)
        if lease_seconds is not None:
            params += (("leaseSeconds", str(_seconds(lease_seconds))),)
        path = self._path(f"v1/handoffs/{segment(endpoint)}/receive")
        # Not retried after a lost answer: a retry would lease another hand-off (the first one's lease
        # then simply runs out).
        return Call("POST", path, maybe(cls), Safety.UNSAFE, params=params, wait=wait_seconds)

    def lease(
        self, endpoint: str, action: str, event_id: str, token: str, lease_seconds: float | None = None
    ) -> Call[dict[str, Any]]:
        body: dict[str, Any] = {"eventId": event_id, "leaseToken": token}
        if lease_seconds is not None:
            body["leaseSeconds"] = _seconds(lease_seconds)
        path = self._path(f"v1/handoffs/{segment(endpoint)}/leases/{action}")
        return Call("POST", path, lambda r: dict(r.json()), Safety.IDEMPOTENT, body=body)

    def job(self, endpoint: str, job_id: str, cls: type[H]) -> Call[H | None]:
        path = self._path(f"v1/handoffs/{segment(endpoint)}/jobs/{segment(job_id)}")
        return Call("GET", path, maybe(cls), Safety.IDEMPOTENT, none_if_not_found=True)

    def event(self, endpoint: str, event_id: str) -> Call[Event | None]:
        path = self._path(f"v1/events/{segment(endpoint)}/{segment(event_id)}")
        return Call("GET", path, maybe(Event), Safety.IDEMPOTENT, none_if_not_found=True)

    def complete(
        self,
        endpoint: str,
        coordinates: Coordinates | Mapping[str, Any],
        *,
        result: Any,
        settled_by: str | None,
        lease_token: str | None = None,
    ) -> Call[SettlementAccepted]:
        body = {
            "endpointId": endpoint,
            "coordinates": _coordinates(coordinates),
            "result": jsonable(result),
            "settledBy": settled_by,
            "leaseToken": lease_token,
        }
        return self._settle("complete", body)

    def fail(
        self,
        endpoint: str,
        coordinates: Coordinates | Mapping[str, Any],
        *,
        error_text: str,
        error_type: str | None,
        settled_by: str | None,
        lease_token: str | None = None,
    ) -> Call[SettlementAccepted]:
        body = {
            "endpointId": endpoint,
            "coordinates": _coordinates(coordinates),
            "errorText": error_text,
            "errorType": error_type,
            "settledBy": settled_by,
            "leaseToken": lease_token,
        }
        return self._settle("fail", body)

    def _settle(self, route: str, body: dict[str, Any]) -> Call[SettlementAccepted]:
        body = {k: v for k, v in body.items() if v is not None}
        path = self._path(f"v1/handoffs/{route}")
        # Settle answers a retry of the same settlement from its claim (same controlMessageId, ``replayed``),
        # so a lost answer may be retried; a different settlement stays a 409.
        return Call("POST", path, lambda r: model(SettlementAccepted, r), Safety.IDEMPOTENT, body=body)


def _coordinates(value: Coordinates | Mapping[str, Any]) -> dict[str, Any]:
    return (value if isinstance(value, Coordinates) else Coordinates.model_validate(value)).to_wire()


def query_filters(
    tenant_id: int,
    *,
    scope: Scope | int | str | None,
    entity_id: int | None,
    entity_execution_id: int | None,
    item_entity_key: str | None,
    status: Status | int | str | None,
    updated_from: datetime | None,
    updated_to: datetime | None,
    page_size: int | None,
) -> dict[str, Any]:
    """The body of ``query`` (names and enums resolved; ``None`` means no filter)."""
    return {
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


def _seconds(value: float) -> float | int:
    """A lease length as the server takes it: whole seconds as an integer (``300.0`` is sent as ``300``); a
    fraction is sent as it is, and the server refuses it naming ``leaseSeconds``."""
    return int(value) if float(value).is_integer() else value
