"""How the ``settle`` command prints: aligned tables and key/value blocks for people, JSON or JSON lines
for scripts.

Pure (strings in, strings out), so the layout is tested without a server. Times are printed as the API
writes them (``2026-12-05T17:08:24.702Z``: UTC, milliseconds, ``Z``) in every format.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

NONE = "—"
# A column a narrow terminal squeezes is never cut below this.
MIN_CELL = 8
# Characters that make a value unsafe to paste unquoted into a shell (a poison id holds "|").
_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@+,=%")


def when(value: datetime) -> str:
    """A time as the API writes it: ``2026-12-05T17:08:24.702Z``."""
    utc = value.astimezone(UTC) if value.tzinfo else value
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def pasteable(value: str) -> str:
    """``value`` quoted for a shell when it holds anything a shell would read (``a|b`` → ``'a|b'``)."""
    return value if value and set(value) <= _SHELL_SAFE else shlex.quote(value)


def unquoted(value: str) -> str:
    """An id as a user pasted it: a shell-quoted one (read from a file or stdin) without its quotes."""
    if len(value) >= 2 and value[0] == value[-1] == "'":
        try:
            parts = shlex.split(value)
        except ValueError:
            return value
        if len(parts) == 1:
            return parts[0]
    return value


def cell(value: Any) -> str:
    """One value as a table cell: times as the API writes them, ``—`` for none, ``""`` kept."""
    if value is None:
        return NONE
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == "":
        return '""'
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"), default=_default)
    return " ".join(str(value).split())


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, width: int | None = None) -> str:
    """Left-aligned columns separated by two spaces, a header line first. Given the terminal's ``width``,
    the widest columns are narrowed (never below :data:`MIN_CELL`) until a line fits; without it (a pipe)
    nothing is cut."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if width is not None:
        room = width - 2 * (len(headers) - 1)
        while sum(widths) > room:
            widest = max(range(len(widths)), key=lambda i: widths[i])
            if widths[widest] <= MIN_CELL:
                break
            widths[widest] -= max(1, min(sum(widths) - room, widths[widest] - MIN_CELL))
    lines = [list(headers), *cells]
    return "\n".join(
        "  ".join(_cut(v, w).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name: value`` lines, names aligned (values whole: a block is read, not scanned)."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name + ':':<{width + 1}} {cell(value)}" for name, value in pairs)


def as_json(value: Any) -> str:
    """Models as their wire JSON (camelCase), lists of them as a JSON array."""
    return json.dumps(jsonable(value), indent=2, ensure_ascii=False)


def as_jsonl(value: Any) -> str:
    """One compact JSON document a line: each item of a list, or the one value."""
    items = value if isinstance(value, list | tuple) else [value]
    return "\n".join(json.dumps(jsonable(v), ensure_ascii=False, separators=(",", ":")) for v in items)


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: models by their wire names, times as the API writes them."""
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(mode="python", by_alias=True))
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return when(value)
    return value


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return when(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
