"""Table operations and what a refused write means: shared by every store.

A decision core returns the operations it wants submitted (built here, as plain tuples the SDK's
``submit_transaction`` takes); a store submits them and hands any exception to :func:`refusal`, which says
which operation the service refused and why, or that the exception is no refusal at all (a transient fault,
an unknown error: the store lets it propagate or reads back). The azure SDK is imported only when an
operation is built or an exception is read, so importing this module costs nothing at cold start.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Operation = tuple[Any, ...]

# Azure's limit of operations in one entity-group transaction; Azurite breaks the connection beyond it.
MAX_TRANSACTION_OPS = 100

_EXISTS = frozenset({"EntityAlreadyExists"})
_CHANGED = frozenset({"UpdateConditionNotSatisfied"})
_MISSING = frozenset({"ResourceNotFound"})


def insert(entity: dict[str, Any]) -> Operation:
    """Insert-only: refused with 409 when the row exists."""
    return ("create", entity)


def replace(entity: dict[str, Any], etag: str) -> Operation:
    """Replace the whole row if it still has ``etag`` (412 otherwise)."""
    from azure.core import MatchConditions
    from azure.data.tables import UpdateMode

    return (
        "update",
        entity,
        {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": MatchConditions.IfNotModified},
    )


def merge(entity: dict[str, Any], etag: str | None = None) -> Operation:
    """Merge columns; with no ETag the row must exist (``If-Match: *``, 404 otherwise)."""
    from azure.core import MatchConditions
    from azure.data.tables import UpdateMode

    if etag is None:
        return ("update", entity, {"mode": UpdateMode.MERGE})
    return (
        "update",
        entity,
        {"mode": UpdateMode.MERGE, "etag": etag, "match_condition": MatchConditions.IfNotModified},
    )


def delete(partition_key: str, row_key: str, etag: str | None = None) -> Operation:
    """Delete; with no ETag the row must exist (``If-Match: *``, 404 otherwise)."""
    from azure.core import MatchConditions

    entity = {"PartitionKey": partition_key, "RowKey": row_key}
    if etag is None:
        return ("delete", entity)
    return ("delete", entity, {"etag": etag, "match_condition": MatchConditions.IfNotModified})


@dataclass(frozen=True)
class Refusal:
    """The service refused one write (or one operation of a transaction) on the row's state.

    ``index`` is the refused operation's position in the submitted list (None when the write was not a
    transaction, or the service named no operation). ``status`` is the HTTP status (404, 409 or 412).
    """

    index: int | None
    status: int
    code: str

    @property
    def exists(self) -> bool:
        """An insert found the row already there."""
        return self.code in _EXISTS or (not self.code and self.status == 409)

    @property
    def changed(self) -> bool:
        """A conditional write found another ETag: someone wrote the row since it was read."""
        return self.code in _CHANGED or (not self.code and self.status == 412)

    @property
    def missing(self) -> bool:
        """A write that needs the row found none (deleted since it was read, or never there)."""
        return self.code in _MISSING or (not self.code and self.status == 404)

    def at(self, index: int | None) -> bool:
        """Whether the refused operation is the one at ``index`` (False when ``index`` is None)."""
        return index is not None and self.index == index


def refusal(exc: BaseException) -> Refusal | None:
    """What ``exc`` says the service refused, or None when it is no refusal of a write (a transient fault,
    a throttle, an unknown error: those are the caller's to retry, read back or raise)."""
    from azure.core.exceptions import (
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ResourceNotFoundError,
    )
    from azure.data.tables import TableTransactionError

    if not isinstance(exc, HttpResponseError):
        return None
    status = exc.status_code or 0
    code = error_code(exc)
    index: int | None = None
    if isinstance(exc, TableTransactionError):
        index = exc.index
    elif isinstance(exc, ResourceExistsError):
        status = status or 409
    elif isinstance(exc, ResourceModifiedError):
        status = status or 412
    elif isinstance(exc, ResourceNotFoundError):
        status = status or 404
    if status not in (404, 409, 412):
        return None
    if status == 404 and code and code not in _MISSING:
        return None  # e.g. TableNotFound: no row-level refusal, a missing table
    return Refusal(index=index, status=status, code=code)


def is_conflict(exc: BaseException) -> bool:
    """An insert that found the row, or a conditional write that found it changed or gone."""
    return refusal(exc) is not None


def missing_table(exc: BaseException) -> bool:
    """A write refused because its table does not exist (404 with a code other than a missing row's, e.g.
    ``TableNotFound``). A transaction answers such a refusal inside a 202, where no check of the outer
    answer (``common.tables.StorageAnswerCheck``) sees it."""
    from azure.core.exceptions import HttpResponseError

    if not isinstance(exc, HttpResponseError) or exc.status_code != 404:
        return False
    code = error_code(exc)
    return bool(code) and code not in _MISSING


def error_code(exc: BaseException) -> str:
    """The service's error code of ``exc`` as text (``ResourceNotFound``): the SDK gives a single entity's
    as a ``TableErrorCode`` member, whose ``str()`` is its Python name, and a transaction's as text."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def merge_if_unchanged(table: Any, entity: dict[str, Any], etag: str) -> dict[str, Any]:
    """Merge ``entity`` into its row ``If-Match`` ``etag`` (``*``: the row must still exist) and return the
    service's answer (the new ETag). A row changed or gone raises ``ResourceModifiedError`` /
    ``ResourceNotFoundError``, as the SDK does."""
    from azure.core import MatchConditions
    from azure.data.tables import UpdateMode

    answer: dict[str, Any] = table.update_entity(
        entity, mode=UpdateMode.MERGE, etag=etag, match_condition=MatchConditions.IfNotModified
    )
    return answer
