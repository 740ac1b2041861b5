"""The handoff blueprint: its Azure Functions (HTTP, timers, the resolver trigger). Thin: parse, call one service, answer."""

from __future__ import annotations

import azure.functions as func

bp = func.Blueprint()
