"""The state blueprint: its Azure Functions (HTTP, timers). Thin: parse, call one service, answer."""

from __future__ import annotations

import azure.functions as func

bp = func.Blueprint()
