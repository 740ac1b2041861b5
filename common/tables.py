"""Table Storage clients, created once per process and reused.

``Tables`` hands out a ``TableClient`` per logical table name (the prefix from settings is applied
here and nowhere else) and makes sure each table exists the first time it is used in this process: one
request lists the deployment's tables (its prefix's range) at the first use, and only a table that list
lacks is created (so a process's first requests do not include a create per table).
Every client carries the round-trip counter, the storage-retry counter (telemetry) and the server-clock
policy, plus any extra policies a test or the benchmark passes (fault injection), and its retry policy is
``common.table_retry.SettleRetryPolicy``: the SDK's own, except that a call passing
:data:`~common.table_options.RESEND_UNRECEIVED_ONLY` is sent again only when storage never received it.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import invocation
from common.clock import SERVER_CLOCK, ServerClockPolicy
from common.errors import StorageAnswerUnreadable, StorageTableMissing
from common.roundtrips import ROUND_TRIPS
from common.settings import TableSettings
from common.table_options import refused_unreceived, response_body
from common.telemetry import STORAGE_RETRIES

if TYPE_CHECKING:
    from azure.data.tables import TableClient, TableServiceClient


class StorageAnswerCheck(SansIOHTTPPolicy[Any, Any]):
    """Refuses storage answers the SDK would misread, once per attempt, before the SDK reads them:

    * a 2xx whose body is not UTF-8 (the SDK would decode it with replacement characters and hand back
      an entity missing its columns): :class:`~common.errors.StorageAnswerUnreadable`, transient (503);
    * 404 ``TableNotFound`` (a table deleted by hand; the SDK reports it like a missing row, which would
      read as "no record"): :class:`~common.errors.StorageTableMissing`, 503 naming the table.
    """

    def on_response(self, request: Any, response: Any) -> None:
        http = response.http_response
        status = http.status_code
        if status == 404 and "/Tables" not in request.http_request.url:  # table management keeps its 404s
            code = http.headers.get("x-ms-error-code") or ""
            if code == "TableNotFound" or (not code and b"TableNotFound" in response_body(http)):
                raise StorageTableMissing(_table_of(request.http_request.url))
        elif 200 <= status < 300:
            try:
                response_body(http).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise StorageAnswerUnreadable(
                    f"Storage answered {status} with a body that is not UTF-8."
                ) from exc


def _table_of(url: str) -> str:
    path = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return path.split("(", 1)[0] or "?"


STORAGE_ANSWER_CHECK = StorageAnswerCheck()

_WRITES = frozenset({"POST", "PUT", "PATCH", "MERGE", "DELETE"})
# A transaction's answer is 202 whatever became of it; a refused one carries its operation's own status.
_BATCH_STATUS = re.compile(rb"HTTP/1\.1 (\d{3})")


class WriteWatch(SansIOHTTPPolicy[Any, Any]):
    """Tallies, in the running invocation's budget (``common.invocation``), each attempt of a write to a
    table's rows, and each answer proving that attempt was not applied: a 4xx (408 aside; inside a
    transaction's answer too) or 503 ``ServerBusy``. Creating a table (idempotent) is not counted."""

    def on_request(self, request: Any) -> None:
        budget = invocation.current()
        if budget is not None and _is_row_write(request.http_request):
            budget.sent_write()

    def on_response(self, request: Any, response: Any) -> None:
        budget = invocation.current()
        if budget is None or not _is_row_write(request.http_request):
            return
        http = response.http_response
        status = http.status_code
        if status == 202 and "$batch" in str(request.http_request.url):
            found = _BATCH_STATUS.search(response_body(http))
            status = int(found.group(1)) if found else status
        if (400 <= status < 500 and status != 408) or refused_unreceived(http):
            budget.refused_write()


def _is_row_write(http: Any) -> bool:
    if http.method.upper() not in _WRITES:
        return False
    return not str(http.url).split("?", 1)[0].rstrip("/").endswith("/Tables")


WRITE_WATCH = WriteWatch()

# A storage call that hangs must not hold a Function invocation for minutes; inside an invocation both are
# cut to what is left of its deadline (``common.invocation``, ``common.table_retry``).
_TIMEOUTS = {"connection_timeout": 10, "read_timeout": 30}


class Tables:
    """Process-wide access to Settle's tables."""

    def __init__(
        self,
        settings: TableSettings,
        *,
        policies: Sequence[Any] = (),
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self._policies = list(policies)
        # Extra azure-core client keywords (the reliability suite passes ``retry_total=0`` so an injected
        # fault reaches the caller instead of being retried inside the SDK).
        self._client_options = dict(client_options or {})
        self._lock = threading.Lock()
        self._service: TableServiceClient | None = None
        self._clients: dict[str, TableClient] = {}
        self._listed: frozenset[str] | None = None  # the prefix's tables found at this process's first use

    def _service_client(self) -> TableServiceClient:
        if self._service is None:
            from azure.data.tables import TableServiceClient

            per_retry = [
                ROUND_TRIPS,
                WRITE_WATCH,
                STORAGE_RETRIES,
                ServerClockPolicy(SERVER_CLOCK),
                STORAGE_ANSWER_CHECK,
                *self._policies,
            ]
            kwargs: dict[str, Any] = {"per_retry_policies": per_retry, **_TIMEOUTS, **self._client_options}
            if self.settings.connection_string:
                self._service = TableServiceClient.from_connection_string(
                    self.settings.connection_string, **kwargs
                )
            else:
                from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

                credential: Any = (
                    ManagedIdentityCredential(client_id=self.settings.client_id)
                    if self.settings.client_id
                    else DefaultAzureCredential()
                )
                assert self.settings.service_uri is not None
                self._service = TableServiceClient(
                    endpoint=self.settings.service_uri, credential=credential, **kwargs
                )
            _install_policies(self._service, per_retry, kwargs)
        return self._service

    def table(self, name: str) -> TableClient:
        """The client of logical table ``name`` (created on first use in this process)."""
        client = self._clients.get(name)
        if client is not None:
            return client
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                service = self._service_client()
                full = self.settings.table_name(name)
                if self._listed is None:
                    self._listed = _existing_tables(service, self.settings.prefix)
                if full.lower() not in self._listed:
                    service.create_table_if_not_exists(full)
                client = service.get_table_client(full)
                self._clients[name] = client
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
            self._listed = None
            if self._service is not None:
                self._service.close()
                self._service = None


def _existing_tables(service: TableServiceClient, prefix: str) -> frozenset[str]:
    """The names (lower case) of the account's tables in ``prefix``'s range, from one Query Tables request
    (its first page: up to 1,000 names). Table names are alphanumeric, so ``prefix`` + any name sorts
    below ``prefix`` + ``{``. Only ever used to skip a create: a table missing from the answer (a later
    page, a case the filter compared differently) is created as before, and an answer that is not a list
    (a role without Query Tables, an emulator without ``$filter`` on tables) means nothing is known, so
    every table is created as before. A storage that cannot be reached raises, as the create would."""
    from azure.core.exceptions import HttpResponseError

    try:
        pages: Any = service.query_tables(
            "TableName ge @low and TableName lt @high",
            parameters={"low": prefix, "high": prefix + "{"},
            results_per_page=1000,
        ).by_page()
        return frozenset(str(t.name).lower() for t in next(pages, []))
    except HttpResponseError:
        return frozenset()


def quoted(value: str) -> str:
    """``value`` as a string literal in a Table query filter (OData doubles a quote inside it)."""
    return "'" + value.replace("'", "''") + "'"


def datetime_literal(value: datetime) -> str:
    """``value`` as a DateTime literal in a Table query filter (``datetime'2026-12-06T05:04:27.123000Z'``,
    UTC, the SDK's own form for a ``datetime`` parameter).

    Azurite compares DateTime values at millisecond precision (JavaScript ``Date``: both sides are cut to the
    millisecond), Azure at 100 ns: a bound *on the millisecond* compared with ``lt`` is the one comparison
    the two (and the in-memory table of the tests) answer alike, so :func:`before_ms` gives it
    (``tests/conformance/test_table_conformance.py`` holds it)."""
    return "datetime'" + value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") + "'"


def before_ms(value: datetime) -> datetime:
    """``value`` cut to its millisecond: ``X lt datetime'{before_ms(t)}'`` means "X before ``t``'s
    millisecond" on Azure, Azurite and the in-memory table alike (see :func:`datetime_literal`)."""
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


# Pages a first-rows read follows when storage answers a page short with a continuation token.
SHORT_PAGES = 8


def first_rows(paged: Any, limit: int) -> list[Any]:
    """Up to ``limit`` rows of a query (``TableClient.query_entities(..., results_per_page=limit)``), from
    its first pages. Azure may answer a page short, even empty, with a continuation token (a filter that
    passed over many rows, its 5 s time limit): such a page does not mean the range holds no more, so the
    next pages are read, at most ``SHORT_PAGES`` of them (each a request; Azurite's first page is always
    full or the last). Source: Microsoft's "Query Timeout and Pagination" ("It is possible for a query to
    return no results but to still return a continuation header"); shared/reference/idempotency-anchors.md,
    "Query page"."""
    rows: list[Any] = []
    pages: Any = paged.by_page()  # a PageIterator: its continuation_token says whether more may follow
    for _ in range(SHORT_PAGES):
        page: Any = next(pages, None)
        if page is None:
            break
        rows.extend(page)
        if len(rows) >= limit or pages.continuation_token is None:
            break
    return rows[:limit]


def _install_policies(service: TableServiceClient, policies: list[Any], options: Mapping[str, Any]) -> None:
    """Put Settle's retry policy (built from the client's ``options``) in place of the SDK's, and
    ``policies`` right after it (so they run once per attempt).

    azure-data-tables builds its own policy list, ignoring ``retry_policy`` and ``per_retry_policies``; the
    table clients that ``get_table_client`` hands out are built from ``service._policies``, so change that.
    """
    from azure.data.tables._policies import TablesRetryPolicy

    from common.table_retry import SettleRetryPolicy

    installed: list[Any] = service._policies
    if any(p is policies[0] for p in installed):
        return
    index = next((i for i, p in enumerate(installed) if isinstance(p, TablesRetryPolicy)), None)
    if index is None:
        index = len(installed) - 1
    else:
        installed[index] = SettleRetryPolicy(**options)
    installed[index + 1 : index + 1] = policies
