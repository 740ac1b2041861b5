"""Route templates of HTTP triggers (the ASP.NET-style ``{id}``, ``{id:guid}``, ``{name?}``, ``{*rest}``).

The deployed Functions host decodes every percent-escape of a request's path (``%2F`` included) before it
matches routes, and takes route values from the decoded path without decoding them again. So
:func:`decode_path` runs once, first, and :meth:`RouteTemplate.match` takes the decoded path: an id
holding ``/`` spans two segments and matches no single-segment parameter, as in Azure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote


def decode_path(raw: str) -> str:
    """The request path as the deployed host routes it: every ``%XX`` decoded once, as UTF-8.

    ``+`` stays ``+`` (it means a space only in a query string); a sequence that is not valid UTF-8
    becomes U+FFFD, as ASP.NET Core's decoder does.
    """
    return unquote(raw, encoding="utf-8", errors="replace")


_CONSTRAINTS: dict[str, str] = {
    "guid": r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}",
    "int": r"-?\d+",
    "long": r"-?\d+",
    "decimal": r"-?\d+(?:\.\d+)?",
    "double": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
    "float": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
    "bool": r"(?i:true|false)",
    "alpha": r"[A-Za-z]+",
    "datetime": r"[^/]+",
}
_PARAM_RE = re.compile(r"^\{(?P<star>\*{1,2})?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>[^}]*)\}$")


def _segment_pattern(segment: str) -> tuple[str, str | None, bool]:
    """Regex for one template segment; returns (pattern, parameter name, optional)."""
    match = _PARAM_RE.match(segment)
    if match is None:
        if "{" in segment:
            raise ValueError(f"route segments mixing text and parameters are not supported: {segment!r}")
        return re.escape(segment), None, False
    name, rest, star = match.group("name"), match.group("rest"), match.group("star")
    optional = rest.endswith("?")
    rest = rest.rstrip("?")
    if "=" in rest:  # a default value makes the parameter optional
        rest = rest.split("=", 1)[0]
        optional = True
    pattern = r".*" if star else r"[^/]+"
    extra: list[str] = []
    for constraint in filter(None, rest.split(":")):
        kind, _, argument = constraint.partition("(")
        argument = argument.rstrip(")")
        if kind in _CONSTRAINTS:
            pattern = _CONSTRAINTS[kind]
        elif kind in {"minlength", "maxlength", "length"}:
            bounds = argument.split(",")
            if kind == "minlength":
                extra.append(f"(?=[^/]{{{int(bounds[0])},}}(?:/|$))")
            elif kind == "maxlength":
                extra.append(f"(?![^/]{{{int(bounds[0]) + 1},}})")
            else:
                lo, hi = (bounds[0], bounds[0]) if len(bounds) == 1 else bounds
                extra.append(f"(?=[^/]{{{int(lo)},{int(hi)}}}(?:/|$))")
        elif kind in {"min", "max", "range"}:
            pattern = r"-?\d+"  # checked numerically after matching
        elif kind == "regex":
            pattern = f"(?:{argument})"
        else:
            raise ValueError(f"unsupported route constraint {kind!r} in {segment!r}")
    return "".join(extra) + f"(?P<{name}>{pattern})", name, optional


@dataclass(frozen=True)
class RouteTemplate:
    """A compiled route template such as ``v1/handoffs/{endpointId}/jobs/{externalJobId}``."""

    template: str
    regex: re.Pattern[str]
    parameters: tuple[str, ...]
    ranges: tuple[tuple[str, int | None, int | None], ...]

    @classmethod
    def compile(cls, template: str, prefix: str = "") -> RouteTemplate:
        segments = [s for s in (prefix.strip("/") + "/" + template.strip("/")).split("/") if s]
        regex = ""
        names: list[str] = []
        ranges: list[tuple[str, int | None, int | None]] = []
        for segment in segments:
            pattern, name, optional = _segment_pattern(segment)
            if name is not None:
                names.append(name)
                for kind, lo, hi in re.findall(r":(min|max|range)\((-?\d+)(?:,(-?\d+))?\)", segment):
                    if kind == "min":
                        ranges.append((name, int(lo), None))
                    elif kind == "max":
                        ranges.append((name, None, int(lo)))
                    else:
                        ranges.append((name, int(lo), int(hi)))
            regex += f"(?:/{pattern})?" if optional else f"/{pattern}"
        # Literals match case-insensitively, as in ASP.NET routing; parameter values keep their case.
        # A decoded path may hold any character (a newline from %0A too): match to the very end.
        compiled = re.compile(f"^{regex}/?\\Z", re.IGNORECASE | re.DOTALL)
        return cls(template, compiled, tuple(names), tuple(ranges))

    def match(self, path: str) -> dict[str, str] | None:
        """Route parameters when the decoded ``path`` (:func:`decode_path`) matches, else ``None``.

        Values are taken as they stand in the decoded path: a ``%`` in them is a literal ``%``.
        """
        found = self.regex.match(path)
        if found is None:
            return None
        params = {k: v for k, v in found.groupdict().items() if v is not None}
        for name, lo, hi in self.ranges:
            if name in params:
                value = int(params[name])
                if (lo is not None and value < lo) or (hi is not None and value > hi):
                    return None
        return params
