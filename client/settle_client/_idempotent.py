"""What ``@client.idempotent`` stores and how it replays it (shared by the sync and async clients).

Like AWS Lambda Powertools' idempotency utility:

* the result is stored as JSON the way pydantic dumps it (``datetime`` as ISO-8601, ``Decimal`` as a
  string, models by alias), and a replay returns it validated as the function's declared return type
  (``-> Posted`` replays a ``Posted``, ``-> Decimal`` a ``Decimal``; no annotation or ``Any``: the JSON);
* a hash of the call's payload (its arguments, or what ``payload=`` picks from them) is stored with the
  result; the same key with another payload raises :class:`PayloadMismatch` and runs nothing;
* a result that cannot be stored (not JSON, or beyond Settle's size limit) never re-runs the side effect:
  the key is recorded Processed without a result, the first call returns its result, and later calls
  raise :class:`ResultNotStored` (there is nothing to replay).

The hash and the marker are kept in the record's ``substatus``: ``idempotent payload sha256=<hex>``,
preceded by ``ResultNotStored; `` when the result was not stored.

With ``pass_previous=True`` the function also gets ``previous=``: the attempt before this lock, as the
``with client.processing(key)`` block has it in ``item.previous`` (``None`` for a new key; ``lock_expired``
true when that attempt crashed or stopped mid-way, so the side effect may be half done). It is not part of
the payload.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from settle_client.enums import Status
from settle_client.errors import AlreadyProcessed, PayloadMismatch, ResultNotStored
from settle_client.models import Key, Record
from settle_client.processing import Item

log = logging.getLogger("settle_client")

PAYLOAD_MARK = "idempotent payload sha256="
NOT_STORED = "ResultNotStored"
# Settle refuses data beyond 512 KiB (413); the client does not even send it.
MAX_RESULT_BYTES = 512 * 1024

Payload = Callable[..., Any]


def as_json(value: Any) -> Any:
    """``value`` as JSON data (pydantic's dump), or a TypeError saying why it cannot be."""
    try:
        data = to_jsonable_python(value, by_alias=True)
        json.dumps(data, allow_nan=False)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise TypeError(f"the result is not JSON: {exc}") from exc
    return data


def payload_hash(payload: Payload | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """SHA-256 of the call's payload: ``payload(*args, **kwargs)``, or all the arguments."""
    chosen = payload(*args, **kwargs) if payload is not None else [list(args), dict(kwargs)]
    try:
        raw = json.dumps(to_jsonable_python(chosen, by_alias=True), sort_keys=True, separators=(",", ":"))
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise TypeError(
            "@idempotent hashes the call's arguments to tell a repeated call from a different one with the "
            f"same key, and these are not JSON ({exc}): pass payload=lambda ...: <the JSON that matters>"
        ) from exc
    return hashlib.sha256(raw.encode()).hexdigest()


PREVIOUS = "previous"


def check_takes_previous(fn: Callable[..., Any]) -> None:
    """``pass_previous=True`` needs a function that takes ``previous=`` (a TypeError when it is decorated)."""
    parameters = inspect.signature(fn).parameters.values()
    if not any(p.name == PREVIOUS or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise TypeError(
            f"@idempotent(pass_previous=True): {fn.__qualname__} must take a keyword argument `previous` "
            "(the previous attempt, a PreviousAttempt or None; give it a default of None for callers)"
        )


def arguments(kwargs: Mapping[str, Any], item: Item, *, pass_previous: bool) -> dict[str, Any]:
    """The function's keyword arguments: the call's, and ``previous=item.previous`` when asked for."""
    if not pass_previous:
        return dict(kwargs)
    if PREVIOUS in kwargs:
        raise TypeError("@idempotent(pass_previous=True) passes `previous` itself: do not pass it")
    return {**kwargs, PREVIOUS: item.previous}


def stored(result: Any) -> tuple[Any, str | None]:
    """(the JSON to store, ``None``) or (``None``, why the result cannot be stored)."""
    try:
        data = as_json(result)
    except TypeError as exc:
        return None, f"{exc}"
    size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_RESULT_BYTES:
        return None, f"the result is {size} bytes as JSON; Settle stores at most {MAX_RESULT_BYTES}"
    return data, None


def substatus(digest: str, *, not_stored: bool) -> str:
    return f"{NOT_STORED}; {PAYLOAD_MARK}{digest}" if not_stored else f"{PAYLOAD_MARK}{digest}"


def declared(fn: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """A validator for ``fn``'s declared return type (``None``: no annotation, ``Any`` or unresolvable)."""
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # a forward reference that does not resolve: replay the JSON
        return None
    if hint is None or hint is Any or hint is type(None):
        return None
    if typing.get_origin(hint) is typing.Awaitable or getattr(hint, "__origin__", None) is typing.Coroutine:
        return None
    return TypeAdapter(hint)


def replay(record: Record, key: Key, digest: str, returns: TypeAdapter[Any] | None) -> Any:
    """The result a later call returns, or the error it raises."""
    marks = (record.substatus or "").split("; ")
    stored_digest = next((m[len(PAYLOAD_MARK) :] for m in marks if m.startswith(PAYLOAD_MARK)), None)
    if stored_digest is not None and stored_digest != digest:
        raise PayloadMismatch(
            f"Key {key.item_key} was processed with another payload (sha256 {stored_digest[:12]}…); this "
            f"call's payload hashes to {digest[:12]}…. Nothing was run.",
            stored_hash=stored_digest,
            payload_hash=digest,
        )
    if NOT_STORED in marks:
        data = record.data if isinstance(record.data, dict) else {}
        raise ResultNotStored(
            f"Key {key.item_key} was processed, but its result could not be stored "
            f"({data.get('resultNotStored', 'no reason recorded')}); it is not run again.",
            record_status=record.status,
        )
    if returns is None:
        return record.data
    try:
        return returns.validate_python(record.data)
    except ValidationError as exc:
        raise TypeError(
            f"the stored result of {key.item_key} is not the declared return type: {exc}"
        ) from exc


def remember(item: Item, result: Any, digest: str) -> None:
    """Set what ``@idempotent`` records for ``result`` (the side effect has happened: never fail here)."""
    data, why = stored(result)
    unstored = substatus(digest, not_stored=True)
    if why is not None:
        log.warning(
            "the result of %s is not stored (%s); the key is recorded Processed", item.key.item_key, why
        )
        item._substatus, item._data = unstored, {"resultNotStored": why}
        return
    item._substatus, item._data = substatus(digest, not_stored=False), data
    item._unstored = (unstored, None)  # if Settle refuses it after all: recorded without the result


def replayed(
    record: Record | None, refused: AlreadyProcessed, key: Key, digest: str, returns: TypeAdapter[Any] | None
) -> Any:
    """After the lock was refused because the key is done: the stored result of its Processed record; a
    Skipped one (or none) raises the refusal."""
    if record is not None and record.status == Status.PROCESSED.label:
        return replay(record, key, digest, returns)
    raise refused


class Waiting:
    """How a call that finds the key locked by another caller waits for that caller's result: polls,
    0.1 s apart at first, doubling to 2 s, until ``wait_seconds`` have passed."""

    def __init__(self, wait_seconds: float) -> None:
        self._deadline = time.monotonic() + wait_seconds
        self._pause = 0.1

    def pause(self) -> float | None:
        """The wait before trying again, or ``None`` when waiting is over (the LockHeld is raised)."""
        pause = self._pause
        if time.monotonic() + pause > self._deadline:
            return None
        self._pause = min(pause * 2, 2.0)
        return pause
