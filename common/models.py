"""Base classes for the pydantic models at every boundary (HTTP JSON is camelCase)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, field_serializer
from pydantic.alias_generators import to_camel

from common.clock import iso


class ApiModel(BaseModel):
    """A response or nested model: camelCase on the wire, snake_case in Python.

    Every time in JSON is one format, ISO-8601 UTC to the millisecond (``2026-05-01T09:30:04.585Z``):
    what Settle stores, and what tokens and the expiry index carry."""

    # defer_build: schemas are built on first use, not at import (shorter cold start of the worker).
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, ser_json_timedelta="float", defer_build=True
    )

    # No return annotation on purpose: the OpenAPI schema then keeps each field's own type.
    @field_serializer("*", mode="wrap", when_used="json")
    def _times_to_the_millisecond(self, value: Any, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        if isinstance(value, datetime) and value.tzinfo is not None:
            return iso(value)
        return handler(value)


class RequestModel(ApiModel):
    """A request body: strict types (``"5"`` is not an int) and unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)


def from_fields[M: BaseModel](model: type[M], source: BaseModel, /, **overrides: Any) -> M:
    """``model`` built from the fields of ``source`` that it shares by name, then ``overrides``.

    For views of a stored row (and rows of a parsed message): a field added to both is carried without
    a third edit. An override must name a field of ``model`` (a misspelt one is a ``TypeError``, as a
    keyword argument would be); whatever ``model`` requires and neither side gives fails validation."""
    unknown = sorted(set(overrides) - set(model.model_fields))
    if unknown:
        raise TypeError(f"{model.__name__} has no field {', '.join(unknown)}")
    shared = type(source).model_fields.keys() & model.model_fields.keys()
    values = {name: getattr(source, name) for name in shared}
    values.update(overrides)
    return model.model_validate(values)
