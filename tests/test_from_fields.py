"""common.models.from_fields: a view built from the same-named fields of a row, plus overrides."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, ValidationError

from common.models import ApiModel, from_fields


class Row(BaseModel):
    event_id: str
    enqueued_time_utc: datetime
    internal: str = "kept out"
    size: int = 3


class View(ApiModel):
    event_id: str
    enqueued_time_utc: datetime
    size: int
    label: str | None = None


def test_shared_fields_are_carried_and_overrides_win() -> None:
    at = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)
    view = from_fields(View, Row(event_id="e1", enqueued_time_utc=at), size=7, label="x")
    assert view == View(event_id="e1", enqueued_time_utc=at, size=7, label="x")
    assert "internal" not in view.model_dump()


def test_a_misspelt_override_is_a_type_error() -> None:
    row = Row(event_id="e1", enqueued_time_utc=datetime(2026, 5, 1, tzinfo=UTC))
    with pytest.raises(TypeError, match="labl"):
        from_fields(View, row, labl="x")


def test_a_required_field_neither_side_gives_fails_validation() -> None:
    class Wide(ApiModel):
        event_id: str
        missing: str

    with pytest.raises(ValidationError, match="missing"):
        from_fields(Wide, Row(event_id="e1", enqueued_time_utc=datetime(2026, 5, 1, tzinfo=UTC)))
