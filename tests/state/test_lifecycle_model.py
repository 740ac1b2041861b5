"""The record's life against a small model, without storage (hypothesis): callers lock, set, release,
extend and upsert one record at random times while catch-up fails expired locks and expires finished records
past their retention. The decisions are state/lifecycle.py's; the table is an in-memory partition that
applies a write's operations as storage does (all or nothing, If-Match by ETag, inserts refused when the row
exists, deletes when it does not). After every step:

* at most one caller holds the lock, and a lock is granted only when no caller's lock is valid;
* a token whose lock is not the head's valid lock never writes (the table is unchanged), and the holder's
  token always does;
* history is append-only (a history row, once written, never changes), versions are contiguous, and the
  head never goes back;
* the expiry-index rows in the partition are exactly the ones the head names;
* a write's own head read back is settled as applied.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from common.errors import Conflict, LockLost
from common.transactions import Operation, Refusal
from state.keys import HISTORY_MARK, INDEX_MARK, head_row_key
from state.lifecycle import (
    LOCK_EXPIRED,
    Head,
    LockRequest,
    WriteContext,
    check_holder,
    check_release,
    claims_of,
    closed_by,
    closes,
    concluded,
    conclusion_replayed,
    decide_lock,
    entity_of,
    extended,
    index_changes,
    plan_write,
    recorded,
    retain_until,
    settled,
)
from state.model import RecordKey, Scope, Status
from state.token import LockClaims

KEY = RecordKey(7, Scope.ELEMENT, 3, "invoice", "INV-model")
PK = "7|4|3"
RK = head_row_key(KEY)
T0 = datetime(2026, 3, 1, tzinfo=UTC)
CALLERS = 3
OUTCOMES = (Status.PROCESSED, Status.SKIPPED, Status.FAILED)


class Refused(Exception):
    def __init__(self, refused: Refusal) -> None:
        super().__init__(refused)
        self.refused = refused


@dataclass
class Partition:
    """One partition of the state table: rows with ETags, written only by whole transactions."""

    rows: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    etags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def head(self) -> Head | None:
        row = self.rows.get(RK)
        return Head(copy.deepcopy(row[0]), row[1]) if row is not None else None

    def submit(self, ops: list[Operation]) -> str:
        """Apply every operation or none; the head's new ETag."""
        rows = dict(self.rows)
        etag = ""
        for at, op in enumerate(ops):
            kind, entity = op[0], op[1]
            options = op[2] if len(op) > 2 else {}
            rk = str(entity["RowKey"])
            found = rows.get(rk)
            if kind == "create" and found is not None:
                raise Refused(Refusal(index=at, status=409, code="EntityAlreadyExists"))
            if kind in ("update", "delete") and found is None:
                raise Refused(Refusal(index=at, status=404, code="ResourceNotFound"))
            if options.get("etag") is not None and found is not None and found[1] != options["etag"]:
                raise Refused(Refusal(index=at, status=412, code="UpdateConditionNotSatisfied"))
            if kind == "delete":
                del rows[rk]
                continue
            new_etag = f'W/"{next(self.etags)}"'
            rows[rk] = (copy.deepcopy(dict(entity)), new_etag)
            if rk == RK:
                etag = new_etag
        self.rows = rows
        return etag

    def write(self, current: Head | None, new: dict[str, Any], *, keep_history: bool = True) -> Head:
        deletes, inserts = index_changes(current, new)
        plan = plan_write(
            current, new, keep_history=keep_history, deleting=deletes, inserts=inserts, markers=[]
        )
        head = Head(new, self.submit(plan.ops))
        assert settled(self.head(), current, new) == "applied"
        return head


class Lifecycle(RuleBasedStateMachine):
    """Callers and catch-up on one record; the model says who holds the lock."""

    @initialize(retention=st.sampled_from([None, 30, 600]))
    def start(self, retention: int | None) -> None:
        self.table = Partition()
        self.now = T0
        self.ctx = WriteContext(retention_seconds=retention)
        self.tokens: dict[int, LockClaims] = {}
        self.holder: tuple[int, str, datetime] | None = None  # caller, lock id, until (the model's own)
        self.history: dict[str, dict[str, Any]] = {}
        self.top_version = 0

    # -- the model -----------------------------------------------------------------------------------------
    def holds(self, caller: int) -> bool:
        return self.holder is not None and self.holder[0] == caller and self.holder[2] > self.now

    def valid_holders(self) -> list[int]:
        return [c for c in range(CALLERS) if self.holds(c)]

    # -- steps ---------------------------------------------------------------------------------------------
    @rule(ms=st.integers(0, 90_000))
    def time_passes(self, ms: int) -> None:
        self.now += timedelta(milliseconds=ms)

    @rule(caller=st.integers(0, CALLERS - 1), seconds=st.integers(1, 60), request=st.booleans())
    def lock(self, caller: int, seconds: int, request: bool) -> None:
        request_id = f"req-{caller}" if request else None
        valid = self.valid_holders()
        current = self.table.head()
        plan = decide_lock(
            current,
            LockRequest(KEY, self.ctx, seconds, request_id),
            partition=PK,
            now=self.now,
            judged=self.now,
        )
        if plan.replay:
            assert current is not None and valid == [caller]  # only the holder's own request comes back
            return
        if plan.new is None:
            assert plan.refused is not None and not plan.refused.acquired
            return
        assert valid == [], f"lock granted to {caller} while {valid} hold it"
        head = self.table.write(current, plan.new)
        self.tokens[caller] = claims_of(KEY, head)
        self.holder = (caller, str(head.entity["LockId"]), head.locked_until or self.now)

    @rule(
        caller=st.integers(0, CALLERS - 1),
        status=st.sampled_from(OUTCOMES),
        digest=st.sampled_from(["d1", "d2"]),
    )
    def set(self, caller: int, status: Status, digest: str) -> None:
        def build(current: Head | None, now: datetime) -> dict[str, Any]:
            return recorded(
                KEY, self.ctx, current, now, partition=PK, status=status,
                envelope_props=None, substatus=None, error=None,
            )  # fmt: skip

        self._fenced(caller, build, concludes=status, digest=digest)

    @rule(caller=st.integers(0, CALLERS - 1), seconds=st.integers(1, 60))
    def extend(self, caller: int, seconds: int) -> None:
        head = self._fenced(caller, lambda current, now: extended(current, now, seconds), in_place=True)
        if head is not None:
            self.tokens[caller] = claims_of(KEY, head)
            self.holder = (caller, str(head.entity["LockId"]), head.locked_until or self.now)

    @rule(release=st.booleans())
    def upsert_or_release_without_a_token(self, release: bool) -> None:
        current = self.table.head()
        status = Status.FAILED if release else Status.PROCESSED
        if release:
            try:
                check_release(current)
            except Conflict:
                assert current is None or current.status is not Status.PROCESSING
                return
        new = recorded(
            KEY, self.ctx, current, self.now, partition=PK, status=status,
            envelope_props=None, substatus=None, error="released" if release else None,
        )  # fmt: skip
        self.table.write(current, new)
        self.holder = None  # an unfenced write ends whatever lock there was

    @rule()
    def catch_up(self) -> None:
        head = self.table.head()
        if head is None:
            return
        if (
            head.status is Status.PROCESSING
            and head.locked_until is not None
            and head.locked_until <= self.now
        ):
            self.table.write(
                head, concluded(head, Status.FAILED, substatus=LOCK_EXPIRED, error="expired", now=self.now)
            )
            assert not self.valid_holders()
            self.holder = None
        elif head.status in OUTCOMES and retain_until(head.entity) <= self.now:
            expired = concluded(head, Status.EXPIRED, substatus="RetentionExpired", error=None, now=self.now)
            self.table.write(head, expired)

    def _fenced(
        self,
        caller: int,
        build: Any,
        *,
        concludes: Status | None = None,
        digest: str | None = None,
        in_place: bool = False,
    ) -> Head | None:
        """The store's fenced write: first from the token alone (If-Match its ETag), then from the head
        read again; the token must never write unless the model says its caller holds the lock."""
        claims = self.tokens.get(caller)
        if claims is None:
            return None
        allowed = self.holds(caller)
        before = copy.deepcopy(self.table.rows)
        current = Head(entity_of(KEY, claims, PK), claims.e) if claims.locked_until > self.now else None
        try:
            for _ in range(2):
                if current is None:
                    head = self.table.head()
                    done = head if head is not None and closed_by(head, claims) else None
                    if (
                        concludes is not None
                        and done is not None
                        and conclusion_replayed(done, concludes, digest)
                    ):
                        assert (
                            self.table.rows == before
                        )  # the same request asked again: answered, not written
                        return None
                    current = check_holder(head, claims, self.now)
                new = build(current, self.now)
                if concludes is not None:
                    closes(new, claims, digest)
                try:
                    written = self.table.write(current, new, keep_history=not in_place)
                except Refused:
                    current = None
                    continue
                assert allowed, f"caller {caller}'s stale token wrote"
                if concludes is not None:
                    self.holder = None
                return written
            pytest.fail("the holder's write was refused twice")
        except LockLost:
            assert not allowed, f"the holder {caller} was refused"
            assert self.table.rows == before, "a refused token changed the table"
        return None

    # -- invariants ----------------------------------------------------------------------------------------
    @invariant()
    def at_most_one_holder(self) -> None:
        head = self.table.head()
        accepted = []
        for caller, claims in getattr(self, "tokens", {}).items():
            try:
                check_holder(head, claims, self.now)
                accepted.append(caller)
            except LockLost:
                pass
        assert len(accepted) <= 1 and accepted == self.valid_holders()

    @invariant()
    def history_is_append_only_and_versions_contiguous(self) -> None:
        if not hasattr(self, "table"):
            return
        head = self.table.head()
        history = {rk: row for rk, (row, _) in self.table.rows.items() if HISTORY_MARK in rk}
        for rk, row in self.history.items():
            assert history.get(rk) == row, "a history row changed or went"
        self.history = copy.deepcopy(history)
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
        if not hasattr(self, "table"):
            return
        head = self.table.head()
        named = set(head.index_keys().values()) if head is not None else set()
        found = {rk for rk in self.table.rows if rk.startswith(INDEX_MARK)}
        assert found == named


Lifecycle.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestLifecycle = Lifecycle.TestCase
