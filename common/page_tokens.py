"""Continuation tokens of the operator's listings: where a page ended, bound to the query it pages.

A token only positions reads the caller may make anyway (each listing also checks that the position lies
inside its own ranges), so it is not signed. What it must never do is carry one query's position into
another: it names a digest of the query it pages (every filter, never the page size), and a token of
another query, an edited one or one this API did not issue is a 400 naming ``continuationToken``.
"""

from __future__ import annotations

import binascii
import hashlib
import json
from typing import Any

from common.errors import InvalidInput
from common.signing import b64decode, b64encode

FIELD = "continuationToken"


def binding(*query: Any) -> str:
    """The digest a token of this query carries: ``query`` is every filter as the request gave it."""
    raw = json.dumps(query, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=True)
    return hashlib.sha256(raw.encode("ascii")).hexdigest()[:16]


def encode(bound: str, position: Any) -> str:
    """The token of the page after ``position`` (JSON: strings, numbers, lists, objects)."""
    raw = json.dumps({"f": bound, "p": position}, separators=(",", ":"), ensure_ascii=True)
    return b64encode(raw.encode("ascii"))


def refused(detail: str = "it is not one this API issued for this query") -> InvalidInput:
    return InvalidInput(
        f"continuationToken: {detail}; send it with the query it came from, or start again without it.",
        field=FIELD,
    )


def decode(token: str, bound: str) -> Any:
    """The position a token of this query names; a 400 naming ``continuationToken`` for anything else.
    The caller checks the position's shape and that it lies inside its ranges (:func:`refused`)."""
    raw = b64decode(token)
    try:
        data = json.loads(raw) if raw is not None else None
    except (binascii.Error, ValueError) as exc:
        raise refused() from exc
    if not isinstance(data, dict) or "p" not in data:
        raise refused()
    if data.get("f") != bound:
        raise refused("it belongs to another query (the filters must not change between pages)")
    return data["p"]


def strings(position: Any, length: int) -> list[str]:
    """``position`` as a list of ``length`` strings, or a 400 naming the token."""
    shaped = isinstance(position, list) and len(position) == length
    if not shaped or not all(isinstance(p, str) for p in position):
        raise refused()
    return list(position)
