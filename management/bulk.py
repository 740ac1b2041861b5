"""Bulk resubmit / skip: the single action, once per event, with a result per event.

Each event goes through exactly the service call a single action makes
(:meth:`management.actions.OperatorActions.resubmit` / ``skip``): one claim, one control message and one
audit per event, a retry answered from its claim, NimBus's state rules deciding what is allowed. Nothing
here claims or sends on its own, so a bulk action raced against single actions or another bulk action
(another process, another operator) sends each event's message once: the claim keyed by the message it
addresses decides, and the loser's answer for that event is a 409 (or the winner's accepted action when it
was the same request). One event's refusal or fault is that event's result; the others go on. A bulk call
is safe to repeat as a whole: events already acted on answer from their claims (``replayed``) or 409.

The console sends a selection in chunks (at most 50 events each, ``BulkRequest``'s bound) and shows the
progress between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from common.errors import SettleError
from common.http import dependency_problem
from common.principal import Actor
from management.actions import ActionResult, OperatorActions
from management.rules import bulk_selection


@dataclass(frozen=True)
class BulkItem:
    event_id: str
    status: int  # 202 accepted, else the problem's status
    result: ActionResult | None = None
    slug: str | None = None
    detail: str | None = None


def run(
    actions: OperatorActions,
    endpoint_id: str,
    event_ids: list[str],
    actor: Actor,
    *,
    action: str,
    reason: str | None,
    message_ids: Mapping[str, str] | None = None,
    on_done: Callable[[BulkItem], None] = lambda _item: None,
) -> list[BulkItem]:
    """``message_ids``: per event, the message the operator saw; each action addresses it (a retry is
    answered from its claim), else the event's current message. An event selected twice is acted on once."""
    items: list[BulkItem] = []
    for event_id in bulk_selection(event_ids):
        message_id = (message_ids or {}).get(event_id)
        try:
            if action == "resubmit":
                result = actions.resubmit(
                    endpoint_id, event_id, actor, event_json=None, reason=reason, message_id=message_id
                )
            else:
                result = actions.skip(endpoint_id, event_id, actor, reason=reason, message_id=message_id)
            item = BulkItem(event_id, 202, result=result)
        except SettleError as exc:
            item = BulkItem(event_id, exc.status, slug=exc.slug, detail=str(exc))
        except Exception as exc:
            mapped = dependency_problem(exc)
            if mapped is None:
                raise
            item = BulkItem(event_id, mapped.status, slug=mapped.slug, detail=f"{mapped} (retry this event)")
        on_done(item)
        items.append(item)
    return items
