"""Audit search: operator audits by endpoint, type, operator and time, from ``hoaudit`` (by UTC day).

``hoaudit`` holds the audits of actions without an event row (poison replays and dismissals) and a copy
of every operator action's audit on an event (resubmit, skip, complete, fail, single or bulk; settlement
resolutions; and the ``AccessDenied`` audit of any of them refused). The event audit itself stays where
the action writes it (the event's partition: the claim, which the audit is rendered from by ADR-0022
change 3, or the resolution's audit row) and is the record; the copy is an insert-only index row keyed by
that audit (its time and a hash of its coordinates), written after the action returns, so a retried action
(answered from its claim, or a resolution from the earlier resolution's audit) lands on the same row and
never doubles it. A process that dies between the action and the copy leaves the copy missing until the
action is retried; the event's own audits are always complete.

A search reads the day partitions of ``[from, to]`` (both ends included, to the millisecond) oldest
first, each one range of its RowKey (``{stamp}|…``: the time), with ``EndpointId`` / ``AuditType`` /
``AuditorName`` filtered by the service: never the whole table. A page ends at ``pageSize`` rows; its
continuation token is the last RowKey, whose first eight characters are its day.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from common.errors import InvalidInput
from common.tables import quoted
from handoff.storage import keys
from handoff.storage.records import AuditRow
from handoff.storage.store import HandoffStore

log = logging.getLogger("settle.management")

AUDIT_TABLE = "hoaudit"
MAX_DAYS = 31


@dataclass(frozen=True)
class AuditSearch:
    items: list[AuditRow]
    last_key: str | None


def mirror_key(audit: AuditRow) -> tuple[str, str]:
    """(day, RowKey) of an event audit's copy: the same audit always lands on the same row."""
    at = audit.audit_timestamp.astimezone(UTC)
    ident = "|".join(
        [audit.endpoint_id, audit.event_id, audit.audit_type, audit.auditor_name, keys.stamp(at)]
    )
    return at.strftime("%Y%m%d"), f"{keys.stamp(at)}|{hashlib.sha256(ident.encode()).hexdigest()[:32]}"


def mirror(store: HandoffStore, audit: AuditRow | None) -> None:
    """Insert the copy of an event audit (insert-only: an existing copy is the same audit). A failed copy
    is logged, never the action's failure: the event audit it copies is already written."""
    if audit is None:
        return
    from azure.core.exceptions import ResourceExistsError

    day, row_key = mirror_key(audit)
    try:
        store.table(AUDIT_TABLE).create_entity(audit.to_entity(day, row_key))
    except ResourceExistsError:
        pass
    except Exception:
        log.warning("the hoaudit copy of %s on %s failed", audit.audit_type, audit.event_id, exc_info=True)


@dataclass(frozen=True)
class AuditQuery:
    """What an audit search asks for: a time window and the filters (None: any)."""

    oldest: datetime
    newest: datetime
    endpoint_id: str | None
    audit_type: str | None
    by: str | None


def search(store: HandoffStore, query: AuditQuery, *, page_size: int, after: str | None) -> AuditSearch:
    oldest, newest = query.oldest, query.newest
    if oldest > newest:
        raise InvalidInput("from must not be after to.", field="from")
    # Both ends are read to the millisecond, the precision the API shows an audit's time with: ``to`` set
    # to an audit's shown time includes it (and any other audit of that millisecond).
    oldest = oldest.replace(microsecond=oldest.microsecond // 1000 * 1000)
    newest = newest.replace(microsecond=newest.microsecond // 1000 * 1000 + 999)
    if newest - oldest > timedelta(days=MAX_DAYS):
        raise InvalidInput(f"from and to may be at most {MAX_DAYS} days apart.", field="from")
    low_key, high_key = keys.stamp(oldest), keys.stamp(newest) + "}"
    if after is not None and not (low_key <= after < high_key):
        raise InvalidInput(
            "continuationToken does not belong to this search (from and to must not change between pages).",
            field="continuationToken",
        )
    table = store.table(AUDIT_TABLE)
    rows: list[AuditRow] = []
    day = after[:8] if after else oldest.astimezone(UTC).strftime("%Y%m%d")
    last_day = newest.astimezone(UTC).strftime("%Y%m%d")
    while True:
        clauses = [f"PartitionKey eq {quoted(day)}", f"RowKey lt {quoted(high_key)}"]
        clauses.append(
            f"RowKey gt {quoted(after)}" if after and after[:8] == day else f"RowKey ge {quoted(low_key)}"
        )
        if query.endpoint_id:
            clauses.append(f"EndpointId eq {quoted(query.endpoint_id)}")
        if query.audit_type:
            clauses.append(f"AuditType eq {quoted(query.audit_type)}")
        if query.by:
            clauses.append(f"AuditorName eq {quoted(query.by)}")
        for entity in table.query_entities(" and ".join(clauses), results_per_page=page_size + 1):
            if len(rows) == page_size:
                return AuditSearch(rows, rows[-1].row_key)
            rows.append(AuditRow.from_entity(entity))
        if day >= last_day:  # checked before the next day is named: 9999-12-31 has none
            return AuditSearch(rows, None)
        day = (datetime.strptime(day, "%Y%m%d") + timedelta(days=1)).strftime("%Y%m%d")
