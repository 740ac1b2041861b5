"""The record's life against a small model, without storage (hypothesis): callers lock, set, release,
extend and upsert one record at random times while catch-up fails expired locks and expires finished records
past their retention. What runs is the real ``StateStore`` and the real ``Catchup`` (their loops: the fenced
write from the token, the re-read, the refusal confirmed by storage, the index preparation), on the
in-memory table that passes the conformance suite Azurite passes; only the clock is the model's. After
every step:

* at most one caller holds the lock, and a lock is granted only when no caller's lock is valid;
* a token whose lock is not the head's valid lock never writes (the table is unchanged), and the holder's
  token always does;
* history is append-only (a history row, once written, never changes), versions are contiguous, and the
  head never goes back;
* the expiry-index rows in the partition are exactly the ones the head names.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from common.errors import Conflict, LockLost
from state.catchup import Catchup
from state.keys import HISTORY_MARK, INDEX_MARK, SEPARATOR, Layout, head_row_key
from state.lifecycle import WriteContext, check_holder
from state.model import RecordKey, Scope, Status
from state.store import StateStore
from state.token import LockClaims
from tests.support.examples import examples
from tests.support.memory_table import MemoryTables

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-model")
RK = head_row_key(KEY)
T0 = datetime(2026, 3, 1, tzinfo=UTC)
CALLERS = 3
OUTCOMES = (Status.PROCESSED, Status.SKIPPED, Status.FAILED)


class Lifecycle(RuleBasedStateMachine):
    """Callers and catch-up on one record through the real store; the model says who holds the lock."""

    @initialize(retention=st.sampled_from([None, 30, 600]))
    def start(self, retention: int | None) -> None:
        self.now = T0
        self.tables = MemoryTables()
        self.store = StateStore(self.tables, layout=Layout(1), clock=self._now)
        self.pk = self.store.layout.partition(KEY)
        self.ctx = WriteContext(retention_seconds=retention)
        self.tokens: dict[int, str] = {}
        self.holder: tuple[int, str, datetime] | None = None  # caller, lock id, until (the model's own)
        self.history: dict[str, dict[str, Any]] = {}
        self.top_version = 0

    def _now(self) -> datetime:
        return self.now

    # -- the model -----------------------------------------------------------------------------------------
    def holds(self, caller: int) -> bool:
        return self.holder is not None and self.holder[0] == caller and self.holder[2] > self.now

    def valid_holders(self) -> list[int]:
        return [c for c in range(CALLERS) if self.holds(c)]

    def rows(self) -> dict[str, dict[str, Any]]:
        """The record's rows as storage holds them (RowKey -> the row as written, ETag included): its head,
        history and index rows, not the minutes' markers (an instance prepares a minute before it writes,
        whether or not the write is then refused: bookkeeping of the index, no row of the record)."""
        table = self.tables.table("state").rows
        return {
            rk: copy.deepcopy(row) for (pk, rk), row in table.items() if pk == self.pk and not _marker(rk)
        }

    def claims(self, caller: int) -> LockClaims:
        return LockClaims.decode(self.tokens[caller], self.store.signer())

    # -- steps ---------------------------------------------------------------------------------------------
    @rule(ms=st.integers(0, 90_000))
    def time_passes(self, ms: int) -> None:
        self.now += timedelta(milliseconds=ms)

    @rule(caller=st.integers(0, CALLERS - 1), seconds=st.integers(1, 60), request=st.booleans())
    def lock(self, caller: int, seconds: int, request: bool) -> None:
        valid = self.valid_holders()
        outcome = self.store.lock(KEY, self.ctx, seconds, request_id=f"req-{caller}" if request else None)
        if not outcome.acquired:
            return
        assert outcome.token is not None
        if outcome.replayed:
            assert valid == [caller], f"{caller}'s request came back while {valid} hold the lock"
            return
        assert valid == [], f"lock granted to {caller} while {valid} hold it"
        self.tokens[caller] = outcome.token
        head = self.store.read_head(KEY)
        assert head is not None and head.locked_until is not None
        self.holder = (caller, str(head.entity["LockId"]), head.locked_until)

    @rule(
        caller=st.integers(0, CALLERS - 1),
        status=st.sampled_from(OUTCOMES),
        digest=st.sampled_from(["d1", "d2"]),
    )
    def set(self, caller: int, status: Status, digest: str) -> None:
        if caller not in self.tokens:
            return
        allowed, before = self.holds(caller), self.rows()
        try:
            self.store.record(
                KEY, self.ctx, status=status, envelope_props=None, substatus=None, error=None,
                token_text=self.tokens[caller], digest=digest,
            )  # fmt: skip
        except LockLost:
            assert not allowed, f"the holder {caller} was refused"
            assert self.rows() == before, "a refused token changed the table"
            return
        if self.rows() == before:
            return  # the same request asked again: answered from the record it wrote, nothing written
        assert allowed, f"caller {caller}'s stale token wrote"
        self.holder = None

    @rule(caller=st.integers(0, CALLERS - 1), seconds=st.integers(1, 60))
    def extend(self, caller: int, seconds: int) -> None:
        if caller not in self.tokens:
            return
        allowed, before = self.holds(caller), self.rows()
        try:
            outcome = self.store.extend(KEY, self.ctx, self.tokens[caller], seconds)
        except LockLost:
            assert not allowed, f"the holder {caller} was refused an extension"
            assert self.rows() == before, "a refused token changed the table"
            return
        assert allowed, f"caller {caller}'s stale token extended the lock"
        assert outcome.token is not None and outcome.locked_until is not None
        self.tokens[caller] = outcome.token
        assert self.holder is not None
        self.holder = (caller, self.holder[1], outcome.locked_until)

    @rule(release=st.booleans())
    def upsert_or_release_without_a_token(self, release: bool) -> None:
        try:
            self.store.record(
                KEY, self.ctx, status=Status.FAILED if release else Status.PROCESSED, envelope_props=None,
                substatus=None, error="released" if release else None, token_text=None,
                require_processing=release,
            )  # fmt: skip
        except Conflict:
            head = self.store.read_head(KEY)
            assert release and (head is None or head.status is not Status.PROCESSING)
            return
        self.holder = None  # an unfenced write ends whatever lock there was

    @rule()
    def catch_up(self) -> None:
        before = self.store.read_head(KEY)
        Catchup(self.store, parallelism=1, owner="model").drain(now=self.now)
        after = self.store.read_head(KEY)
        if before is None or after is None:
            return
        due = before.status is Status.PROCESSING and (before.locked_until or self.now) <= self.now
        if due:
            assert after.status is Status.FAILED, "an expired lock was left Processing"
            assert not self.valid_holders()
            self.holder = None
        elif after.version != before.version:
            assert after.status is Status.EXPIRED, "catch-up changed a record it had no reason to"

    # -- invariants ----------------------------------------------------------------------------------------
    @invariant()
    def at_most_one_holder(self) -> None:
        if not hasattr(self, "store"):
            return
        head = self.store.read_head_at(self.pk, RK)
        accepted = []
        for caller in self.tokens:
            try:
                check_holder(head, self.claims(caller), self.now)
                accepted.append(caller)
            except LockLost:
                pass
        assert len(accepted) <= 1 and accepted == self.valid_holders()

    @invariant()
    def history_is_append_only_and_versions_contiguous(self) -> None:
        if not hasattr(self, "store"):
            return
        head = self.store.read_head_at(self.pk, RK)
        history = {rk: row for rk, row in self.rows().items() if HISTORY_MARK in rk}
        for rk, row in self.history.items():
            assert history.get(rk) == row, "a history row changed or went"
        self.history = history
        if head is None:
            assert not history
            return
        assert head.version >= self.top_version
        self.top_version = head.version
        versions = sorted(int(row["Version"]) for row in history.values())
        assert versions == list(range(1, head.version))
        assert all(row["Status"] == int(Status.SUPERSEDED) for row in history.values())

    @invariant()
    def index_rows_are_the_ones_the_head_names(self) -> None:
        if not hasattr(self, "store"):
            return
        head = self.store.read_head_at(self.pk, RK)
        # A lock has no index row (ADR-0021): only a retention deadline does
        keys = head.index_keys() if head is not None else {}
        named = {key for column, key in keys.items() if column != "LockIndexKey"}
        found = {rk for rk in self.rows() if rk.startswith(INDEX_MARK)}
        assert found == named
        if head is None or head.status is not Status.PROCESSING:
            return
        # and a Processing head's lock is named by an entry of a marker of its expiry minute
        assert head.row.lock_id is not None and head.locked_until is not None
        until = int(head.locked_until.timestamp() * 1000)
        minute = f"{INDEX_MARK}l{SEPARATOR}{until // 60_000:010d}{SEPARATOR}"
        entries = [
            row.get(f"L{head.row.lock_id}")
            for (pk, rk), row in self.tables.table("state").rows.items()
            if pk == self.pk and _marker(rk) and rk.startswith(minute)
        ]
        assert f"{until}|{RK}" in entries, "a live lock that no marker of its minute names"


def _marker(rk: str) -> bool:
    """A minute's marker (``~kind|minute|{n or m}{nonce}``), not an index row (``~kind|minute|ms|id``)."""
    return rk.startswith(INDEX_MARK) and rk.count(SEPARATOR) == 2


Lifecycle.TestCase.settings = settings(
    max_examples=examples(80),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLifecycle = Lifecycle.TestCase
