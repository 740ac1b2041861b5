"""How ``settle`` prints, without a server: a cell says absent and empty apart, times as the API writes
them, a table fits the terminal it is given (and cuts nothing in a pipe), JSON keeps everything."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from settle_client import _cli_output as out
from settle_client.operator_models import FoundEvent

API_TIME = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"


def test_a_cell_tells_absent_from_empty_and_shows_times_as_the_api_does() -> None:
    assert out.cell(None) == "—"
    assert out.cell("") == '""'
    plus_two = timezone(timedelta(hours=2))
    moment = datetime(2026, 12, 4, 23, 30, 1, 702_345, tzinfo=plus_two)
    assert out.cell(moment) == "2026-12-04T21:30:01.702Z"
    assert out.cell(True) == "yes" and out.cell({"a": 1}) == '{"a":1}'
    assert out.cell("x" * 100) == "x" * 100  # a cell alone is never cut: the table decides
    assert out.cell("two\nlines") == "two lines"  # a table row stays one line


def test_a_table_aligns_its_columns() -> None:
    text = out.table(("ID", "STATUS"), [("evt-1", "Failed"), ("evt-12345", None)])
    assert text.splitlines() == ["ID         STATUS", "evt-1      Failed", "evt-12345  —"]


def test_a_table_fits_the_width_it_is_given_and_a_wide_terminal_shows_the_whole_reason() -> None:
    reason = "ERP timeout while posting the invoice to the ledger, after 3 attempts; " * 3
    rows = [("Billing", "evt-1", reason)]
    for width in (60, 100, 160):
        lines = out.table(("ENDPOINT", "EVENT", "REASON"), rows, width=width).splitlines()
        assert max(map(len, lines)) <= width, width
    wide = out.table(("ENDPOINT", "EVENT", "REASON"), rows, width=400)
    assert reason.strip() in wide
    assert reason.strip() in out.table(("ENDPOINT", "EVENT", "REASON"), rows)  # a pipe: nothing cut


def test_json_keeps_the_wire_names_everything_and_the_api_time_format() -> None:
    found = FoundEvent(
        endpoint_id="Billing",
        event_id="evt-1",
        resolution_status="Failed",
        reason="x" * 500,
        updated_at=datetime(2026, 12, 4, 17, 8, 24, 702_000, tzinfo=UTC),
    )
    [data] = json.loads(out.as_json([found]))
    assert data["endpointId"] == "Billing" and data["reason"] == "x" * 500 and data["externalJobId"] is None
    assert data["updatedAt"] == "2026-12-04T17:08:24.702Z"
    lines = out.as_jsonl([found, found]).splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == data


def test_an_id_a_shell_would_misread_is_printed_quoted_and_read_back_whole() -> None:
    for poison_id in ("20261204|0001|abc", "a b", "it's", "plain-id_1.2"):
        shown = out.pasteable(poison_id)
        assert shlex.split(shown) == [poison_id]  # pasted into a shell, the id arrives whole
        assert out.unquoted(shown) == poison_id  # pasted into a file or stdin, too
    assert out.pasteable("plain-id_1.2") == "plain-id_1.2"


def test_the_endpoints_table_shows_an_open_count_that_stopped_at_the_cap_and_an_age_of_those_read() -> None:
    from settle_client._cli_commands import _at_least, _or_earlier
    from settle_client.operator_models import EndpointSummary

    # Given an overview item whose Failed count stopped at the server's cap (its oldest age: of those read)
    oldest = "2026-12-04T17:08:24.702Z"
    counts: dict[str, Any] = {"failed": 10000, "pending": 2}
    wire: dict[str, Any] = {"endpointId": "Billing", "counts": counts, "oldestFailedAt": oldest}
    capped = EndpointSummary.model_validate(
        {**wire, "counts": {**counts, "failedAtLeast": True}, "oldestFailedAtLeast": True}
    )
    # When it is read, and shown as the table shows it, Then the count is "10000+" and the age "at or before"
    assert capped.counts.failed_at_least and not capped.counts.pending_at_least
    assert _at_least(capped.counts.failed, capped.counts.failed_at_least) == "10000+"
    assert _or_earlier(capped.oldest_failed_at, capped.oldest_failed_at_least) == f"≤{oldest}"
    # And an answer of a server from before the cap reads as exact
    exact = EndpointSummary.model_validate(wire)
    assert not exact.counts.failed_at_least and not exact.oldest_failed_at_least
    assert _or_earlier(exact.oldest_failed_at, exact.oldest_failed_at_least) == exact.oldest_failed_at
