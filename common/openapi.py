"""The OpenAPI document, generated from the pydantic models the HTTP functions use.

Each HTTP operation registers itself (at import, no I/O) through :func:`register`; ``document()``
builds the OpenAPI 3.1 document once and caches it. An operation names its models as objects asked for
lazily (``lambda: models.EventPage``, ``models`` a :class:`LazyModels`): they are imported when the document
is built or a handler first parses a body, so an API that a cold start does not call costs it nothing; so
is pydantic's JSON schema generator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from pydantic.json_schema import JsonSchemaMode

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details. `field` names the offending request field, when there is one.",
    "properties": {
        "type": {"type": "string", "examples": ["urn:settle:problem:invalid-input"]},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "field": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "required": ["type", "title", "status"],
}


# A model class, or a function that returns one, asked only when the document is built or a body is parsed
# (``lambda: models.Name``, so that indexing the app loads no model).
ModelRef = type[BaseModel] | Callable[[], type[BaseModel]]


class LazyModels:
    """A module of API models, imported when one of its models is first asked for. A blueprint binds its
    models module under ``TYPE_CHECKING`` (so mypy checks every ``models.Name``) and to one of these at run
    time: the worker's indexing and a cold start load none of the API's models."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self._module), name)


def resolve(model: ModelRef) -> type[BaseModel]:
    """The model class ``model`` names (a function is called now)."""
    found: Any = model if isinstance(model, type) else model()
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise TypeError(f"{model} is not a pydantic model")
    return found


@dataclass(frozen=True)
class Operation:
    path: str  # as served, e.g. /api/v1/state/lock
    method: str
    operation_id: str
    summary: str
    request: ModelRef | None = None
    response: ModelRef | None = None
    responses: dict[int, str] = field(default_factory=dict)
    parameters: tuple[dict[str, Any], ...] = ()
    anonymous: bool = False
    tag: str = "settle"


_OPERATIONS: list[Operation] = []


def register(operation: Operation) -> None:
    _OPERATIONS.append(operation)
    document.cache_clear()


def operations() -> list[Operation]:
    return list(_OPERATIONS)


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    from pydantic.json_schema import models_json_schema

    models: list[type[BaseModel]] = []
    for op in _OPERATIONS:
        for named in (op.request, op.response):
            model = None if named is None else resolve(named)
            if model is not None and model not in models:
                models.append(model)
    keyed: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in models]
    keyed += [(m, "serialization") for m in models]
    refs, schema = models_json_schema(keyed, ref_template="#/components/schemas/{model}", by_alias=True)
    schemas: dict[str, Any] = dict(schema.get("$defs", {}))
    schemas["Problem"] = PROBLEM_SCHEMA
    paths: dict[str, Any] = {}
    for op in _OPERATIONS:
        entry: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "tags": [op.tag],
            "responses": {},
        }
        if op.parameters:
            entry["parameters"] = list(op.parameters)
        if op.request is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(resolve(op.request), "validation")]}},
            }
        ok = 200 if op.method.lower() != "post" or 202 not in op.responses else 202
        for status, text in sorted({ok: "OK", **op.responses}.items()):
            response: dict[str, Any] = {"description": text}
            if status < 300 and status != 204 and op.response is not None:
                schema = refs[(resolve(op.response), "serialization")]
                response["content"] = {"application/json": {"schema": schema}}
            elif status >= 400:
                response["content"] = {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
                }
            entry["responses"][str(status)] = response
        if not op.anonymous:
            entry["security"] = [{"functionKey": []}, {"functionKeyQuery": []}]
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Settle",
            "version": "1.0.0",
            "description": "Idempotent node state and hand-off settlement for Azure Functions.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "functionKey": {"type": "apiKey", "in": "header", "name": "x-functions-key"},
                "functionKeyQuery": {"type": "apiKey", "in": "query", "name": "code"},
            },
        },
    }
