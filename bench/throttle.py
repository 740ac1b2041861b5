"""A storage budget measurable on one machine: Azure's scalability targets, scaled down, in front of Azurite.

Azurite enforces no rate at all, so a throughput figure measured against it says nothing about a table
layout's ceiling. :class:`Budget` plugs into :class:`bench.proxy.CountingProxy` (``budget=``) and charges
every request the **entities** it touches, per partition (account, table, PartitionKey) and per account,
in token buckets refilled continuously (one second of budget is the burst):

* a point read, insert, replace, merge or delete: 1 entity of its partition;
* an entity group transaction (``$batch``): 1 per operation inside it, all of one partition;
* a query: admitted when its partition (``PartitionKey eq``) and the account have budget left, then
  charged the entities it returned, per partition of the rows (a range read costs what it reads);
* anything else (create table, ...): 1 entity of the account.

A request is admitted while its partition and the account are within budget (at least one entity left);
a transaction may take a bucket below zero, a debt repaid at the budget's rate before anything else is
admitted, so the rate over time is the budget's and single-entity requests (reads between retries) cannot
starve a transaction that needs several entities at once.

Beyond either budget a request is **not forwarded** and is answered as Azure answers throttling
(reference/scale-targets.md: "503 Server Busy or 500 Operation Timeout; back off exponentially"): status
503 with error code ``ServerBusy``, or, for every ``timeout_every``-th refusal, 500 with error code
``OperationTimedOut``. The body has the shape of Azurite's own Table errors (``odata.error`` with ``code``
and ``message``), and ``x-ms-error-code`` carries the code, so the SDK raises the same
``HttpResponseError`` (``error_code``) it raises against Azure.

Scale: :data:`SCALE` divides both published targets (2,000 entities/s per partition, 20,000 per account)
by the same factor, so their ratio (10 partitions' worth per account) is Azure's. With ``SCALE = 200`` a
partition gets 10 entities/s and the account 100: low enough that this shared 2-core machine, running
Settle's code in-process against Azurite through this proxy, reaches the account budget (measured: with
``SCALE = 40`` the machine itself stopped at ~180 entities/s, below the 500 of the account, so the
figures said nothing about the layout). Time is not scaled: latencies are this machine's.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from bench.table_requests import COLLECTION, PARTITION_KEY_JSON, POINT, ROW_KEY_JSON, json_key, key_value

# Azure's published targets (reference/scale-targets.md) and the factor this bench divides them by.
AZURE_PARTITION_ENTITIES_PER_S = 2_000
AZURE_ACCOUNT_ENTITIES_PER_S = 20_000
SCALE = 200

SERVER_BUSY = "ServerBusy"
OPERATION_TIMED_OUT = "OperationTimedOut"

_INNER = re.compile(rb"^(GET|POST|PUT|MERGE|PATCH|DELETE) (\S+) HTTP/1\.1\r?$", re.MULTILINE)
_PK_EQ = re.compile(r"PartitionKey eq '((?:[^']|'')*)'")


@dataclass(frozen=True)
class Charge:
    """What one request costs: entities per partition (table, PartitionKey) of an account."""

    account: str
    partitions: dict[tuple[str, str], int]
    read: bool = False  # a query: charged after the answer, by the rows it returned
    write: bool = False  # entities written (insert, update, merge, delete, every operation of a batch)
    rows: tuple[tuple[str, str, str], ...] = ()  # (table, PartitionKey, RowKey) of each entity written

    @property
    def entities(self) -> int:
        return sum(self.partitions.values()) or 1


def charge_of(method: str, target: str, body: bytes | None) -> Charge:
    """The entities a Table request touches (see the module docstring)."""
    parts = urlsplit(target)
    path = unquote(parts.path)
    account = path.split("/")[1] if path.count("/") >= 1 else ""
    point = POINT.match(path)
    if point:
        _, table, pk, rk = point.groups()
        pk, rk = key_value(pk), key_value(rk)
        written = ((table, pk, rk),) if method != "GET" else ()
        return Charge(account, {(table, pk): 1}, write=method != "GET", rows=written)
    if path.endswith("/$batch") and body:
        inner = _INNER.findall(body)
        table, pk = "", ""
        for _, url in inner:
            m = POINT.match(unquote(urlsplit(url.decode()).path))
            if m:
                table, pk = m.group(2), key_value(m.group(3))
                break
            c = COLLECTION.match(unquote(urlsplit(url.decode()).path))
            if c:
                table = c.group(2)
        if not pk:
            pk = json_key(PARTITION_KEY_JSON, body) or ""
        rows = _batch_rows(body, table, pk)
        return Charge(account, {(table, pk): max(1, len(inner))}, write=True, rows=rows)
    collection = COLLECTION.match(path)
    if collection and collection.group(2) != "Tables":
        table = collection.group(2)
        if method == "GET":
            query = parse_qs(parts.query).get("$filter", [""])[0]
            eq = _PK_EQ.search(query)
            partitions = {(table, key_value(eq.group(1))): 1} if eq else {}
            return Charge(account, partitions, read=True)
        if method == "POST" and body:
            pk = json_key(PARTITION_KEY_JSON, body) or ""
            rk = json_key(ROW_KEY_JSON, body)
            written = ((table, pk, rk),) if rk is not None else ()
            return Charge(account, {(table, pk): 1}, write=True, rows=written)
    return Charge(account, {})


def _batch_rows(body: bytes, table: str, pk: str) -> tuple[tuple[str, str, str], ...]:
    """The row each operation of a batch writes: from its URL, or (an insert) from its JSON body."""
    found = list(_INNER.finditer(body))
    rows = []
    for n, op in enumerate(found):
        point = POINT.match(unquote(urlsplit(op.group(2).decode()).path))
        if point:
            rows.append((table, pk, key_value(point.group(4))))
            continue
        end = found[n + 1].start() if n + 1 < len(found) else len(body)
        rk = json_key(ROW_KEY_JSON, body, op.end(), end)
        if rk is not None:
            rows.append((table, pk, rk))
    return tuple(rows)


@dataclass
class _Bucket:
    rate: float
    tokens: float
    at: float

    def refill(self, now: float) -> None:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    scope: str  # "partition" or "account"

    def reply(self) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """The answer Azure gives (status, reason, headers, body)."""
        request_id = str(uuid.uuid4())
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")
        text = (
            "The server is busy."
            if self.code == SERVER_BUSY
            else "Operation could not be completed within the specified time."
        )
        body = json.dumps(
            {
                "odata.error": {
                    "code": self.code,
                    "message": {"lang": "en-US", "value": f"{text}\nRequestId:{request_id}\nTime:{stamp}"},
                }
            }
        ).encode()
        reason = "Server Busy" if self.status == 503 else "Operation Timeout"
        headers = [
            ("Content-Type", "application/json;odata=minimalmetadata;streaming=true;charset=utf-8"),
            ("x-ms-request-id", request_id),
            ("x-ms-version", "2019-02-02"),
            ("x-ms-error-code", self.code),
        ]
        return self.status, reason, headers, body


class VirtualClock:
    """A clock that advances ``step`` seconds per reading: budgets counted in requests, not wall time, so
    a test throttles the same way on a fast or a loaded machine (and a refused request still lets time
    pass, so a retrying caller is eventually admitted)."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@dataclass
class Budget:
    """Per-partition and per-account entity budgets (entities per second), with what they admitted."""

    partition_per_s: float = AZURE_PARTITION_ENTITIES_PER_S / SCALE
    account_per_s: float = AZURE_ACCOUNT_ENTITIES_PER_S / SCALE
    timeout_every: int = 10  # every n-th refusal is a 500 OperationTimedOut (0: never)
    clock: Callable[[], float] = time.monotonic  # seconds; tests freeze it so budgets do not depend on speed
    # A bucket starts with one second of budget (a burst); False: empty, so a sustained rate measured from
    # the start counts no initial burst (bench/scaleout.py's lock+set figure)
    start_full: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _partitions: dict[tuple[str, str, str], _Bucket] = field(default_factory=dict)
    _accounts: dict[str, _Bucket] = field(default_factory=dict)
    admitted: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    written: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # entities written, admitted
    # writes admitted per row (account, table, PartitionKey, RowKey): shows a row every request touches
    row_writes: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    requests: int = 0

    @classmethod
    def scaled(cls, scale: float = SCALE, *, timeout_every: int = 10) -> Budget:
        return cls(
            partition_per_s=AZURE_PARTITION_ENTITIES_PER_S / scale,
            account_per_s=AZURE_ACCOUNT_ENTITIES_PER_S / scale,
            timeout_every=timeout_every,
        )

    def _bucket(self, table: dict[Any, _Bucket], key: Any, rate: float, now: float) -> _Bucket:
        bucket = table.get(key)
        if bucket is None:
            bucket = table[key] = _Bucket(rate, rate if self.start_full else 0.0, now)
        bucket.refill(now)
        return bucket

    def admit(self, charge: Charge) -> Refusal | None:
        """Take the charge from both budgets, or refuse it (nothing taken)."""
        with self._lock:
            now = self.clock()  # under the lock: a test's virtual clock may count calls
            self.requests += 1
            account = self._bucket(self._accounts, charge.account, self.account_per_s, now)
            needed = 1.0 if charge.read else float(charge.entities)
            scope = None
            partitions = []
            for (table, pk), count in charge.partitions.items():
                n = float(count)
                bucket = self._bucket(
                    self._partitions, (charge.account, table, pk), self.partition_per_s, now
                )
                partitions.append((bucket, (charge.account, table, pk), 1.0 if charge.read else n))
                # Admitted while the partition is within its budget (at least one entity left); a batch
                # may take it below zero, a debt repaid at its rate before anything else is admitted.
                # Requiring all n at once would let single reads starve a transaction for ever.
                if bucket.tokens < 1:
                    scope = "partition"
            if scope is None and account.tokens < 1:
                scope = "account"
            if scope is not None:
                self.refused[scope] += 1
                total = sum(self.refused.values())
                if self.timeout_every and total % self.timeout_every == 0:
                    return Refusal(500, OPERATION_TIMED_OUT, scope)
                return Refusal(503, SERVER_BUSY, scope)
            if not charge.read:
                account.tokens -= needed
                for held, key, n in partitions:
                    held.tokens -= n
                    self.admitted[key] += int(n)
                    if charge.write:
                        self.written[key] += int(n)
                for table, pk, rk in charge.rows:
                    self.row_writes[(charge.account, table, pk, rk)] += 1
            return None

    def empty(self) -> None:
        """From now on no bucket holds a burst: every bucket is emptied, and new ones start empty."""
        with self._lock:
            self.start_full = False
            for bucket in (*self._partitions.values(), *self._accounts.values()):
                bucket.tokens = min(bucket.tokens, 0.0)
                bucket.at = self.clock()

    def charge_rows(self, account: str, table: str, body: bytes) -> None:
        """Charge a query's answer: one entity per row returned, to each row's partition."""
        try:
            rows = json.loads(body).get("value", [])
        except (ValueError, AttributeError):
            return
        per: Counter[str] = Counter(str(r.get("PartitionKey", "")) for r in rows if isinstance(r, dict))
        with self._lock:
            now = self.clock()
            account_bucket = self._bucket(self._accounts, account, self.account_per_s, now)
            account_bucket.tokens -= max(1, len(rows))
            for pk, n in per.items():
                key = (account, table, pk)
                self._bucket(self._partitions, key, self.partition_per_s, now).tokens -= n
                self.admitted[key] += n

    def writes(self, table_suffix: str = "") -> int:
        """Entities written (admitted) so far, in tables whose name ends with ``table_suffix``."""
        with self._lock:
            return sum(n for (_, table, _), n in self.written.items() if table.endswith(table_suffix))

    def hottest_row(self, table_suffix: str = "") -> tuple[tuple[str, str, str, str] | None, int]:
        """The row written most often (admitted) so far, and how many times."""
        with self._lock:
            rows = [(k, n) for k, n in self.row_writes.items() if k[1].endswith(table_suffix)]
        return max(rows, key=lambda kn: kn[1]) if rows else (None, 0)

    def refusals(self) -> int:
        with self._lock:
            return sum(self.refused.values())
