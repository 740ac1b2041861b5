"""The client tests' checks of a result the server refused (an idempotent call answered from what was
written)."""

from __future__ import annotations

import httpx


def refuses_the_result(request: httpx.Request) -> bool:
    """A fenced ``set`` carrying the function's result (not the ``resultNotStored`` fallback)."""
    return request.url.path.endswith("/state/set") and b"resultNotStored" not in request.content


def result_refused() -> httpx.Response:
    body = {"type": "urn:settle:problem:payload-too-large", "title": "Payload too large", "status": 413}
    return httpx.Response(
        413,
        json={**body, "detail": "too large (test)", "field": "data"},
        headers={"content-type": "application/problem+json"},
    )
