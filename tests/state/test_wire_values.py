"""Values the state API's schema lets through, and storage answers it must map: never a 500, never "not
processed" when storage could not say."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from azure.core.pipeline import PipelineResponse
from azure.core.pipeline.policies import HTTPPolicy
from azure.core.pipeline.transport import RequestsTransportResponse

from common import runtime
from tests.state.conftest import State, new_key

OPERATIONS = ["exists", "get", "lock", "set", "upsert", "release", "extend", "history", "query"]


def bodies(key: dict[str, Any], token: str) -> dict[str, dict[str, Any]]:
    return {
        "exists": {"key": key},
        "get": {"key": key},
        "lock": {"key": new_key()},
        "set": {"key": key, "status": "Processed", "lockToken": token},
        "upsert": {"key": key, "data": {"n": 1}},
        "release": {"key": key, "error": "gave up", "lockToken": token},
        "extend": {"key": key, "lockToken": token, "lockSeconds": 60},
        "history": {"key": key},
        "query": {"tenantId": 1},
    }


def invoke(call: Any, operation: str, body: dict[str, Any]) -> Any:
    return call("state_lock_extend" if operation == "extend" else f"state_{operation}", body)


# --- times with offsets at the end of the range; filters too long for a request -----------------------------


@pytest.mark.parametrize("field", ["updatedFrom", "updatedTo"])
@pytest.mark.parametrize("value", ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00"])
def test_a_query_time_past_either_end_of_the_range_is_never_a_500(
    state: State, field: str, value: str
) -> None:
    answer = state.query(tenantId=1, **{field: value})
    assert answer.status in (200, 400), answer.body
    if answer.status == 400:
        assert answer.json["field"] == field


def test_a_query_up_to_the_end_of_time_with_an_offset_finds_records(state: State) -> None:
    key = new_key(tenantId=987_654)
    assert state.upsert(key, data={"n": 1}).status == 200
    answer = state.query(tenantId=987_654, updatedTo="9999-12-31T23:00:00-05:00")
    assert answer.status == 200, answer.body
    assert len(answer.json["items"]) == 1


@pytest.mark.parametrize("length", [600, 9_000, 100_000])
@pytest.mark.parametrize("char", ["x", "中", "/"])
def test_a_query_filter_no_stored_key_can_match_is_a_400_naming_it(
    state: State, length: int, char: str
) -> None:
    answer = state.query(tenantId=1, scopeId=4, entityId=42, itemEntityKey=char * length)
    assert answer.status == 400, (answer.status, answer.body[:300])
    assert answer.json["field"] == "itemEntityKey"


def test_the_longest_item_entity_key_a_record_can_have_is_queryable(state: State) -> None:
    # the longest itemEntityKey a record's key admits, in the script that costs the most on the wire
    key = new_key(itemKey="k", itemEntityKey="中" * 400)
    while state.upsert(key, data={"n": 1}).status == 200 and len(key["itemEntityKey"]) < 2_000:
        key = {**key, "itemEntityKey": key["itemEntityKey"] + "中" * 20}
    key = {**key, "itemEntityKey": key["itemEntityKey"][:-20]}
    answer = state.query(tenantId=1, scopeId=4, entityId=42, itemEntityKey=key["itemEntityKey"])
    assert answer.status == 200, (answer.status, answer.body[:300])
    assert len(answer.json["items"]) == 1


# --- numbers JSON cannot carry ------------------------------------------------------------------------------


# A long mantissa with a short exponent overflows too (1 and 300 zeros, times 1e9, is 1e309); so does a
# 308-digit integer part with e1, and an exponent-free 309-digit integer is past a double only above ~1.8e308.
BEYOND_A_DOUBLE = ["1" + "0" * 300 + "e9", "-" + "9" * 308 + ".5e1", "2" + "0" * 308, "1" + "0" * 300 + "E+9"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", *BEYOND_A_DOUBLE])
@pytest.mark.parametrize("operation", ["upsert", "set"])
def test_a_number_json_cannot_carry_is_a_400_naming_the_field(call: Any, operation: str, number: str) -> None:
    key = new_key()
    status = ', "status": "Processed"' if operation == "set" else ""
    raw = f'{{"key": {json.dumps(key)}{status}, "data": {{"amounts": [1, {number}]}}}}'.encode()
    answer = call(f"state_{operation}", raw=raw)
    assert answer.status == 400, answer.body
    assert answer.json["field"] == "data.amounts[1]"
    assert State(call).get(key).status == 404  # nothing was stored


# --- storage answers the code did not map -------------------------------------------------------------------


class Answer200NotUtf8(HTTPPolicy):  # type: ignore[type-arg]
    """Once armed, answers every Table request 200 with a body that is not UTF-8."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def send(self, request: Any) -> Any:
        if not self.armed:
            return self.next.send(request)
        http = request.http_request
        raw = requests.Response()
        raw.status_code = 200
        raw.headers["Content-Type"] = "application/json;odata=minimalmetadata"
        raw._content = b'{"value": "\xff\xfe\xfd"}'
        raw.url = http.url
        return PipelineResponse(http, RequestsTransportResponse(http, raw), request.context)


@pytest.fixture
def not_utf8() -> Iterator[Answer200NotUtf8]:
    policy = Answer200NotUtf8()
    runtime.reset(policies=[policy], client_options={"retry_total": 0})
    yield policy
    runtime.reset()


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_200_that_is_not_utf8_is_a_503(call: Any, not_utf8: Answer200NotUtf8, operation: str) -> None:
    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    not_utf8.armed = True
    answer = invoke(call, operation, bodies(key, token)[operation])
    assert answer.status == 503, (answer.status, answer.body[:300])
    assert answer.json["type"] == "urn:settle:problem:unavailable"


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_missing_table_is_a_503_that_says_so_and_never_not_processed(
    call: Any, fresh_tables: str, operation: str
) -> None:
    from state.keys import STATE_TABLE

    state = State(call)
    key = new_key()
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    runtime.tables()._service_client().delete_table(runtime.tables().table(STATE_TABLE).table_name)
    answer = invoke(call, operation, bodies(key, token)[operation])
    assert answer.status == 503, (answer.status, answer.body[:300])
    assert "table" in answer.json["detail"].lower()
