"""State records for operators: look one up with its history, the stuck ones, a tenant's query."""

from __future__ import annotations

from typing import TYPE_CHECKING

import azure.functions as func

from common.http import operation, parse_body
from common.principal import require_operator
from management.api import (
    AUTH,
    MODELS,
    TAG,
)
from state.schemas import HistoryRequest, QueryRequest, RecordPage

if TYPE_CHECKING:
    from management.models import (
        RecordLookup,
        StuckRecords,
    )

bp = func.Blueprint()


# -- state records ----------------------------------------------------------------------------------


@operation(
    bp,
    route="v1/records/lookup",
    method="POST",
    summary="A state record by its key, with its history (for operators)",
    request=HistoryRequest,
    response=MODELS + "RecordLookup",
    responses={**AUTH, 400: "Invalid key (the problem names the field)"},
    anonymous=True,
    tag=TAG,
)
def records_lookup(req: func.HttpRequest) -> RecordLookup:
    from management.models import RecordLookup

    require_operator(req)
    from management.records import lookup

    record, history = lookup(parse_body(req, HistoryRequest))
    return RecordLookup(record=record, history=history)


@operation(
    bp,
    route="v1/records/stuck",
    method="GET",
    summary="Records stuck in Processing past their lock (from the lock-expiry index, never a scan)",
    response=MODELS + "StuckRecords",
    responses=AUTH,
    anonymous=True,
    tag=TAG,
)
def records_stuck(req: func.HttpRequest) -> StuckRecords:
    from management.models import StuckRecords

    require_operator(req)
    from management.records import stuck

    items = stuck()
    return StuckRecords(count=len(items), items=items)


@operation(
    bp,
    route="v1/records/query",
    method="POST",
    summary="Records of a tenant by scope (id or name), entity, status and time, for operators (state query)",
    request=QueryRequest,
    response=RecordPage,
    responses={**AUTH, 400: "Invalid filter (the problem names the field)"},
    anonymous=True,
    tag=TAG,
)
def records_query(req: func.HttpRequest) -> RecordPage:
    require_operator(req)
    from state import service as state_service

    body: QueryRequest = parse_body(req, QueryRequest)
    return state_service.handler(body.handler).query(body)
