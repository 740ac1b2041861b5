"""Reading a record's rows straight from the table and checking head/history agreement."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import runtime
from state.keys import HISTORY_MARK, MAX_VERSION, STATE_TABLE, partition_key, record_range
from state.model import Status
from state.schemas import KeyIn
from tests.conftest import Caller
from tests.reliability.tally import TALLY, Tally


def new_key(tenant: int = 7, **overrides: Any) -> dict[str, Any]:
    key: dict[str, Any] = {
        "tenantId": tenant,
        "scopeId": 4,
        "entityId": 11,
        "itemKey": f"R-{uuid.uuid4().hex[:12]}",
        "itemEntityKey": "order",
    }
    key.update(overrides)
    return key


@dataclass
class Rows:
    """A record as stored: its head entity (or None) and its history rows by version."""

    head: dict[str, Any] | None
    history: dict[int, dict[str, Any]]
    history_row_count: int

    @property
    def version(self) -> int:
        return int(self.head["Version"]) if self.head else 0

    @property
    def statuses(self) -> list[str]:
        """The status every version had, oldest first (history's RecordedStatus, then the head's)."""
        seq = [Status(int(self.history[v]["RecordedStatus"])).label for v in sorted(self.history)]
        if self.head is not None:
            seq.append(Status(int(self.head["Status"])).label)
        return seq


def read_rows(key: dict[str, Any]) -> Rows:
    """Every row of one record (head and history), by a range read outside any fault plan."""
    rk = KeyIn.model_validate(key).record_key()
    low, high = record_range(rk)
    table = runtime.tables().table(STATE_TABLE)
    entities = list(
        table.query_entities(
            "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
            parameters={"pk": partition_key(rk.tenant_id, rk.scope, rk.entity_id), "low": low, "high": high},
        )
    )
    head = None
    history: dict[int, dict[str, Any]] = {}
    count = 0
    for entity in entities:
        row_key = str(entity["RowKey"])
        if row_key.endswith("|c"):
            head = dict(entity)
            continue
        count += 1
        mark = row_key.rindex(HISTORY_MARK)
        history[MAX_VERSION - int(row_key[mark + len(HISTORY_MARK) :])] = dict(entity)
    return Rows(head, history, count)


def check_head_and_history(
    area: str, call: Caller, key: dict[str, Any], where: str, *, tally: Tally = TALLY
) -> Rows:
    """Head and history agree, in storage and through the API; versions contiguous, none lost or doubled."""
    check = tally.check
    rows = read_rows(key)
    v = rows.version
    check(area, rows.head is not None, f"{where}: the record has no head")
    check(
        area,
        sorted(rows.history) == list(range(1, v)) and rows.history_row_count == v - 1,
        f"{where}: head v{v} but history versions {sorted(rows.history)} ({rows.history_row_count} rows)",
    )
    for version, entity in rows.history.items():
        check(
            area,
            int(entity["Version"]) == version
            and int(entity["SupersededByVersion"]) == version + 1
            and int(entity["Status"]) == int(Status.SUPERSEDED),
            f"{where}: history row v{version} is {entity.get('Version')}, superseded by "
            f"{entity.get('SupersededByVersion')}, status {entity.get('Status')}",
        )
    got = call("state_get", {"key": key})
    hist = call("state_history", {"key": key, "pageSize": 1000})
    check(area, got.status == 200 and hist.status == 200, f"{where}: get/history {got.status}/{hist.status}")
    items = hist.json["items"]
    check(
        area,
        [i["version"] for i in items] == list(range(v, 0, -1)),
        f"{where}: history API versions {[i['version'] for i in items]}, head v{v}",
    )
    newest, head = items[0], got.json
    check(
        area,
        (newest["version"], newest["status"], newest["data"])
        == (head["version"], head["status"], head["data"]),
        f"{where}: history's newest entry {newest['version']}/{newest['status']} is not the head "
        f"{head['version']}/{head['status']}",
    )
    return rows


def lock_id_of(token: str) -> str:
    """The lock id a token names (the suite compares it with the head's ``LockId``)."""
    payload = token.split(".")[1]  # v2.<payload>.<mac>
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["i"])


def check_one_holder(
    area: str,
    answers: Sequence[dict[str, Any]],
    callers: int,
    head: dict[str, Any] | None,
    where: str,
    *,
    tally: Tally = TALLY,
) -> dict[str, Any]:
    """After a lock race and every caller's retries: each caller got an answer, exactly one of them holds
    the lock (never two: safety; never none: liveness), and its token names the lock the head holds."""
    check = tally.check
    check(area, len(answers) == callers, f"{where}: {len(answers)} of {callers} callers got an answer")
    holders = [a for a in answers if a.get("acquired")]
    check(area, len(holders) == 1, f"{where}: {len(holders)} callers hold the lock")
    check(
        area,
        head is not None and int(head["Status"]) == int(Status.PROCESSING),
        f"{where}: the head is not Processing: {None if head is None else head.get('Status')}",
    )
    assert head is not None
    check(
        area,
        lock_id_of(str(holders[0].get("lockToken"))) == head.get("LockId"),
        f"{where}: the holder's token names another lock than the head's {head.get('LockId')}",
    )
    return holders[0]


def check_recorded_once(
    area: str, rows: Rows, allowed: Sequence[Sequence[str]], where: str, *, tally: Tally = TALLY
) -> None:
    """The record's versions are the status sequence the operation must leave: a change recorded twice
    (a doubled version) or not at all (a lost one) is a violation."""
    tally.check(
        area,
        rows.statuses in [list(a) for a in allowed],
        f"{where}: statuses {rows.statuses}, expected one of {[list(a) for a in allowed]}",
    )
