"""The longest value each caller-supplied identifier of the hand-off and operator APIs may be (README
"Limits"), and the checks that answer one step beyond with a 400 problem+json naming the field.

Ids are stored in Table keys and audit rows, so every one is bounded where it comes in (route, query,
body, header), not where storage would refuse it. The maxima are what the ids can be in NimBus: an endpoint
is a Service Bus topic (names up to 260 characters); event, session and message ids are at most what one
Table key of an event holds (1 KiB, UTF-16), so every event the resolver stored can be addressed.
"""

from __future__ import annotations

import azure.functions as func

from common.errors import InvalidInput

MAX_ENDPOINT_ID = 260
MAX_ID = 512  # event, session, message, correlation, event type and external job ids; poison ids
MAX_AGENT_ID = 128
MAX_DAY = 8  # YYYYMMDD
MAX_NAME = 256  # who: settledBy, by (the audit's auditor name)

_ROUTE_MAXIMA = {
    "endpointId": MAX_ENDPOINT_ID,
    "eventId": MAX_ID,
    "externalJobId": MAX_ID,
    "id": MAX_ID,
    "day": MAX_DAY,
}


def bounded(value: str, field: str, maximum: int) -> str:
    """``value`` if it is at most ``maximum`` characters, else a 400 naming ``field``."""
    if len(value) > maximum:
        raise InvalidInput(f"{field} is at most {maximum:,} characters (it has {len(value):,}).", field=field)
    return value


def route_value(req: func.HttpRequest, name: str) -> str:
    """A route parameter: present, and within its documented maximum (400 naming it otherwise)."""
    value = req.route_params.get(name) or ""
    if not value:
        raise InvalidInput(f"{name} is required.", field=name)
    return bounded(value, name, _ROUTE_MAXIMA.get(name, MAX_ID))


_QUERY_MAXIMA = {
    "endpointId": MAX_ENDPOINT_ID,
    "eventId": MAX_ID,
    "sessionId": MAX_ID,
    "eventTypeId": MAX_ID,
    "auditType": MAX_ID,
    "by": MAX_NAME,
}


def query_value(req: func.HttpRequest, name: str) -> str | None:
    """A query parameter (None when absent or empty), within its documented maximum."""
    value = req.params.get(name) or None
    return None if value is None else bounded(value, name, _QUERY_MAXIMA.get(name, MAX_ID))


def agent_id(req: func.HttpRequest) -> str | None:
    """The ``x-agent-id`` header (stored in lease rows and audits): at most 128 printable characters, no
    control characters; None when absent or blank; a 400 naming the header otherwise."""
    value = (req.headers.get("x-agent-id") or "").strip()
    if not value:
        return None
    if len(value) > MAX_AGENT_ID or not value.isprintable():
        raise InvalidInput(
            f"x-agent-id must be 1 to {MAX_AGENT_ID} printable characters "
            f"(it has {len(value):,}{'' if value.isprintable() else ', with control characters'}).",
            field="x-agent-id",
        )
    return value
