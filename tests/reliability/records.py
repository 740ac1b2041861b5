"""Reading a record's rows straight from the table and checking head/history agreement."""

from __future__ import annotations

import uuid
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
