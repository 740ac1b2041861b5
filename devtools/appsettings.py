"""App settings for the development host: `local.settings.json`, `host.json`, `%NAME%` expressions."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path


def read_settings(path: Path) -> dict[str, str]:
    """The ``Values`` of a ``local.settings.json`` file (empty when the file is absent)."""
    if not path.exists():
        return {}
    document = json.loads(path.read_text(encoding="utf-8"))
    values = document.get("Values") or {}
    return {str(k): "" if v is None else str(v) for k, v in values.items()}


def apply_settings(values: Mapping[str, str], environ: dict[str, str] | None = None) -> list[str]:
    """Copy settings into the environment without overriding variables already set; returns the names set."""
    target = os.environ if environ is None else environ
    applied = []
    for name, value in values.items():
        if name not in target:
            target[name] = value
            applied.append(name)
    return applied


def route_prefix(host_json: Path) -> str:
    """``extensions.http.routePrefix`` of ``host.json`` (``api`` when absent, as the host does)."""
    if not host_json.exists():
        return "api"
    document = json.loads(host_json.read_text(encoding="utf-8"))
    prefix = document.get("extensions", {}).get("http", {}).get("routePrefix", "api")
    return str(prefix).strip("/")


_SETTING_RE = re.compile(r"%([^%]+)%")


def resolve_expression(text: str, environ: Mapping[str, str] | None = None) -> str:
    """Resolve ``%NAME%`` expressions from app settings (a missing setting is an error, as on Azure)."""
    source = os.environ if environ is None else environ

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in source:
            raise KeyError(f"app setting {name!r} (used as %{name}%) is not set")
        return source[name]

    return _SETTING_RE.sub(lookup, text)
