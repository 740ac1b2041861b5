"""JSON text in a column: one member read out of a stored document, and a document kept under a column's
limit."""

from __future__ import annotations

import json
import math
from typing import Any

AUDIT_DATA_LIMIT = 4000  # characters of JSON, as NimBus's WebApp writer caps ``Data``


def text_at(document: str | None, *path: str) -> str | None:
    """The string at ``path`` in the JSON ``document`` (an audit's ``Data``, a stored body); None when the
    document is absent or not JSON, a step is missing or not an object, or the value is not a string."""
    if not document:
        return None
    try:
        value: Any = json.loads(document)
    except ValueError:
        return None
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None


def bounded_json(fields: dict[str, Any], *, limit: int = AUDIT_DATA_LIMIT) -> str:
    """``fields`` as JSON text of at most ``limit`` characters: long strings are cut, never the JSON.

    The names of the fields that were cut are listed under ``truncated``.
    """
    data = dict(fields)
    cut: list[str] = []

    def text() -> str:
        shown = {**data, "truncated": cut} if cut else data
        return json.dumps(shown, ensure_ascii=False, separators=(",", ":"))

    out = text()
    while len(out) > limit:
        longest = max(
            (k for k, v in data.items() if isinstance(v, str) and v),
            key=lambda k: len(json.dumps(data[k], ensure_ascii=False)),
            default=None,
        )
        if longest is None:
            break  # only short scalars left (cannot happen with our fields)
        value = str(data[longest])
        excess = len(out) - limit
        # Remove about as many characters as the excess costs in JSON (escapes cost up to six each);
        # the loop takes care of an uneven spread.
        per_char = (len(json.dumps(value, ensure_ascii=False)) - 2) / len(value)
        remove = max(1, math.ceil(excess / per_char))
        data[longest] = value[: max(0, len(value) - remove)]
        if longest not in cut:
            cut.append(longest)
        out = text()
    return out
