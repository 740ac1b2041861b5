"""Health check and the OpenAPI document (both anonymous)."""

from __future__ import annotations

import azure.functions as func

from common import openapi
from common.http import json_response, operation
from common.models import ApiModel

bp = func.Blueprint()


class Health(ApiModel):
    status: str = "ok"
    version: str = "1.0.0"
    warnings: list[str] = []  # e.g. a partition near its budget (common/partition_meter.py); no I/O


@operation(
    bp,
    route="v1/health",
    method="GET",
    summary="Liveness check (no I/O).",
    response=Health,
    anonymous=True,
    tag="meta",
)
def health(req: func.HttpRequest) -> Health:
    from common.partition_meter import warnings

    return Health(warnings=warnings())


@operation(
    bp,
    route="v1/openapi.json",
    method="GET",
    summary="This API's OpenAPI 3.1 document.",
    anonymous=True,
    tag="meta",
)
def openapi_document(req: func.HttpRequest) -> func.HttpResponse:
    return json_response(openapi.document())
