"""The poison desk's functions: a day's poison messages, replay one through the resolver, dismiss one.
Thin: parse, check who, call :class:`management.poison.PoisonDesk`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import azure.functions as func

from common import telemetry
from common.errors import InvalidInput
from common.http import operation, parse_body
from common.principal import actor_of, require_operator
from handoff.limits import route_value
from management import services
from management.api import (
    AUTH,
    MODELS,
    TAG,
    body_or_defaults,
    counted,
    page_size,
)

if TYPE_CHECKING:
    from management.models import (
        DismissRequest,
        PoisonEntry,
        PoisonPage,
        ReplayAnswer,
        ReplayRequest,
    )

bp = func.Blueprint()


# -- poison ---------------------------------------------------------------------------------------


@operation(
    bp,
    route="v1/poison",
    method="GET",
    summary="Poison messages of one UTC day (reason, whole body, replay record), in enqueue order",
    response=MODELS + "PoisonPage",
    responses={**AUTH, 400: "Invalid parameter"},
    parameters=(
        {"name": "day", "in": "query", "required": True, "schema": {"type": "string", "pattern": "^\\d{8}$"}},
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
        {"name": "continuationToken", "in": "query", "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=TAG,
)
def poison_list(req: func.HttpRequest) -> PoisonPage:
    from management.models import PoisonEntry, PoisonPage

    require_operator(req)
    from handoff.overview import decode_continuation, encode_continuation

    day = req.params.get("day") or ""
    if not day:
        raise InvalidInput("day (YYYYMMDD) is required.", field="day")
    token = req.params.get("continuationToken")
    rows, last = services.poison_desk().page(
        day, after=decode_continuation(token) if token else None, limit=page_size(req, 50, 200)
    )
    return PoisonPage(
        day=day,
        items=[PoisonEntry.of(day, r) for r in rows],
        continuation_token=encode_continuation(last) if last else None,
    )


@operation(
    bp,
    route="v1/poison/{day}/{id}/replay",
    query_route="v1/poison/replay",
    method="POST",
    span="settle.operator.replay",
    summary="Replay a poison message through the resolver; answers the outcome (409 if replayed before)",
    request=MODELS + "ReplayRequest",
    response=MODELS + "ReplayAnswer",
    responses={**AUTH, 404: "Unknown poison message", 409: "Replayed before", 503: "Storage unavailable"},
    parameters=(
        {"name": "day", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=TAG,
)
def poison_replay(req: func.HttpRequest) -> ReplayAnswer:
    from management.models import PoisonEntry, ReplayAnswer, ReplayRequest

    with counted("replay", req, "day", "id"):
        body: ReplayRequest = body_or_defaults(req, ReplayRequest)
        actor = actor_of(req, body.by)
        from management.poison import Edits

        edits = Edits(
            message_content=body.message_content, application_properties=body.application_properties
        )
        result = services.poison_desk().replay(route_value(req, "day"), route_value(req, "id"), actor, edits)
        telemetry.current().set_outcome(result.outcome)
        return ReplayAnswer(
            outcome=result.outcome,
            detail=result.detail,
            replayed=result.replayed,
            poison=PoisonEntry.of(result.day, result.row),
        )


@operation(
    bp,
    route="v1/poison/{day}/{id}/dismiss",
    query_route="v1/poison/dismiss",
    method="POST",
    span="settle.operator.dismiss",
    summary="Dismiss (archive) a poison message no fix will project: recorded with its reason, audited",
    request=MODELS + "DismissRequest",
    response=MODELS + "PoisonEntry",
    responses={
        **AUTH,
        400: "No reason",
        404: "Unknown poison message",
        409: "Dismissed or projected before",
    },
    parameters=(
        {"name": "day", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
    ),
    anonymous=True,
    tag=TAG,
)
def poison_dismiss(req: func.HttpRequest) -> PoisonEntry:
    from management.models import DismissRequest, PoisonEntry

    with counted("dismiss", req, "day", "id"):
        body: DismissRequest = parse_body(req, DismissRequest)
        actor = actor_of(req, body.by)
        day = route_value(req, "day")
        row = services.poison_desk().dismiss(day, route_value(req, "id"), actor, body.reason)
        return PoisonEntry.of(day, row)
