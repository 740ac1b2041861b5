"""Base classes for the pydantic models at every boundary (HTTP JSON is camelCase)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """A response or nested model: camelCase on the wire, snake_case in Python."""

    # defer_build: schemas are built on first use, not at import (shorter cold start of the worker).
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, ser_json_timedelta="float", defer_build=True
    )


class RequestModel(ApiModel):
    """A request body: strict types (``"5"`` is not an int) and unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)
