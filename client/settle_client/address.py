"""Where Settle answers: one setting, ``SETTLE_URL``, that every entry point follows.

``make run`` serves ``http://127.0.0.1:7071`` (the port ``SETTLE_RUN_PORT`` names, or the port of
``SETTLE_URL``); ``settle``, the client, ``make demo``, the examples and the walkthrough talk to
``SETTLE_URL`` and, when it is not set, to what ``make run`` serves. One variable moves them all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

URL_SETTING = "SETTLE_URL"
RUN_PORT_SETTING = "SETTLE_RUN_PORT"
DEFAULT_PORT = 7071


def default_url(environ: Mapping[str, str] | None = None) -> str:
    """``SETTLE_URL``; unset, what ``make run`` serves: ``http://127.0.0.1:$SETTLE_RUN_PORT`` (7071)."""
    env = os.environ if environ is None else environ
    url = env.get(URL_SETTING, "").strip()
    if url:
        return url.rstrip("/")
    port = env.get(RUN_PORT_SETTING, "").strip() or str(DEFAULT_PORT)
    return f"http://127.0.0.1:{port}"
