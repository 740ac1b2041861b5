"""Request bodies as the deployed host delivers them: a byte order mark, a chunked body it dropped, and
answers that name their charset whichever host serves them."""

from __future__ import annotations

import json
import uuid

import azure.functions as func

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
