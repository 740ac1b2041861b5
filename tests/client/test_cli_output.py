"""How ``settle`` prints, without a server: a cell says absent and empty apart, times in UTC, long text
cut (never in JSON), columns aligned."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from settle_client import _cli_output as out
from settle_client.operator_models import FoundEvent


def test_a_cell_tells_absent_from_empty_and_shows_times_in_utc() -> None:
    assert out.cell(None) == "—"
    assert out.cell("") == '""'
    plus_two = timezone(timedelta(hours=2))
    assert out.cell(datetime(2026, 12, 4, 23, 30, tzinfo=plus_two)) == "2026-12-04 21:30:00Z"
    assert out.cell(True) == "yes" and out.cell({"a": 1}) == '{"a":1}'
    assert out.cell("x" * 100) == "x" * 59 + "…"
    assert out.cell("two\nlines") == "two lines"  # a table row stays one line


def test_a_table_aligns_its_columns() -> None:
    text = out.table(("ID", "STATUS"), [("evt-1", "Failed"), ("evt-12345", None)])
    assert text.splitlines() == ["ID         STATUS", "evt-1      Failed", "evt-12345  —"]


def test_json_keeps_the_wire_names_and_everything() -> None:
    found = FoundEvent(
        endpoint_id="Billing",
        event_id="evt-1",
        resolution_status="Failed",
        reason="x" * 500,
        updated_at=datetime(2026, 12, 4, tzinfo=UTC),
    )
    [data] = json.loads(out.as_json([found]))
    assert data["endpointId"] == "Billing" and data["reason"] == "x" * 500 and data["externalJobId"] is None
