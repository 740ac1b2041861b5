"""State records for operators: look one up with its history, the stuck ones, a tenant's query. The models
and the record reads are imported by the handler that needs them: indexing and a cold start load neither."""

from __future__ import annotations

from typing import TYPE_CHECKING

import azure.functions as func

from common.http import parse_body
from management.api import AUTH, CONTINUATION, models, operator_read, page_size
from state import service as state_service
from state.schemas import HistoryRequest, QueryRequest, RecordPage

if TYPE_CHECKING:
    from management.models import (
        RecordLookup,
        StuckRecords,
    )


bp = func.Blueprint()


# -- state records ----------------------------------------------------------------------------------


@operator_read(
    bp,
    "v1/records/lookup",
    "A state record by its key, with its history (for operators)",
    lambda: models.RecordLookup,
    method="POST",
    request=HistoryRequest,
    responses={**AUTH, 400: "Invalid key (the problem names the field)"},
)
def records_lookup(req: func.HttpRequest) -> RecordLookup:
    from management.models import RecordLookup
    from management.records import lookup

    record, history = lookup(parse_body(req, HistoryRequest))
    return RecordLookup(record=record, history=history)


@operator_read(
    bp,
    "v1/records/stuck",
    "Records stuck in Processing past their lock (from the lock-expiry index, never a scan), page by page",
    lambda: models.StuckRecords,
    responses={**AUTH, 400: "A bad pageSize or continuationToken (the problem names it)"},
    parameters=(
        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
        CONTINUATION,
    ),
)
def records_stuck(req: func.HttpRequest) -> StuckRecords:
    from common import page_tokens
    from management.models import StuckRecords
    from management.records import MAX_STUCK, stuck

    bound = page_tokens.binding("stuck")
    token = req.params.get("continuationToken")
    after = None
    if token:
        position = page_tokens.decode(token, bound)
        shaped = isinstance(position, list) and len(position) == 3 and isinstance(position[0], int)
        bucket, partition, row_key = position if shaped else (0, None, None)
        if not (shaped and isinstance(partition, str) and isinstance(row_key, str)):
            raise page_tokens.refused()
        after = (bucket, partition, row_key)
    items, last = stuck(limit=page_size(req, MAX_STUCK, 1000), after=after)
    return StuckRecords(
        count=len(items),
        items=items,
        continuation_token=page_tokens.encode(bound, list(last)) if last else None,
    )


@operator_read(
    bp,
    "v1/records/query",
    "Records of a tenant by scope (id or name), entity, status and time, for operators (state query)",
    RecordPage,
    method="POST",
    request=QueryRequest,
    responses={**AUTH, 400: "Invalid filter (the problem names the field)"},
)
def records_query(req: func.HttpRequest) -> RecordPage:
    body: QueryRequest = parse_body(req, QueryRequest)
    return state_service.handler(body.handler).query(body)
