"""The development host's pure parts: NCRONTAB schedules, route templates, settings."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devtools.host import (
    RouteTemplate,
    Schedule,
    apply_settings,
    decode_path,
    read_settings,
    resolve_expression,
    route_prefix,
)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("0 */1 * * * *", "2026-11-30T10:15:42", "2026-11-30T10:16:00"),
        ("*/15 * * * * *", "2026-11-30T10:15:45", "2026-11-30T10:16:00"),
        ("0 30 9 * * Mon-Fri", "2026-11-28T12:00:00", "2026-11-30T09:30:00"),  # Saturday → Monday
        ("0 0 0 1 Jan *", "2026-11-30T00:00:00", "2027-01-01T00:00:00"),
        ("5,10 0 12 * * *", "2026-11-30T12:00:05", "2026-11-30T12:00:10"),
        ("0 0 * * * 0", "2026-11-30T00:00:00", "2026-12-06T00:00:00"),  # Sunday
        ("0 0 * * * 7", "2026-11-30T00:00:00", "2026-12-06T00:00:00"),  # Sunday written as 7
    ],
)
def test_next_occurrence(expression: str, after: str, expected: str) -> None:
    assert Schedule.parse(expression).next_after(at(after)) == at(expected)


def test_both_day_fields_must_match_as_in_ncrontab() -> None:
    # The 13th that is a Friday (NCrontab ANDs day-of-month and day-of-week).
    assert Schedule.parse("0 0 0 13 * Fri").next_after(at("2026-11-30T00:00:00")) == at("2027-08-13T00:00:00")


@pytest.mark.parametrize("expression", ["* * * * *", "0 61 * * * *", "0 0 0 * 13 *", "x * * * * *"])
def test_invalid_schedules_are_refused(expression: str) -> None:
    with pytest.raises(ValueError):
        Schedule.parse(expression)


def test_setting_expressions_resolve_from_settings_and_a_missing_one_is_an_error() -> None:
    assert resolve_expression("%SCHED%", {"SCHED": "0 */5 * * * *"}) == "0 */5 * * * *"
    with pytest.raises(KeyError, match="MISSING"):
        resolve_expression("%MISSING%", {})


@pytest.mark.parametrize(
    ("template", "path", "expected"),
    [
        ("v1/state/lock", "/api/v1/state/lock", {}),
        ("v1/handoffs/{endpointId}/next", "/api/v1/handoffs/Billing/next", {"endpointId": "Billing"}),
        (
            "v1/events/{endpointId}/{eventId}",
            "/api/v1/events/Bil ling/e-1",
            {"endpointId": "Bil ling", "eventId": "e-1"},
        ),
        # The path is decoded before matching: a value is taken as it stands, never decoded again.
        (
            "v1/events/{endpointId}/{eventId}",
            "/api/v1/events/Bil%20ling/100%é",
            {"endpointId": "Bil%20ling", "eventId": "100%é"},
        ),
        ("v1/x/{id:int}", "/api/v1/x/-12", {"id": "-12"}),
        ("v1/x/{id:int}", "/api/v1/x/12a", None),
        ("v1/x/{n:int:min(1):max(5)}", "/api/v1/x/6", None),
        ("v1/x/{n:int:range(1,5)}", "/api/v1/x/3", {"n": "3"}),
        ("v1/x/{name:alpha:maxlength(3)}", "/api/v1/x/abcd", None),
        ("v1/x/{name:minlength(2)}", "/api/v1/x/a", None),
        ("v1/files/{*rest}", "/api/v1/files/a/b/c", {"rest": "a/b/c"}),
        ("v1/x/{flag:bool}", "/api/v1/x/TRUE", {"flag": "TRUE"}),
        ("v1/x/{name?}", "/api/v1/x", {}),
        ("v1/x", "/api/v1/x/", {}),
        ("v1/x", "/api/v1/xy", None),
        ("v1/Handoffs/{id}", "/API/v1/handoffs/Abc", {"id": "Abc"}),  # literals ignore case; values keep it
    ],
)
def test_route_templates(template: str, path: str, expected: dict[str, str] | None) -> None:
    assert RouteTemplate.compile(template, "api").match(path) == expected


def test_an_empty_route_prefix_serves_at_the_root() -> None:
    assert RouteTemplate.compile("v1/health", "").match("/v1/health") == {}


def test_route_prefix_comes_from_host_json(tmp_path: Path) -> None:
    host_json = tmp_path / "host.json"
    assert route_prefix(host_json) == "api"  # absent file: the host's default
    host_json.write_text(json.dumps({"version": "2.0", "extensions": {"http": {"routePrefix": "/svc/"}}}))
    assert route_prefix(host_json) == "svc"
    host_json.write_text(json.dumps({"version": "2.0"}))
    assert route_prefix(host_json) == "api"


def test_settings_never_override_the_environment(tmp_path: Path) -> None:
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {"A": "from-file", "B": "from-file"}}))
    environ = {"A": "from-env"}
    applied = apply_settings(read_settings(settings), environ)
    assert environ == {"A": "from-env", "B": "from-file"}
    assert applied == ["B"]
    assert read_settings(tmp_path / "absent.json") == {}


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        ("/api/v1/jobs/JOB%2F2026", "/api/v1/jobs/JOB/2026"),  # %2F is a separator once decoded
        ("/api/v1/jobs/100%2525", "/api/v1/jobs/100%25"),  # decoded once, never twice
        ("/api/v1/jobs/a%20b+c", "/api/v1/jobs/a b+c"),  # `+` is a space only in a query string
        ("/api/v1/jobs/why%3F%23", "/api/v1/jobs/why?#"),
        ("/api/v1/jobs/%C3%A9t%C3%A9", "/api/v1/jobs/été"),
        ("/api/v1/jobs/%FF", "/api/v1/jobs/\ufffd"),  # not UTF-8: the replacement character
    ],
)
def test_the_path_is_decoded_once_before_routing(raw: str, decoded: str) -> None:
    assert decode_path(raw) == decoded


def test_an_id_holding_a_slash_matches_no_single_segment_parameter() -> None:
    route = RouteTemplate.compile("v1/handoffs/{endpointId}/jobs/{externalJobId}", "api")
    assert route.match(decode_path("/api/v1/handoffs/ep/jobs/JOB%2F2026")) is None
    assert route.match(decode_path("/api/v1/handoffs/ep/jobs/JOB%252F2026")) == {
        "endpointId": "ep",
        "externalJobId": "JOB%2F2026",
    }
