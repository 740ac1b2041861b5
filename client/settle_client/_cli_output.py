"""How the ``settle`` command prints: aligned tables and key/value blocks for people, JSON for scripts.

Pure (strings in, strings out), so the layout is tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

# A cell longer than this is cut with "…" (the JSON output is never cut).
MAX_CELL = 60
NONE = "—"


def cell(value: Any, *, width: int = MAX_CELL) -> str:
    """One value as a table cell: times in UTC (``2026-12-04 22:41:07Z``), ``—`` for none, ``""`` kept."""
    if value is None:
        return NONE
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value
        return utc.strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == "":
        return '""'
    if isinstance(value, dict | list):
        value = json.dumps(value, separators=(",", ":"))
    text = " ".join(str(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, a header line first."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [headers, *cells]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``name: value`` lines, names aligned."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name + ':':<{width + 1}} {cell(value, width=200)}" for name, value in pairs)


def as_json(value: Any) -> str:
    """Models as their wire JSON (camelCase), lists of them as a JSON array."""
    return json.dumps(_jsonable(value), indent=2, ensure_ascii=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
