"""Text inside Table Storage keys: one escaping for every table.

Table keys forbid ``/ \\ # ?`` and control characters (U+0000-U+001F, U+007F-U+009F), and Settle's keys
use ``|`` and ``~`` as separators. Those, lone surrogates (which cannot travel as UTF-8), and ``%`` itself
are written ``%XX`` (``%uXXXX`` above U+00FF), so the encoding is injective and reversible and a range
query on an escaped prefix matches exactly that prefix. Keys are limited to 1 KiB counted in UTF-16, how
the service stores them.
"""

from __future__ import annotations

import re

MAX_KEY_BYTES = 1024

_NEEDS_ESCAPE = re.compile(r"[%|~/\\#?\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_ESCAPED = re.compile(r"%u([0-9A-F]{4})|%([0-9A-F]{2})")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"%{code:02X}" if code <= 0xFF else f"%u{code:04X}"


def escape(text: str) -> str:
    """The key-safe form of ``text`` (injective; see module docstring)."""
    return _NEEDS_ESCAPE.sub(_escape_char, text)


def unescape(text: str) -> str:
    """The inverse of :func:`escape`."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), text)


def key_bytes(key: str) -> int:
    """Size of a key as the service counts it (UTF-16)."""
    return len(key.encode("utf-16-le", "surrogatepass"))
