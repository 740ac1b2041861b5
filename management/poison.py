"""Poison for operators: list a day's rows, replay one through the resolver.

A replay rebuilds the message the resolver trigger received (stored body, application properties,
MessageId, session, correlation, enqueue time) and hands it to the resolver in-process, so the answer
says what happened: ``applied`` / ``refused`` (Spec 030) / ``duplicate`` (it had been projected since),
``poisoned`` (still unprojectable: the reason), or 503 when storage fails (nothing recorded; retry). A
replay is safe to repeat: the projection is idempotent per EventId + MessageId.

The row records the last replay (``ReplayedAt``, ``ReplayedBy``, ``ReplayOutcome``, ``ReplayCount``,
merged ``If-Match`` its ETag), and a projected replay removes the row's count (``pz|`` index row and a
``-1 Poison`` delta in one transaction). **A second replay** of a row whose replay was projected
(applied, refused or duplicate) is refused with 409 ``already-replayed`` naming when and by whom: it
could only be a duplicate. A row whose replay was poisoned again may be replayed again (after a fix).
Two replays at once both reach the resolver, which projects the message once; the row keeps the record
of the replay that wrote first, and the other answers with it.

Azure SDK imports are inside the functions that use them, so the worker's indexing of the app does not load
them.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

from common.clock import utcnow
from common.errors import Conflict, NotFound, SettleError, Unavailable
from common.principal import Actor, allowed, denial
from common.transactions import delete, insert, merge_if_unchanged
from handoff.messages.contract import Prop
from handoff.projection.resolver import Outcome, ResolverService, TransientProjectionError
from handoff.projection.rules import delta_entity
from handoff.storage import counts, keys
from handoff.storage.records import AuditRow, PoisonRow
from handoff.storage.store import HandoffStore
from management.audits import AUDIT_TABLE
from management.rules import PROJECTED, check_day, dismissal_refusal, replay_kind, replay_refusal

MAX_PAGE = 200


@dataclass(frozen=True)
class Edits:
    """Edit-and-replay: what the operator changed before the message goes through the resolver again."""

    message_content: str | None = None
    application_properties: dict[str, Any] | None = None

    @property
    def any(self) -> bool:
        return self.message_content is not None or self.application_properties is not None


@dataclass(frozen=True)
class ReplayResult:
    row: PoisonRow
    day: str
    outcome: str
    detail: str | None
    replayed: bool  # False: answered from an earlier replay


class _ReplayResolver(ResolverService):
    """The resolver for one replay: remembers why the message was poisoned again."""

    poison_reason: str | None = None

    def _store_poison(self, msg: Any, props: dict[str, Any], reason: str, *, final: bool = False) -> None:
        self.poison_reason = reason
        super()._store_poison(msg, props, reason, final=final)


@dataclass(frozen=True)
class _NoEvent:
    """What a poison audit is about: no event row, only the endpoint the message names (``""``: none)."""

    endpoint_id: str
    event_id: str = ""
    event_type_id: str | None = None


@dataclass(eq=False)
class PoisonDesk:
    """The operators' poison desk: list a day's poison, replay a message through ``resolver`` (looked up at
    each replay), dismiss one; every act audited."""

    store: HandoffStore
    resolver: Callable[[], ResolverService]
    clock: Callable[[], datetime] = field(default=utcnow, kw_only=True)

    def page(self, day: str, *, after: str | None, limit: int) -> tuple[list[PoisonRow], str | None]:
        return self.store.poison_page(check_day(day), after=after, limit=limit)

    def replay(self, day: str, row_key: str, actor: Actor, edits: Edits | None = None) -> ReplayResult:
        day = check_day(day)
        edits = edits or Edits()
        kind = replay_kind(edits.any)
        row = self._open(day, row_key, actor, kind, replay_refusal)
        outcome, detail = self._project(row, edits)
        recorded = self._record(day, row_key, row, actor, outcome, detail)
        if recorded is None:  # another replay recorded first: answer with its record
            again = self.store.get_poison(day, row_key)
            assert again is not None
            return ReplayResult(again, day, again.replay_outcome or outcome, again.replay_detail, False)
        if outcome in PROJECTED:
            self._uncount(day, row_key, recorded)
        self._audit(day, row_key, row, actor, kind, comment=outcome, edits=edits if edits.any else None)
        return ReplayResult(recorded, day, outcome, detail, True)

    def dismiss(self, day: str, row_key: str, actor: Actor, reason: str) -> PoisonRow:
        """Dismiss (archive) a poison message no fix will ever project: the row records who, when and
        why (merged ``If-Match`` its ETag), its count goes (``pz|`` index row and a ``-1 Poison`` delta in
        one transaction), one ``DismissPoison`` audit in ``hoaudit`` with the reason. A second dismissal,
        or a dismissal of a projected replay, is 409; of two at once one records, the other is 409."""
        from azure.core.exceptions import ResourceModifiedError

        day = check_day(day)
        row = self._open(day, row_key, actor, "DismissPoison", dismissal_refusal)
        now = self.clock()
        try:
            dismissal = {
                "PartitionKey": day,
                "RowKey": row_key,
                "DismissedAt": now,
                "DismissedBy": actor.by,
                "DismissReason": reason,
            }
            merge_if_unchanged(self.store.table(keys.POISON_TABLE), dismissal, row.etag or "*")
        except ResourceModifiedError as exc:
            raise Conflict(
                f"Poison message {row_key!r} changed while being dismissed (another operator?); reload it.",
                field="id",
            ) from exc
        dismissed = row.model_copy(
            update={"dismissed_at": now, "dismissed_by": actor.by, "dismiss_reason": reason}
        )
        self._uncount(day, row_key, dismissed)
        self._audit(day, row_key, row, actor, "DismissPoison", comment=reason)
        return dismissed

    def _open(
        self,
        day: str,
        row_key: str,
        actor: Actor,
        kind: str,
        refusal_of: Callable[[PoisonRow, str], SettleError | None],
    ) -> PoisonRow:
        """The poison row an action ``kind`` may act on: the principal is checked before the row's
        existence (a refused caller learns nothing about the row), then what the row allows."""
        row = self.store.get_poison(day, row_key)
        if not allowed(actor):
            if row is not None:
                self._audit(day, row_key, row, actor, kind, denied=True)
            raise denial(actor)
        if row is None:
            raise NotFound(f"No poison message {row_key!r} on {day}.")
        refusal = refusal_of(row, row_key)
        if refusal is not None:
            raise refusal
        return row

    def _project(self, row: PoisonRow, edits: Edits | None = None) -> tuple[str, str | None]:
        """The stored message through the resolver once (no rescheduling, no sleeping: 503 on a fault)."""

        try:
            props: dict[str, Any] = json.loads(row.application_properties or "{}")
        except ValueError:
            props = {}
        if not isinstance(props, dict):
            props = {}
        if edits is not None and edits.application_properties is not None:
            props = dict(edits.application_properties)
        props.pop(Prop.THROTTLE_RETRY_COUNT, None)  # a replay starts a fresh retry budget
        body = row.body_bytes()
        if edits is not None and edits.message_content is not None:
            body = edits.message_content.encode("utf-8")
        msg = ServiceBusMessage(
            body=body,
            message_id=row.message_id or "",
            session_id=row.session_id,
            correlation_id=row.correlation_id,
            application_properties=props,
            user_properties={},
            enqueued_time_utc=row.enqueued_time_utc,
            delivery_count=1,
        )
        base = self.resolver()
        once = _ReplayResolver(base.store, redelivery=lambda: None, clock=base.clock, sleep=lambda _s: None)
        try:
            outcome = once.handle(msg)
        except TransientProjectionError as exc:
            raise Unavailable(
                f"Storage failed during the replay; nothing was recorded, retry: {exc}"
            ) from exc
        return outcome.value, once.poison_reason if outcome is Outcome.POISONED else None

    def _record(
        self, day: str, row_key: str, row: PoisonRow, actor: Actor, outcome: str, detail: str | None
    ) -> PoisonRow | None:
        from azure.core.exceptions import ResourceModifiedError

        now = self.clock()
        changes: dict[str, Any] = {
            "PartitionKey": day,
            "RowKey": row_key,
            "ReplayedAt": now,
            "ReplayedBy": actor.by,
            "ReplayOutcome": outcome,
            "ReplayDetail": detail or "",
            "ReplayCount": row.replay_count + 1,
        }
        try:
            merge_if_unchanged(self.store.table(keys.POISON_TABLE), changes, row.etag or "*")
        except ResourceModifiedError:
            return None
        return row.model_copy(
            update={
                "replayed_at": now,
                "replayed_by": actor.by,
                "replay_outcome": outcome,
                "replay_detail": detail,
                "replay_count": row.replay_count + 1,
            }
        )

    def _uncount(self, day: str, row_key: str, row: PoisonRow) -> None:
        """The poison is dealt with: its index row and a ``-1 Poison`` delta, in one transaction."""
        from azure.data.tables import TableTransactionError

        pk = self.store.poison_partition(row.endpoint_id)
        ops = [
            delete(pk, keys.poison_index_row(day, row_key)),
            insert(delta_entity(pk, self.clock(), {counts.POISON: -1})),
        ]
        with contextlib.suppress(TableTransactionError):  # not counted (or uncounted already)
            self.store.submit(ops)

    def _audit(
        self,
        day: str,
        row_key: str,
        row: PoisonRow,
        actor: Actor,
        kind: str,
        *,
        denied: bool = False,
        comment: str | None = None,
        edits: Edits | None = None,
    ) -> None:
        """Operator actions on poison (no event row of their own) go to ``hoaudit`` (by UTC day), naming the
        endpoint the message names, if any; ``comment``: the reason or the replay's outcome."""
        now = self.clock()
        data: dict[str, Any] = {"day": day, "id": row_key}
        if edits is not None:
            data["messageContent"] = edits.message_content
            data["applicationProperties"] = edits.application_properties
        audit = AuditRow.of(
            _NoEvent(row.endpoint_id or ""),
            now,
            actor,
            kind,
            comment="Access denied" if denied else comment,
            data=json.dumps(data)[:32_000],
            access_denied=denied,
        )
        table = self.store.table(AUDIT_TABLE)
        table.create_entity(audit.to_entity(now.strftime("%Y%m%d"), f"{keys.stamp(now)}|{uuid.uuid4().hex}"))
