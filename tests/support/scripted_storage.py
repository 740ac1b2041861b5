"""A storage transport that answers from a script (status and error code, or an exception), recording what
was sent and slept: the retry policy's and the deadline's tests drive the SDK pipeline with it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import requests
from azure.core.pipeline.transport import HttpTransport, RequestsTransportResponse


class Scripted(HttpTransport):  # type: ignore[type-arg]
    """Answers request after request from ``script``: (status, x-ms-error-code) or an exception to raise."""

    def __init__(self, script: Script) -> None:
        self.script = list(script)
        self.sent = 0
        self.slept: list[float] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.sent += 1
        step = self.script.pop(0) if self.script else (202, None)
        if isinstance(step, Exception):
            raise step
        status, code = step
        raw = requests.Response()
        raw.status_code = status
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        if code is not None:
            raw.headers["x-ms-error-code"] = code
        raw._content = json.dumps({"odata.error": {"code": code}} if code else {}).encode()
        raw.url = request.url
        return RequestsTransportResponse(request, raw)

    def sleep(self, duration: float) -> None:
        self.slept.append(duration)

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> Scripted:
        return self

    def __exit__(self, *args: Any) -> None:
        pass


Script = Sequence[tuple[int, str | None] | Exception]
