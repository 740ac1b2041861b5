"""Every dependency fault a request can meet becomes a 4xx/503 problem, never a 500."""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func
import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    DecodeError,
    HttpResponseError,
    IncompleteReadError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceResponseError,
)

from common.http import guard


class _Response:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.headers = headers or {}
        self.reason = "test"
        self.request = None

    def text(self) -> str:
        return ""


def _http_error(status: int | None, *, code: str | None = None, retry_after: str | None = None) -> Exception:
    exc = HttpResponseError(message=f"storage said {status}")
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]
    if status is not None:
        exc.response = _Response(status, {"Retry-After": retry_after} if retry_after else {})
    return exc


def _answer(exc: Exception) -> func.HttpResponse:
    def handler(req: func.HttpRequest) -> Any:
        raise exc

    return guard(handler)(func.HttpRequest("POST", "http://localhost/api/x", body=b"{}"))


@pytest.mark.parametrize(
    "exc",
    [
        _http_error(429),
        _http_error(500),
        _http_error(503),
        _http_error(None),
        ServiceRequestError("connection refused"),
        ServiceResponseError("connection reset"),
        IncompleteReadError("short read"),
        DecodeError("garbled answer"),
        ClientAuthenticationError("token endpoint hiccup"),
    ],
    ids=["429", "500", "503", "no-status", "request", "response", "incomplete", "decode", "auth"],
)
def test_a_transient_dependency_fault_is_503_with_retry_after(exc: Exception) -> None:
    resp = _answer(exc)
    assert resp.status_code == 503
    assert resp.mimetype == "application/problem+json"
    assert int(resp.headers["Retry-After"]) >= 1
    body = json.loads(resp.get_body())
    assert body["type"] == "urn:settle:problem:unavailable"
    assert body["retryAfter"] == int(resp.headers["Retry-After"])


@pytest.mark.parametrize("status", [401, 403])
def test_storage_refusing_settles_identity_is_503_never_a_500(status: int) -> None:
    # A missing or not yet propagated role assignment is the deployment's fault, not the caller's
    resp = _answer(_http_error(status, code="AuthorizationPermissionMismatch"))
    assert resp.status_code == 503
    assert json.loads(resp.get_body())["type"] == "urn:settle:problem:unavailable"
    assert int(resp.headers["Retry-After"]) >= 1


def test_storage_retry_after_is_passed_on() -> None:
    resp = _answer(_http_error(429, retry_after="7"))
    assert resp.headers["Retry-After"] == "7"


@pytest.mark.parametrize("code", ["EntityTooLarge", "PropertyValueTooLarge", "RequestBodyTooLarge"])
def test_a_request_storage_finds_too_large_is_413(code: str) -> None:
    resp = _answer(_http_error(400, code=code))
    assert resp.status_code == 413
    assert json.loads(resp.get_body())["type"] == "urn:settle:problem:payload-too-large"


def test_a_conflict_that_survived_the_retries_is_409() -> None:
    assert _answer(ResourceExistsError("exists")).status_code == 409
    assert _answer(_http_error(412)).status_code == 409


def test_anything_else_is_a_logged_500_without_internals() -> None:
    resp = _answer(RuntimeError("secret internals"))
    assert resp.status_code == 500
    assert b"secret internals" not in resp.get_body()
