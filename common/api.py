"""Health check and the OpenAPI document (both anonymous)."""

from __future__ import annotations

import azure.functions as func

from common import openapi
from common.http import anonymous_get, json_response
from common.models import ApiModel
from common.partition_meter import warnings

bp = func.Blueprint()


class Health(ApiModel):
    status: str = "ok"
    version: str = "1.0.0"
    warnings: list[str] = []  # e.g. a partition near its budget (common/partition_meter.py); no I/O


@anonymous_get(bp, "v1/health", "Liveness check (no I/O).", response=Health, tag="meta")
def health(req: func.HttpRequest) -> Health:
    return Health(warnings=warnings())


@anonymous_get(bp, "v1/openapi.json", "This API's OpenAPI 3.1 document.", tag="meta")
def openapi_document(req: func.HttpRequest) -> func.HttpResponse:
    return json_response(openapi.document())
