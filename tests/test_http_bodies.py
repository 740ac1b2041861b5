"""Request bodies as the deployed host delivers them: a byte order mark, a chunked body it dropped, and
answers that name their charset whichever host serves them."""

from __future__ import annotations

import json
import uuid
from typing import Any

import azure.functions as func

from common.http import MAX_JSON_DEPTH
from tests.conftest import Caller

KEY = {"tenantId": 1, "scopeId": 4, "entityId": 7, "itemEntityKey": "invoice"}


def _key() -> dict[str, object]:
    return {**KEY, "itemKey": uuid.uuid4().hex}


def test_a_body_that_starts_with_a_utf8_byte_order_mark_is_read_as_json(call: Caller) -> None:
    body = b"\xef\xbb\xbf" + json.dumps({"key": _key()}).encode()
    result = call("state_exists", raw=body)
    assert result.status == 200, result.json
    assert result.json["exists"] is False


def test_a_chunked_body_the_host_dropped_is_411_saying_to_send_content_length(call: Caller) -> None:
    # Azure's host forwards a body only with a Content-Length over 0: a chunked POST arrives empty.
    result = call("state_lock", raw=b"", headers={"transfer-encoding": "chunked"})
    assert result.status == 411
    assert result.content_type.startswith("application/problem+json")
    assert result.json["type"] == "urn:settle:problem:length-required"
    assert "Content-Length" in result.json["detail"] and result.json["field"] == "body"
    # Without the chunked header an empty body is still the caller's plain 400.
    assert call("state_lock", raw=b"").status == 400


def test_json_and_problem_answers_name_their_charset_in_a_header_of_their_own(call: Caller) -> None:
    # The worker hands the host the response's headers: mimetype/charset alone named no charset there.
    fn = call.functions["state_exists"]
    ok = fn.get_user_function()(
        func.HttpRequest("POST", "http://h/api/v1/state/exists", body=json.dumps({"key": _key()}).encode())
    )
    assert ok.headers["Content-Type"] == "application/json; charset=utf-8"
    bad = fn.get_user_function()(func.HttpRequest("POST", "http://h/api/v1/state/exists", body=b"{"))
    assert bad.headers["Content-Type"] == "application/problem+json; charset=utf-8"


def _nested(depth: int) -> bytes:
    """A lock body whose ``key`` is valid and whose whole nests ``depth`` levels (the body is level 1)."""
    head = json.dumps({"key": _key(), "requestId": "r"})[:-1]
    inner = depth - 1  # the body, then the value of one more member: ``[[...]]``
    return f'{head}, "deep": {"[" * inner}{"]" * inner}}}'.encode()


def _answer(functions: dict[str, Any], name: str, body: bytes) -> func.HttpResponse:
    route = functions[name].get_trigger().route
    request = func.HttpRequest("POST", f"http://h/api/{route}", body=body)
    response: func.HttpResponse = functions[name].get_user_function()(request)
    return response


def test_a_body_nested_1000_deep_is_a_400_naming_the_limit(functions: dict[str, Any]) -> None:
    # Valid JSON, refused by the parser's depth limit: it says so, never "not valid JSON".
    response = _answer(functions, "state_lock", _nested(1000))
    problem = json.loads(response.get_body())
    assert response.status_code == 400, problem
    assert problem["type"] == "urn:settle:problem:nested-too-deep"
    assert problem["field"] == "body" and problem["limit"] == MAX_JSON_DEPTH
    assert f"deeper than {MAX_JSON_DEPTH} levels" in problem["detail"]


def test_the_depth_limit_is_the_parsers_own_one_level_beyond_is_refused(functions: dict[str, Any]) -> None:
    # At the limit the body reaches the schema (which refuses the unknown member, naming it); one level
    # deeper it is the depth refusal.
    at = json.loads(_answer(functions, "state_lock", _nested(MAX_JSON_DEPTH)).get_body())
    assert at["type"] == "urn:settle:problem:invalid-input" and at["field"] == "deep", at
    beyond = json.loads(_answer(functions, "state_lock", _nested(MAX_JSON_DEPTH + 1)).get_body())
    assert beyond["type"] == "urn:settle:problem:nested-too-deep", beyond


def test_data_as_deep_as_the_limit_allows_is_stored_and_read_back(call: Caller) -> None:
    key = _key()
    depth = MAX_JSON_DEPTH - 1  # the body, then ``data``
    data: Any = []
    for _ in range(depth - 1):
        data = [data]
    raw = json.dumps({"key": key, "status": "Processed", "data": data}).encode()
    assert call("state_set", raw=raw).status == 200
    got = call("state_get", {"key": key})
    assert got.status == 200, got.json
    assert got.json["data"]["data"] == data


def test_an_unpaired_surrogate_is_a_400_saying_so_and_a_pair_is_a_character(call: Caller) -> None:
    # JSON's grammar lets "\ud800" through, but it is no character: the body's parser refuses it, and the
    # answer says why rather than "not valid JSON"
    lone = json.dumps({"key": {**_key(), "itemEntityKey": "inv\ud800oice"}}).encode()
    refused = call("state_exists", raw=lone)
    assert refused.status == 400 and refused.json["type"].endswith("invalid-json")
    assert "unpaired UTF-16 surrogate" in refused.json["detail"] and refused.json["field"] == "body"
    # A pair of escapes is one character (U+1F600), taken as it is
    paired = json.dumps({"key": {**_key(), "itemEntityKey": "inv\U0001f600oice"}}).encode()
    assert b"\\ud83d\\ude00" in paired
    assert call("state_exists", raw=paired).status == 200
    # Broken JSON still says it is broken
    broken = call("state_exists", raw=b'{"key": ')
    assert broken.status == 400 and broken.json["detail"] == "The body is not valid JSON."
