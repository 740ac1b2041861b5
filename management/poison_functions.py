"""The poison desk's functions: a day's poison messages, replay one through the resolver, dismiss one.
Thin: parse, check who, call :class:`management.poison.PoisonDesk`. The models and the desk are imported by
the handler that needs them: indexing and a cold start load none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import azure.functions as func

from common import openapi, telemetry
from common.errors import InvalidInput
from common.http import Handler
from management import services
from management.api import (
    AUTH,
    CONTINUATION,
    INVALID,
    PAGE_SIZE,
    acting,
    models,
    on_item,
    operator_read,
    page_size,
)

if TYPE_CHECKING:
    from management.models import (
        PoisonEntry,
        PoisonPage,
        ReplayAnswer,
    )


bp = func.Blueprint()


# -- poison ---------------------------------------------------------------------------------------


@operator_read(
    bp,
    "v1/poison",
    "Poison messages of one UTC day (reason, whole body, replay record), in enqueue order",
    lambda: models.PoisonPage,
    responses=INVALID,
    parameters=(
        {"name": "day", "in": "query", "required": True, "schema": {"type": "string", "pattern": "^\\d{8}$"}},
        PAGE_SIZE,
        CONTINUATION,
    ),
)
def poison_list(req: func.HttpRequest) -> PoisonPage:
    from common import page_tokens
    from management.models import PoisonEntry, PoisonPage

    day = req.params.get("day") or ""
    if not day:
        raise InvalidInput("day (YYYYMMDD) is required.", field="day")
    bound = page_tokens.binding("poison", day)
    token = req.params.get("continuationToken")
    after = page_tokens.strings(page_tokens.decode(token, bound), 1)[0] if token else None
    if after is not None and not after.startswith(day):  # a row key begins with its enqueue day
        raise page_tokens.refused()
    rows, last = services.poison_desk().page(day, after=after, limit=page_size(req, 50, 200))
    return PoisonPage(
        day=day,
        items=[PoisonEntry.of(day, r) for r in rows],
        continuation_token=page_tokens.encode(bound, [last]) if last else None,
    )


_UNKNOWN = {404: "Unknown poison message"}


def _on_poison(
    action: str,
    summary: str,
    request: openapi.ModelRef,
    response: openapi.ModelRef,
    refusals: dict[int, str],
) -> Callable[[Handler], Any]:
    """Registers ``POST v1/poison/{day}/{id}/<action>`` and its query twin."""
    return on_item(bp, "poison/{day}/{id}", action, summary, request, response, {**AUTH, **refusals})


@_on_poison(
    "replay",
    "Replay a poison message through the resolver; answers the outcome (409 if replayed before)",
    lambda: models.ReplayRequest,
    lambda: models.ReplayAnswer,
    {**_UNKNOWN, 409: "Replayed before", 503: "Storage unavailable"},
)
def poison_replay(req: func.HttpRequest) -> ReplayAnswer:
    from management.models import PoisonEntry, ReplayAnswer, ReplayRequest
    from management.poison import Edits

    with acting("replay", req, ReplayRequest, "day", "id", needs_body=False) as (body, actor, (day, item)):
        edits = Edits(
            message_content=body.message_content, application_properties=body.application_properties
        )
        result = services.poison_desk().replay(day, item, actor, edits)
        telemetry.current().set_outcome(result.outcome)
        return ReplayAnswer(
            outcome=result.outcome,
            detail=result.detail,
            replayed=result.replayed,
            poison=PoisonEntry.of(result.day, result.row),
        )


@_on_poison(
    "dismiss",
    "Dismiss (archive) a poison message no fix will project: recorded with its reason, audited",
    lambda: models.DismissRequest,
    lambda: models.PoisonEntry,
    {400: "No reason", **_UNKNOWN, 409: "Dismissed or projected before"},
)
def poison_dismiss(req: func.HttpRequest) -> PoisonEntry:
    from management.models import DismissRequest, PoisonEntry

    with acting("dismiss", req, DismissRequest, "day", "id") as (body, actor, (day, item)):
        row = services.poison_desk().dismiss(day, item, actor, body.reason)
        return PoisonEntry.of(day, row)
