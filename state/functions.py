"""The state blueprint: HTTP functions under ``/api/v1/state/`` and the catch-up timer.

Each function parses its body into a model, calls one handler method, and answers; errors become
problem+json (see ``common/http.py``).
"""

from __future__ import annotations

import logging

import azure.functions as func

from common.http import operation, parse_body
from state import service
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

bp = func.Blueprint()
log = logging.getLogger("settle.state")

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
)
def state_exists(req: func.HttpRequest) -> ExistsResponse:
    body = parse_body(req, KeyRequest)
    return service.handler(body.handler).exists(body)


@operation(
    bp,
    route="v1/state/lock",
    method="POST",
    summary="Try to acquire the processing lock.",
    request=LockRequest,
    response=LockResponse,
    responses=_BAD,
    tag="state",
)
def state_lock(req: func.HttpRequest) -> LockResponse:
    body = parse_body(req, LockRequest)
    return service.handler(body.handler).lock(body)


@operation(
    bp,
    route="v1/state/lock/extend",
    method="POST",
    summary="Extend a held lock (fenced).",
    request=ExtendRequest,
    response=ExtendResponse,
    responses=_FENCED,
    tag="state",
)
def state_lock_extend(req: func.HttpRequest) -> ExtendResponse:
    body = parse_body(req, ExtendRequest)
    return service.handler(body.handler).extend(body)


@operation(
    bp,
    route="v1/state/set",
    method="POST",
    summary="Record Processed, Skipped or Failed.",
    request=SetRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
)
def state_set(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, SetRequest)
    return service.handler(body.handler).set(body)


@operation(
    bp,
    route="v1/state/upsert",
    method="POST",
    summary="Record Processed with new data.",
    request=UpsertRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
)
def state_upsert(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, UpsertRequest)
    return service.handler(body.handler).upsert(body)


@operation(
    bp,
    route="v1/state/release",
    method="POST",
    summary="Release the lock as Failed.",
    request=ReleaseRequest,
    response=Record,
    responses={**_FENCED, 204: "Null handler: nothing written"},
    tag="state",
)
def state_release(req: func.HttpRequest) -> Record | None:
    body = parse_body(req, ReleaseRequest)
    return service.handler(body.handler).release(body)


@operation(
    bp,
    route="v1/state/get",
    method="POST",
    summary="The current record.",
    request=KeyRequest,
    response=Record,
    responses={**_BAD, 404: "No record"},
    tag="state",
)
def state_get(req: func.HttpRequest) -> Record:
    body = parse_body(req, KeyRequest)
    return service.handler(body.handler).get(body)


@operation(
    bp,
    route="v1/state/query",
    method="POST",
    summary="Records of a tenant, filtered and paged.",
    request=QueryRequest,
    response=RecordPage,
    responses=_BAD,
    tag="state",
)
def state_query(req: func.HttpRequest) -> RecordPage:
    body = parse_body(req, QueryRequest)
    return service.handler(body.handler).query(body)


@operation(
    bp,
    route="v1/state/history",
    method="POST",
    summary="Every version of a record, newest first.",
    request=HistoryRequest,
    response=RecordPage,
    responses=_BAD,
    tag="state",
)
def state_history(req: func.HttpRequest) -> RecordPage:
    body = parse_body(req, HistoryRequest)
    return service.handler(body.handler).history(body)


@operation(
    bp,
    route="v1/state/meta",
    method="GET",
    summary="Codes and names of scopes and statuses, and the handler names (no I/O).",
    response=StateMeta,
    anonymous=True,
    tag="state",
)
def state_meta(req: func.HttpRequest) -> StateMeta:
    from state.handlers import meta

    return meta()


@bp.function_name("state_catchup")
@bp.timer_trigger(
    arg_name="timer", schedule="%STATE_CATCHUP_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def state_catchup(timer: func.TimerRequest) -> None:
    """Expired locks become Failed; records past retention become Expired (bounded work per run)."""
    if timer.past_due:
        log.info("state catch-up is running late")
    service.catchup().run()
