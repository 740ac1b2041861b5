"""The state blueprint: HTTP functions under ``/api/v1/state/`` and the catch-up timer.

Each function parses its body into a model, calls one handler method, and answers; errors become
problem+json (see ``common/http.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import azure.functions as func

from common import telemetry
from common.clock import utcnow
from common.http import json_response, operation, parse_body
from state import service
from state.model import Scope, retry_after_seconds
from state.schemas import (
    ExistsResponse,
    ExtendRequest,
    ExtendResponse,
    HistoryRequest,
    KeyRequest,
    LockRequest,
    LockResponse,
    QueryRequest,
    Record,
    RecordPage,
    ReleaseRequest,
    SetRequest,
    StateMeta,
    UpsertRequest,
)

if TYPE_CHECKING:
    from state.handlers import StateHandler

bp = func.Blueprint()
log = logging.getLogger("settle.state")


def _handler(body: KeyRequest | QueryRequest) -> StateHandler:
    """The handler the body selects; the request's ids go on the operation's span first."""
    if isinstance(body, KeyRequest):
        key = body.key
        telemetry.annotate(
            {
                "settle.tenant_id": key.tenant_id,
                "settle.scope": Scope(key.scope_id).code if key.scope_id else None,
                "settle.entity_id": key.entity_id,
                "settle.entity_execution_id": key.entity_execution_id,
                "settle.item_entity_key": key.item_entity_key,
                "settle.item_key": key.item_key,
                "settle.sub_item_entity_key": key.sub_item_entity_key or None,
                "settle.sub_item_key": key.sub_item_key or None,
                "settle.handler": body.handler.key,
            }
        )
    else:
        telemetry.annotate(
            {
                "settle.tenant_id": body.tenant_id,
                "settle.scope": Scope(body.scope_id).code if body.scope_id else body.scope,
                "settle.entity_id": body.entity_id,
                "settle.handler": body.handler.key,
            }
        )
    return service.handler(body.handler)


_BAD = {400: "Invalid input (problem+json names the field)", 413: "Data too large"}
_FENCED = {**_BAD, 409: "The lock token no longer holds the lock"}


@operation(
    bp,
    route="v1/state/exists",
    method="POST",
    summary="Is the item Processed or Skipped?",
    request=KeyRequest,
    response=ExistsResponse,
    responses=_BAD,
    tag="state",
    span="settle.state.exists",
)
def state_exists(req: func.HttpRequest) -> ExistsResponse:
    body = parse_body(req, KeyRequest)
    return _handler(body).exists(body)


@operation(
    bp,
    route="v1/state/lock",
    method="POST",
    summary="Try to acquire the processing lock.",
    request=LockRequest,
    response=LockResponse,
    responses=_BAD,
    tag="state",
    span="settle.state.lock",
)
def state_lock(req: func.HttpRequest) -> LockResponse | func.HttpResponse:
    body = parse_body(req, LockRequest)
    answer = _handler(body).lock(body)
    if answer.acquired or answer.locked_until is None:
        return answer
    # Held by another caller: when it may be taken over, as the header a client's retry policy reads.
    wait = retry_after_seconds(answer.locked_until, utcnow())
    return json_response(answer, headers={"Retry-After": str(wait)})


@operation(
    bp,
    route="v1/state/lock/extend",
    method="POST",
    summary="Extend a held lock (fenced).",
    request=ExtendRequest,
    response=ExtendResponse,
    responses=_FENCED,
    tag="state",
    span="settle.state.extend",
)
def state_lock_extend(req: func.HttpRequest) -> ExtendResponse:
    body = parse_body(req, ExtendRequest)
    return _handler(body).extend(body)


@operation(
    bp,
    route="v1/state/set",
    method="POST",
    summary="Record Processed, Skipped or Failed.",
    request=SetRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
    span="settle.state.set",
)
def state_set(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, SetRequest)
    return _handler(body).set(body)


@operation(
    bp,
    route="v1/state/upsert",
    method="POST",
    summary="Record Processed with new data.",
    request=UpsertRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
    span="settle.state.upsert",
)
def state_upsert(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, UpsertRequest)
    return _handler(body).upsert(body)


@operation(
    bp,
    route="v1/state/release",
    method="POST",
    summary="Release the lock as Failed.",
    request=ReleaseRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
    span="settle.state.release",
)
def state_release(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, ReleaseRequest)
    return _handler(body).release(body)


@operation(
    bp,
    route="v1/state/get",
    method="POST",
    summary="The current record.",
    request=KeyRequest,
    response=Record,
    responses={**_BAD, 404: "No record"},
    tag="state",
    span="settle.state.get",
)
def state_get(req: func.HttpRequest) -> Record:
    body = parse_body(req, KeyRequest)
    return _handler(body).get(body)


@operation(
    bp,
    route="v1/state/query",
    method="POST",
    summary="Records of a tenant, filtered and paged.",
    request=QueryRequest,
    response=RecordPage,
    responses=_BAD,
    tag="state",
    span="settle.state.query",
)
def state_query(req: func.HttpRequest) -> RecordPage:
    body = parse_body(req, QueryRequest)
    return _handler(body).query(body)


@operation(
    bp,
    route="v1/state/history",
    method="POST",
    summary="Every version of a record, newest first.",
    request=HistoryRequest,
    response=RecordPage,
    responses=_BAD,
    tag="state",
    span="settle.state.history",
)
def state_history(req: func.HttpRequest) -> RecordPage:
    body = parse_body(req, HistoryRequest)
    return _handler(body).history(body)


@operation(
    bp,
    route="v1/state/meta",
    method="GET",
    summary="Codes and names of scopes and statuses, and the handler names (no I/O).",
    response=StateMeta,
    anonymous=True,
    tag="state",
    span="settle.state.meta",
)
def state_meta(req: func.HttpRequest) -> StateMeta:
    from state.handlers import meta

    return meta()


@bp.function_name("state_catchup")
@bp.timer_trigger(
    arg_name="timer", schedule="%STATE_CATCHUP_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def state_catchup(timer: func.TimerRequest, context: func.Context = None) -> None:  # type: ignore[assignment]
    """Expired locks become Failed; records past retention become Expired (bounded runs, drained). Its
    spans are children of the host's invocation (``context``)."""
    if timer.past_due:
        log.info("state catch-up is running late")
    with telemetry.invocation(context):
        service.catchup().drain()
