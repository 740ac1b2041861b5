"""The service's error code is read the same whether the SDK gives it as text (a transaction's) or as a
``TableErrorCode`` member (a single entity's, whose ``str()`` is its Python name): a single write refused
for a missing row is a refusal, not a missing table, and a property too large is a 413, not a 500."""

from __future__ import annotations

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import TableErrorCode

from common.errors import PayloadTooLarge
from common.http import dependency_problem
from common.transactions import error_code, missing_table, refusal


def _raised(kind: type[HttpResponseError], status: int, code: object) -> HttpResponseError:
    exc = kind(message="refused")
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


def test_a_single_writes_missing_row_is_a_refusal_not_a_missing_table() -> None:
    exc = _raised(ResourceNotFoundError, 404, TableErrorCode.RESOURCE_NOT_FOUND)
    assert error_code(exc) == "ResourceNotFound"
    refused = refusal(exc)
    assert refused is not None and refused.status == 404
    assert not missing_table(exc)


def test_a_missing_table_is_still_one() -> None:
    exc = _raised(ResourceNotFoundError, 404, TableErrorCode.TABLE_NOT_FOUND)
    assert refusal(exc) is None and missing_table(exc)


def test_a_property_too_large_answers_413() -> None:
    exc = _raised(HttpResponseError, 400, TableErrorCode.PROPERTY_VALUE_TOO_LARGE)
    assert isinstance(dependency_problem(exc), PayloadTooLarge)
