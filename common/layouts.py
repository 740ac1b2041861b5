"""The shard layout in force, recorded in storage: one row per table family, read once per process.

A layout picks the partition a new record goes to (``state/keys.py`` ``Layout``, ``handoff/storage/keys.py``
"Sharded endpoints"). It used to be an app setting each instance read alone, so an instance whose setting
differed (a forgotten ``..._PREVIOUS``, a rollout that reaches instances minutes apart) routed records into
partitions where the others never look: a settled key answered ``exists: false`` and a second lock was
handed out. Now the layout lives in storage (``docs/adr/0017-layout-recorded-in-storage.md``), in the
``statelocks`` table:

* PartitionKey ``~layout``, RowKey the family (``state``, ``handoff``): ``Eras`` (JSON, oldest first: each
  era's shard count, account count and the instant it took effect), ``RefreshSeconds``, ``Generation``.
  The last era whose start has passed is the one records are created in; the ones before it are still
  read (a record keeps the partition it was created in); a later one is a change not yet in effect.
* RowKey ``~a|{family}|{stamp}|{id}``: one audit row per change (who, why, from, to), written in the same
  entity group transaction as the change (If-Match the row's ETag), so no change goes unaudited.

A deployment's first instance records its settings' layout (insert-only: of two instances starting at once
with different settings one wins and the other follows it). An instance whose setting disagrees follows
the recorded layout and logs a warning (``LayoutBook.disagreements`` shows it to operators). A change is
an explicit step (``make reshard``, ``POST /api/v1/layout/{family}``: :func:`change`) that takes effect
``2 * RefreshSeconds + GUARD_S + MARGIN_S`` after it is written: every process refreshes its copy at least
every ``2 * RefreshSeconds`` (in the background after ``RefreshSeconds``), so when the new era starts every
process knows it, and during the ``GUARD_S`` before the start no process routes (503, retry), so that most
writes of the old era land first. That timing is a courtesy only: one record per key rests on the key
fence (``common/fence.py``, ADR-0020), which holds however late a write of an earlier era lands.

Azure SDK imports and the partition meter are inside the functions that use them, so the worker's indexing of
the app does not load them.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from common import runtime, telemetry
from common.clock import earliest_now, latest_now, to_ms, utcnow
from common.errors import Conflict, InvalidInput, LayoutNotReady
from common.settings import env
from common.table_protocol import TableSource

log = logging.getLogger("settle.layouts")

# The layouts a family's settings describe, oldest first (the last is the current one): (shards, accounts).
Configured = Callable[[], list[tuple[int, int]]]

# Kept in ``statelocks`` beside the signing key (common/signing.py): a table of Settle's own that every
# deployment has (infra/ creates it), never range-read at ``~layout`` (level 1 of the expiry index is ``l``
# or ``r`` + a minute, and ``~`` sorts after every letter and digit).
LAYOUT_TABLE = "statelocks"
LAYOUT_PARTITION = "~layout"
AUDIT_MARK = "~a|"
STATE = "state"
HANDOFF = "handoff"
FAMILIES = (STATE, HANDOFF)
MAX_SHARDS = 999
# How often a process re-reads the recorded layouts (recorded with the first layout, so every process of a
# deployment uses the same value; the setting only seeds a first deployment).
REFRESH_SETTING = "SETTLE_LAYOUT_REFRESH_SECONDS"
DEFAULT_REFRESH_S = 30.0
# Before a new era starts no process routes for this long, so most in-flight writes of the old era land first
# (fewer of them meet a key fence and answer 503); nothing depends on it (common/fence.py).
GUARD_S = 2.0
# Clock differences between processes beyond the storage clock's own bounds (common/clock.py).
MARGIN_S = 3.0


class LayoutChanging(
    LayoutNotReady, slug="layout-changing", title="The shard layout is changing; retry in a moment"
):
    """A recorded layout change is about to take effect: nothing is routed for a moment (503, retry)."""


class LayoutUnavailable(
    LayoutNotReady,
    slug="layout-unavailable",
    title="The recorded shard layout cannot be served by this instance",
):
    """The recorded layout needs something this instance lacks (a storage account): refused (503)."""


@dataclass(frozen=True)
class Era:
    """One layout a family's records were created in: ``shards`` partitions over ``accounts`` accounts."""

    shards: int
    accounts: int
    since: datetime

    def to_json(self) -> dict[str, Any]:
        return {"shards": self.shards, "accounts": self.accounts, "since": self.since.isoformat()}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Era:
        return cls(
            int(value["shards"]), int(value.get("accounts", 1)), datetime.fromisoformat(value["since"])
        )


@dataclass(frozen=True)
class Recorded:
    """A family's recorded layout, as read (with its ETag)."""

    family: str
    eras: tuple[Era, ...]  # oldest first
    refresh_s: float
    generation: int
    etag: str

    def split(self, at: datetime) -> tuple[Era, tuple[Era, ...], Era | None]:
        """(the era in force at ``at``, the earlier ones still read, the change not yet in force)."""
        # The first era is in force from the start whatever its recorded instant (a clock behind it).
        started = [self.eras[0], *(e for e in self.eras[1:] if e.since <= at)]
        upcoming = next((e for e in self.eras[1:] if e.since > at), None)
        return started[-1], tuple(started[:-1]), upcoming

    def view(self) -> dict[str, Any]:
        now = utcnow()
        current, earlier, upcoming = self.split(now)
        return {
            "family": self.family,
            "shards": current.shards,
            "accounts": current.accounts,
            "since": current.since.isoformat(),
            "previous": [e.to_json() for e in earlier],
            "pending": upcoming.to_json() if upcoming is not None else None,
            "refreshSeconds": self.refresh_s,
            "generation": self.generation,
        }


@dataclass(frozen=True)
class InForce:
    """What a process routes by now: the current era and the earlier ones (oldest first)."""

    current: Era
    earlier: tuple[Era, ...]


def _refresh_setting() -> float:
    text = env(REFRESH_SETTING)
    try:
        value = float(text) if text is not None else DEFAULT_REFRESH_S
    except ValueError:
        raise ValueError(f"{REFRESH_SETTING} must be a number of seconds; got {text!r}") from None
    if not 0.05 <= value <= 3600:
        raise ValueError(f"{REFRESH_SETTING} must be between 0.05 and 3600 seconds; got {value}")
    return value


def _row_of(entity: Any) -> Recorded:
    eras = tuple(Era.from_json(e) for e in json.loads(str(entity["Eras"])))
    return Recorded(
        family=str(entity["RowKey"]),
        eras=eras,
        refresh_s=float(entity.get("RefreshSeconds", DEFAULT_REFRESH_S)),
        generation=int(entity.get("Generation", 1)),
        etag=str(entity.metadata["etag"]),
    )


class LayoutBook:
    """This process's copy of the recorded layouts (both families from one read), kept fresh.

    ``configured``: the layouts a family's settings describe, oldest first, each (shards, accounts), the
    last the current one; called only to seed a first deployment and to warn when it disagrees.
    The copy is re-read in the background once it is older than ``RefreshSeconds`` and before use once
    older than twice that: a call adds no storage request."""

    def __init__(self, tables: TableSource, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._tables = tables
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, Recorded] = {}
        self._read_at: float | None = None
        self._refreshing = False
        self._warned: set[tuple[str, int, int, int]] = set()
        self._compared: set[tuple[str, str]] = set()
        self.disagreements: dict[str, str] = {}

    # -- reading ------------------------------------------------------------------------------------
    def recorded(self, family: str, configured: Configured) -> Recorded:
        """The family's recorded layout (recording ``configured()`` first when none is)."""
        age = None if self._read_at is None else self._clock() - self._read_at
        row = self._rows.get(family)
        if row is None or age is None or age >= 2 * row.refresh_s:
            with self._lock:
                row = self._rows.get(family)
                age = None if self._read_at is None else self._clock() - self._read_at
                if row is None or age is None or age >= 2 * row.refresh_s:
                    self._load(family, configured)
                    row = self._rows[family]
        elif age >= row.refresh_s:
            self._refresh_beside()
        if (row.family, row.etag) not in self._compared:  # once per version of the row, not per call
            self._compare(row, configured)
        return row

    def in_force(self, family: str, configured: Configured) -> InForce:
        """The era records are created in now and the earlier ones; 503 in the guard before a change."""
        row = self.recorded(family, configured)
        earliest = earliest_now()
        current, earlier, upcoming = row.split(earliest)  # the eras that have certainly started
        if upcoming is None or latest_now() < upcoming.since - timedelta(seconds=GUARD_S):
            return InForce(current, earlier)
        wait = max(1, math.ceil((upcoming.since - earliest).total_seconds()))
        raise LayoutChanging(
            f"The {family} shard layout changes to {upcoming.shards} shards at {upcoming.since.isoformat()}; "
            "nothing is routed in the moment before. Retry.",
            retry_after=wait,
        )

    def invalidate(self) -> None:
        """Forget the copy: the next use reads the recorded layouts (after this process changed one)."""
        with self._lock:
            self._read_at = None

    def _load(self, family: str, configured: Configured) -> None:
        """Read every family's row (one request); record ``family``'s from ``configured`` when missing."""
        started = self._clock()  # a copy is as old as the moment its read was sent
        rows = self._read()
        if family not in rows:
            rows[family] = _record_first(self._tables, family, configured()) or self._read()[family]
        self._rows = rows
        self._read_at = started

    def _read(self) -> dict[str, Recorded]:
        table = self._tables.table(LAYOUT_TABLE)
        query = "PartitionKey eq @pk and RowKey lt @end"
        entities = table.query_entities(query, parameters={"pk": LAYOUT_PARTITION, "end": "~"})
        return {str(e["RowKey"]): _row_of(e) for e in entities}

    def _refresh_beside(self) -> None:
        """Re-read on a thread of its own (its request belongs to no call, no tally, no fault plan). Its span
        is a child of the caller's, so the read stays in the trace of the invocation that prompted it."""
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True
        caller = telemetry.trace_properties()

        def run() -> None:
            try:
                started = self._clock()
                with telemetry.span("settle.layout.refresh", carrier=caller):
                    rows = self._read()
                with self._lock:
                    self._rows.update(rows)
                    self._read_at = started
            except Exception:  # the next call past twice the interval reads it itself
                log.warning("Reading the recorded shard layouts failed; retried on next use.", exc_info=True)
            finally:
                with self._lock:
                    self._refreshing = False

        threading.Thread(target=run, name="settle-layout-refresh", daemon=True).start()

    def _compare(self, row: Recorded, configured: Configured) -> None:
        """Warn (once per disagreement) when the settings describe another layout than the recorded one."""
        self._compared.add((row.family, row.etag))
        current, _, _ = row.split(utcnow())
        try:
            shards, accounts = configured()[-1]
        except ValueError as exc:
            shards, accounts = -1, -1
            note = str(exc)
        else:
            note = ""
        if shards == current.shards:
            self.disagreements.pop(row.family, None)
            return
        setting = SETTINGS[row.family]
        note = note or (
            f"{setting}={shards} disagrees with the recorded {row.family} layout ({current.shards} shards, "
            f"since {current.since.isoformat()}); the recorded layout is followed. Change it with "
            f"`make reshard` (docs/tables.md, 'Changing the layout'), not the setting."
        )
        self.disagreements[row.family] = note
        seen = (row.family, row.generation, shards, accounts)
        if seen not in self._warned:
            self._warned.add(seen)
            log.warning(note)


SETTINGS = {STATE: "SETTLE_STATE_SHARDS", HANDOFF: "SETTLE_HANDOFF_SHARDS"}


_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


def _record_first(tables: TableSource, family: str, layouts: list[tuple[int, int]]) -> Recorded | None:
    """Insert-only: the first layout of ``family`` (earlier ones the settings list first, as started long
    ago: a deployment that recorded nothing before); None when another process recorded one first."""
    from azure.core.exceptions import ResourceExistsError

    now = to_ms(utcnow())
    eras = tuple(Era(s, a, now if i == len(layouts) - 1 else _LONG_AGO) for i, (s, a) in enumerate(layouts))
    shards, accounts = layouts[-1]
    entity = {
        "PartitionKey": LAYOUT_PARTITION,
        "RowKey": family,
        "Eras": json.dumps([e.to_json() for e in eras]),
        "RefreshSeconds": float(_refresh_setting()),
        "Generation": 1,
    }
    try:
        written = tables.table(LAYOUT_TABLE).create_entity(entity)
    except ResourceExistsError:
        return None
    log.warning(
        "Recorded the first %s layout: %d shard(s) over %d account(s): about %d items/s per node or endpoint "
        "before storage throttles (GET /api/v1/health warns near it; `make reshard` raises it).",
        family,
        shards,
        accounts,
        250 * shards,
    )
    return Recorded(family, eras, _refresh_setting(), 1, str(written["etag"]))


def change(
    tables: TableSource, family: str, shards: int, *, accounts: int = 1, actor: str, reason: str | None = None
) -> Recorded:
    """Write a new era of ``family`` (the current one kept as earlier), audited in the same transaction.

    It takes effect ``2 * RefreshSeconds + GUARD_S + MARGIN_S`` from now. Refused (409) while another
    change is pending, when nothing would change, or when the row changed since it was read."""
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceNotFoundError
    from azure.data.tables import TableTransactionError, UpdateMode

    if family not in FAMILIES:
        raise InvalidInput(f"family must be one of {', '.join(FAMILIES)}.", field="family")
    if not 1 <= shards <= MAX_SHARDS:
        raise InvalidInput(f"shards must be between 1 and {MAX_SHARDS}.", field="shards")
    if accounts < 1:
        raise InvalidInput("accounts must be 1 or more.", field="accounts")
    table = tables.table(LAYOUT_TABLE)
    try:
        row = _row_of(table.get_entity(LAYOUT_PARTITION, family))
    except ResourceNotFoundError:
        raise Conflict(
            f"No {family} layout is recorded yet: the first instance records its settings' layout "
            f"({SETTINGS[family]}) at its first use; change it after that.",
            field="family",
        ) from None
    now = to_ms(utcnow())
    current, _, upcoming = row.split(now)
    if upcoming is not None:
        raise Conflict(
            f"A change to {upcoming.shards} shards takes effect at {upcoming.since.isoformat()}; "
            "wait for it before the next.",
            field="shards",
        )
    if (current.shards, current.accounts) == (shards, accounts):
        raise Conflict(f"The {family} layout already is {shards} shards over {accounts} account(s).")
    since = to_ms(now + timedelta(seconds=2 * row.refresh_s + GUARD_S + MARGIN_S))
    new = Era(shards, accounts, since)
    eras = (*row.eras, new)
    stamp = now.strftime("%Y%m%dT%H%M%S%fZ")
    updated = {
        "PartitionKey": LAYOUT_PARTITION,
        "RowKey": family,
        "Eras": json.dumps([e.to_json() for e in eras]),
        "RefreshSeconds": row.refresh_s,
        "Generation": row.generation + 1,
    }
    audit = {
        "PartitionKey": LAYOUT_PARTITION,
        "RowKey": f"{AUDIT_MARK}{family}|{stamp}|{uuid.uuid4().hex}",
        "Actor": actor,
        "Reason": reason or "",
        "FromShards": current.shards,
        "FromAccounts": current.accounts,
        "ToShards": shards,
        "ToAccounts": accounts,
        "ActiveFrom": since,
        "Generation": row.generation + 1,
    }
    replace = {"mode": UpdateMode.REPLACE, "etag": row.etag, "match_condition": MatchConditions.IfNotModified}
    ops: list[Any] = [
        ("update", updated, replace),
        ("create", audit),
    ]
    try:
        result = table.submit_transaction(ops)
    except TableTransactionError as exc:
        if exc.status_code in (409, 412):
            raise Conflict(f"The {family} layout changed meanwhile; read it again.", field="family") from exc
        raise
    log.warning(
        "Shard layout of %s changes from %d to %d shards (accounts %d -> %d) at %s, by %s: %s",
        family,
        current.shards,
        shards,
        current.accounts,
        accounts,
        since.isoformat(),
        actor,
        reason or "(no reason given)",
    )
    return Recorded(family, eras, row.refresh_s, row.generation + 1, str(result[0].get("etag", "")))


def operator_warnings() -> list[str]:
    """What an operator should know about layouts on this instance: partitions written near one
    partition's budget (common/partition_meter.py) and settings that disagree with a recorded layout."""
    from common.partition_meter import warnings

    current = book.built()
    return [*warnings(), *(current.disagreements.values() if current is not None else ())]


def read_all(tables: TableSource) -> dict[str, Recorded]:
    """Every family's recorded layout, straight from storage (operators)."""
    table = tables.table(LAYOUT_TABLE)
    query = "PartitionKey eq @pk and RowKey lt @end"
    entities = table.query_entities(query, parameters={"pk": LAYOUT_PARTITION, "end": "~"})
    return {str(e["RowKey"]): _row_of(e) for e in entities}


def audits(tables: TableSource, family: str) -> list[dict[str, Any]]:
    """The family's layout changes, oldest first."""
    table = tables.table(LAYOUT_TABLE)
    low = f"{AUDIT_MARK}{family}|"
    query = "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high"
    params = {"pk": LAYOUT_PARTITION, "low": low, "high": low[:-1] + "}"}
    return [dict(e) for e in table.query_entities(query, parameters=params)]


# -- the process's book, shared by the state and hand-off stores (one read for both families) -----------


def _new_book() -> LayoutBook:
    return LayoutBook(runtime.tables())


# This process's LayoutBook over ``runtime.tables()``: ``book()`` (rebuilt after ``runtime.reset``).
book = runtime.Lazy(_new_book)
