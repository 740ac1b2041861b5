"""What the management API's functions share: who may call (401/403 in their OpenAPI answers), the
parameters every listing reads (times, page sizes), and how an operator action is counted.

Every route is anonymous for the Functions host: in Azure, App Service authentication (Entra ID) signs
the operator in and the code checks the principal and its app role (:mod:`common.principal`,
``docs/adr/0013-console-auth.md``); locally no key or sign-in is needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import azure.functions as func

from common import openapi, telemetry
from common.clock import storable_utc
from common.errors import InvalidInput, SettleError
from common.http import Handler, dependency_problem, operation, parse_body, path_parameter
from common.principal import Actor, actor_of, require_operator
from handoff.limits import route_value

# The API's models are imported when a handler or the OpenAPI document first needs them, never at indexing
# (a cold start pays for none of them); routes name them as ``lambda: models.Name``.
if TYPE_CHECKING:
    from management import models as models  # what mypy checks each route's model against
else:
    models = openapi.LazyModels("management.models")

TAG = "management"
AUTH = {401: "No signed-in principal (in Azure)", 403: "The principal lacks the app role Settle.Operator"}
ACTION = {
    **AUTH,
    400: "Invalid input (the problem names the field)",
    404: "Unknown event",
    409: "The event's state does not allow it, or another action on it is in flight",
    413: "The control message would exceed 256 KB",
    503: "Service Bus or storage unavailable and nothing was sent (retry)",
}
INVALID = {**AUTH, 400: "Invalid parameter"}
ENDPOINT = path_parameter("endpointId")
EVENT = path_parameter("eventId")
# The query parameters of the listings: a time window, a page size and where the last page ended.
FROM = {"name": "from", "in": "query", "schema": {"type": "string", "format": "date-time"}}
TO = {"name": "to", "in": "query", "schema": {"type": "string", "format": "date-time"}}
PAGE_SIZE = {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}}
CONTINUATION = {"name": "continuationToken", "in": "query", "schema": {"type": "string"}}
BUCKET_NAMES = (
    "Pending",
    "PendingHandoff",
    "Deferred",
    "Failed",
    "DeadLettered",
    "Unsupported",
    "Completed",
    "Skipped",
)


def body_or_defaults(req: func.HttpRequest, model: type[Any]) -> Any:
    """The JSON body, or the model's defaults when there is none (every field is optional)."""
    if not (req.get_body() or b"").strip():
        return model()
    return parse_body(req, model)


def time_param(req: func.HttpRequest, name: str) -> datetime | None:
    raw = req.params.get(name)
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"{name} must be an ISO-8601 time (2026-12-01T09:00:00Z).", field=name) from exc
    if value.tzinfo is None:
        raise InvalidInput(f"{name} needs a time zone (Z for UTC).", field=name)
    utc = storable_utc(value)  # 9999-12-31T23:00-05:00 is past the last instant: that instant
    if utc is None:
        raise InvalidInput(f"{name} must be 1601-01-01T00:00:00Z or later.", field=name)
    return utc


def page_size(req: func.HttpRequest, default: int, maximum: int) -> int:
    raw = req.params.get("pageSize")
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:  # "²" is a digit to isdigit
        raise InvalidInput(f"pageSize must be 1-{maximum}.", field="pageSize")
    return int(raw)


@contextmanager
def counted(action: str, req: func.HttpRequest, *ids: str) -> Iterator[None]:
    """Names the item on the action's span and counts the action in ``settle.operator.actions`` by
    outcome (the span's, once the block has set it; a refusal's slug; a dependency's 503). The principal
    is in the audit row, not in telemetry."""
    names = (
        ("nimbus.endpoint", "nimbus.event_id")
        if action not in ("replay", "dismiss")
        else ("settle.poison.day", "settle.poison.id")
    )
    telemetry.annotate({name: req.route_params.get(route) for name, route in zip(names, ids, strict=True)})
    try:
        yield
    except SettleError as exc:
        telemetry.add("settle.operator.actions", action=action, outcome=exc.slug)
        raise
    except Exception as exc:
        mapped = dependency_problem(exc)
        telemetry.add("settle.operator.actions", action=action, outcome=mapped.slug if mapped else "error")
        raise
    telemetry.add("settle.operator.actions", action=action, outcome=telemetry.current().outcome or "ok")


def operator_read(
    bp: func.Blueprint,
    route: str,
    summary: str,
    response: openapi.ModelRef,
    *,
    method: str = "GET",
    request: openapi.ModelRef | None = None,
    responses: dict[int, str] = AUTH,
    parameters: tuple[dict[str, Any], ...] = (),
    query_route: str | None = None,
) -> Callable[[Handler], Any]:
    """Registers a read for operators: the principal is checked (:func:`common.principal.require_operator`)
    before the handler runs."""

    def decorate(handler: Handler) -> Any:
        def checked(req: func.HttpRequest) -> Any:
            require_operator(req)
            return handler(req)

        checked.__name__ = checked.__qualname__ = handler.__name__
        checked.__doc__ = handler.__doc__
        return operation(
            bp,
            route=route,
            query_route=query_route,
            method=method,
            summary=summary,
            request=request,
            response=response,
            responses=responses,
            parameters=parameters,
            anonymous=True,
            tag=TAG,
        )(checked)

    return decorate


def on_item(
    bp: func.Blueprint,
    route: str,
    action: str,
    summary: str,
    request: openapi.ModelRef,
    response: openapi.ModelRef,
    responses: dict[int, str],
    *,
    ok_status: int = 200,
    span: str | None = None,
) -> Callable[[Handler], Any]:
    """Registers an operator action, ``POST v1/<route>/<action>`` where ``route`` holds the item's ids
    (``events/{endpointId}/{eventId}``), and its query twin (the ids left out of the route), with the span
    ``settle.operator.<span or action>``."""
    ids = re.findall(r"\{(\w+)\}", route)
    return operation(
        bp,
        route=f"v1/{route}/{action}",
        query_route="/".join(("v1", *(part for part in route.split("/") if "{" not in part), action)),
        method="POST",
        span=f"settle.operator.{span or action}",
        summary=summary,
        request=request,
        response=response,
        responses=responses,
        parameters=tuple(path_parameter(name) for name in ids),
        anonymous=True,
        ok_status=ok_status,
        tag=TAG,
    )


@contextmanager
def acting(
    action: str, req: func.HttpRequest, model: type[Any], *ids: str, needs_body: bool = True
) -> Iterator[tuple[Any, Actor, list[str]]]:
    """An operator action on the item the route values ``ids`` name, :func:`counted`: its body (or, when
    ``needs_body`` is false and none is sent, the model's defaults), who acts (``by`` names them when no
    principal is signed in) and the ids' values, checked in that order."""
    with counted(action, req, *ids):
        body = parse_body(req, model) if needs_body else body_or_defaults(req, model)
        actor = actor_of(req, body.by)
        yield body, actor, [route_value(req, name) for name in ids]
