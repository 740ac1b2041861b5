"""The state blueprint: HTTP functions under ``/api/v1/state/`` and the catch-up timer.

Each function parses its body into a model, calls one handler method, and answers; errors become
problem+json (see ``common/http.py``). ``state.handlers`` (the storage layer behind them) is imported on
first use, not at indexing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import azure.functions as func
from pydantic import BaseModel

from common import invocation, telemetry
from common.clock import utcnow
from common.http import anonymous_get, json_response, operation, parse_body
from state import schemas, service
from state.model import Scope, retry_after_seconds

if TYPE_CHECKING:
    from state.handlers import StateHandler

bp = func.Blueprint()
log = logging.getLogger("settle.state")


def _handler(body: schemas.KeyRequest | schemas.QueryRequest) -> StateHandler:
    """The handler the body selects; the request's ids go on the operation's span first."""
    if isinstance(body, schemas.KeyRequest):
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
_WRITES = {**_FENCED, 204: "Null handler: nothing written"}


def _held_elsewhere(answer: schemas.LockResponse) -> schemas.LockResponse | func.HttpResponse:
    """A lock held by another caller also says when it may be taken over, as the header a client's retry
    policy reads."""
    if answer.acquired or answer.locked_until is None:
        return answer
    wait = retry_after_seconds(answer.locked_until, utcnow())
    return json_response(answer, headers={"Retry-After": str(wait)})


def _as_is(answer: Any) -> Any:
    return answer


def _serve(
    path: str,
    request: type[schemas.KeyRequest] | type[schemas.QueryRequest],
    response: type[BaseModel],
    responses: dict[int, str],
    summary: str,
    call: Callable[[StateHandler, Any], Any],
    answer: Callable[[Any], Any] = _as_is,
) -> None:
    """Register ``POST v1/state/<path>`` as ``state_<path>``: parse the body into ``request``, ``call`` the
    handler method that serves it, answer (``answer`` may add headers). The span is
    ``settle.state.<last part of the path>``."""
    method = path.rpartition("/")[2]

    def serve(req: func.HttpRequest) -> Any:
        body = parse_body(req, request)
        return answer(call(_handler(body), body))

    serve.__name__ = serve.__qualname__ = "state_" + path.replace("/", "_")
    operation(
        bp,
        route=f"v1/state/{path}",
        method="POST",
        summary=summary,
        request=request,
        response=response,
        responses=responses,
        tag="state",
        span=f"settle.state.{method}",
    )(serve)


# In the order the OpenAPI document lists them. A write answers 204 for the null handler (nothing written).
_serve(
    "exists",
    schemas.KeyRequest,
    schemas.ExistsResponse,
    _BAD,
    "Is the item Processed or Skipped?",
    lambda handler, body: handler.exists(body),
)
_serve(
    "lock",
    schemas.LockRequest,
    schemas.LockResponse,
    _BAD,
    "Try to acquire the processing lock.",
    lambda handler, body: handler.lock(body),
    _held_elsewhere,
)
_serve(
    "lock/extend",
    schemas.ExtendRequest,
    schemas.ExtendResponse,
    _FENCED,
    "Extend a held lock (fenced).",
    lambda handler, body: handler.extend(body),
)
_serve(
    "set",
    schemas.SetRequest,
    schemas.Record,
    _WRITES,
    "Record Processed, Skipped or Failed.",
    lambda handler, body: handler.set(body),
)
_serve(
    "upsert",
    schemas.UpsertRequest,
    schemas.Record,
    _WRITES,
    "Record Processed with new data.",
    lambda handler, body: handler.upsert(body),
)
_serve(
    "release",
    schemas.ReleaseRequest,
    schemas.Record,
    _WRITES,
    "Release the lock as Failed.",
    lambda handler, body: handler.release(body),
)
_serve(
    "get",
    schemas.KeyRequest,
    schemas.Record,
    {**_BAD, 404: "No record"},
    "The current record.",
    lambda handler, body: handler.get(body),
)
_serve(
    "query",
    schemas.QueryRequest,
    schemas.RecordPage,
    _BAD,
    "Records of a tenant, filtered and paged.",
    lambda handler, body: handler.query(body),
)
_serve(
    "history",
    schemas.HistoryRequest,
    schemas.RecordPage,
    _BAD,
    "Every version of a record, newest first.",
    lambda handler, body: handler.history(body),
)


@anonymous_get(
    bp,
    "v1/state/meta",
    "Codes and names of scopes and statuses, and the handler names (no I/O).",
    response=schemas.StateMeta,
    tag="state",
    span="settle.state.meta",
)
def state_meta(req: func.HttpRequest) -> schemas.StateMeta:
    from state.handlers import meta

    return meta()


@bp.function_name("state_catchup")
@bp.timer_trigger(
    arg_name="timer", schedule="%STATE_CATCHUP_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def state_catchup(timer: func.TimerRequest, context: func.Context = None) -> None:  # type: ignore[assignment]
    """Expired locks become Failed; records past retention become Expired (bounded runs, drained). Its
    spans are children of the host's invocation (``context``). It gives up on storage after
    ``TIMER_DEADLINE_S``; the next run goes on."""
    if timer.past_due:
        log.info("state catch-up is running late")
    with invocation.within(invocation.TIMER_DEADLINE_S), telemetry.invocation(context):
        service.catchup().drain()
