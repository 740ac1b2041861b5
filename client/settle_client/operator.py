"""``client.operator`` (and ``AsyncSettleClient.operator``): what an operator does in the console, as calls.

Find a hand-off by any id, read an event with the actions it allows, resubmit / skip / complete / fail
it (one at a time or in bulk), resolve an unconfirmed settlement, replay or dismiss poison messages, look
up a state record. The ``settle`` command line (:mod:`settle_client.cli`) is built on this.

In Azure the management API wants the operator's Entra ID token (``credential`` + ``token_scope``, app
role ``Settle.Operator``); locally no sign-in is needed and ``by`` names who acted in the audit.

Retries: reads are retried; an action addressed to a message (``message_id``: the message the operator
saw, as the console sends it) is answered from its claim when repeated, so it is retried too; without one
it addresses the event's *current* message, which a lost answer may have changed, so it is not. Replay
and dismiss refuse a repeat (409), so they are not retried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel

from settle_client._calls import Call, Page, Pages, Requests, iso, jsonable, model, parse_as, present
from settle_client._core import AsyncPart, Part, operation, paged
from settle_client.models import Key, KeyLike, Record
from settle_client.operator_models import (
    ActionAccepted,
    AuditSearchEntry,
    AuditSearchPage,
    BulkAnswer,
    EndpointsOverview,
    EventPage,
    EventSummary,
    FindAnswer,
    FoundEvent,
    OperatorEvent,
    OverdueHandoff,
    OverdueHandoffs,
    PoisonEntry,
    PoisonPage,
    RecordLookup,
    ReplayAnswer,
    SettlementResolved,
    SettlementView,
    StuckRecords,
    UnconfirmedSettlements,
)
from settle_client.retry import Safety

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

Action = Literal["resubmit", "skip", "complete", "fail"]
ACTIONS: tuple[Action, ...] = ("resubmit", "skip", "complete", "fail")
# The server's bulk route takes at most this many events per call.
BULK_CHUNK = 50


class OperatorCalls:
    """The management API's calls (what is sent, how safe a retry is, how the answer is read). Each is
    also a method of :class:`Operator` and :class:`AsyncOperator`, with this docstring."""

    def __init__(self, requests: Requests) -> None:
        self.requests = requests

    def find(self, text: str, *, page_size: int | None = None) -> Pages[FoundEvent]:
        """Every hand-off, at any endpoint, matching ``text``: an event id or its first characters, a
        session id, a message id or an external job id (``GET v1/find?q=``); each says what matched.
        Pages followed lazily (stop iterating to read no more)."""
        if not text.strip():
            raise ValueError("give an id to find")
        return self._listing("v1/find", FindAnswer, (("q", text.strip()),), page_size)

    def overview(self) -> Call[EndpointsOverview]:
        """Every endpoint with its counts by status, oldest ages, poison, unconfirmed and overdue."""
        return self.requests.call("GET", "v1/endpoints", parse_as(EndpointsOverview), Safety.IDEMPOTENT)

    def events(
        self,
        endpoint: str,
        *,
        status: str | None = None,
        event_types: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        page_size: int | None = None,
    ) -> Pages[EventSummary]:
        """An endpoint's events, newest change first, by status (``Failed``, ``PendingHandoff``, ...),
        event type and time; pages followed lazily."""
        types = ",".join(event_types) or None
        params = (
            ("endpointId", endpoint),
            *_filters(status=status, eventTypeId=types, **{"from": since, "to": until}),
        )
        return self._listing("v1/endpoints/events", EventPage, params, page_size, counted=True)

    def failed(self, *, page_size: int | None = None) -> Pages[FoundEvent]:
        """Failed and dead-lettered events of every endpoint, newest change first; pages followed
        lazily until every one was listed."""
        return self._listing("v1/failed", FindAnswer, (), page_size)

    def audits(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        endpoint: str | None = None,
        audit_type: str | None = None,
        by: str | None = None,
        page_size: int | None = None,
    ) -> Pages[AuditSearchEntry]:
        """Operator audits, oldest first (server default: the last 24 hours; at most 31 days a search)."""
        params = _filters(endpointId=endpoint, auditType=audit_type, by=by, **{"from": since, "to": until})
        return self._listing("v1/audits", AuditSearchPage, params, page_size)

    def stuck(self, *, page_size: int | None = None) -> Pages[Record]:
        """State records stuck in Processing past their lock (the lock-expiry index, never a scan); pages
        followed lazily."""
        return self._listing("v1/records/stuck", StuckRecords, (), page_size)

    def overdue(self, endpoint: str, *, page_size: int | None = None) -> Pages[OverdueHandoff]:
        """Parked hand-offs of ``endpoint`` past their ExpectedBy, oldest park first (parks from before
        ADR-0022 change 5 first, most overdue first); pages followed lazily."""
        params = (("endpointId", endpoint),)
        return self._listing("v1/endpoints/overdue", OverdueHandoffs, params, page_size, counted=True)

    def _listing(
        self,
        route: str,
        page_model: type[Any],
        params: tuple[tuple[str, str], ...],
        page_size: int | None,
        *,
        counted: bool = False,
    ) -> Pages[Any]:
        def page(token: str | None) -> Call[Page[Any]]:
            asked = params + _filters(pageSize=page_size, continuationToken=token)

            def parse(response: httpx.Response) -> Page[Any]:
                answer = model(page_model, response)
                # A count of them all, where the answer has one (a stuck-records page counts itself only).
                count = getattr(answer, "count", None) if counted else None
                at_least = getattr(answer, "at_least", False)
                return Page(answer.items, answer.continuation_token, count, at_least)

            return self.requests.call("GET", route, parse, Safety.IDEMPOTENT, params=asked)

        return Pages(page)

    def event(self, endpoint: str, event_id: str) -> Call[OperatorEvent | None]:
        """The event with its history, audits, the actions it allows now and its settlement claim;
        ``None`` when the event is unknown on ``endpoint``."""
        ids = {"endpointId": endpoint, "eventId": event_id}
        return self.requests.found(
            OperatorEvent, "v1/endpoints/event", "v1/endpoints/{endpointId}/events/{eventId}", ids
        )

    def unconfirmed(self, endpoint: str, *, page_size: int | None = None) -> Pages[SettlementView]:
        """Settlements of ``endpoint`` Settle could neither confirm nor safely re-send (resolve each);
        pages followed lazily."""
        params = (("endpointId", endpoint),)
        return self._listing(
            "v1/endpoints/unconfirmed", UnconfirmedSettlements, params, page_size, counted=True
        )

    def act(
        self,
        action: Action,
        endpoint: str,
        event_id: str,
        *,
        message_id: str | None = None,
        by: str | None = None,
        reason: str | None = None,
        event_json: str | None = None,
        result: Any = None,
        error_text: str | None = None,
        error_type: str | None = None,
    ) -> Call[ActionAccepted]:
        """Resubmit, skip, complete or fail one event (202: one audited control message). Give
        ``message_id`` (the event's ``last_message_id`` as read) so a repeat is answered from its claim and
        an event that moved on is refused (409) rather than acted on again."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
        if action == "fail" and not (error_text or "").strip():
            raise ValueError("fail needs an error text")
        body = present(messageId=message_id, by=by)
        if action in ("resubmit", "skip"):
            body.update(present(reason=reason, eventJson=event_json if action == "resubmit" else None))
        elif action == "complete":
            body["result"] = jsonable(result)
        else:
            body.update(present(errorText=error_text, errorType=error_type))
        return self.requests.call(
            "POST",
            f"v1/events/{action}",
            parse_as(ActionAccepted),
            Safety.IDEMPOTENT if message_id else Safety.UNSAFE,
            ids={"endpointId": endpoint, "eventId": event_id},
            path_form=f"v1/events/{{endpointId}}/{{eventId}}/{action}",
            body=body,
        )

    def bulk(
        self,
        action: Literal["resubmit", "skip"],
        endpoint: str,
        event_ids: Sequence[str],
        *,
        message_ids: Mapping[str, str] | None = None,
        reason: str | None = None,
        by: str | None = None,
        on_chunk: Callable[[BulkAnswer], None] | None = None,
    ) -> Pages[BulkAnswer]:
        """Resubmit or skip many events, :data:`BULK_CHUNK` per call; one answer per chunk (``on_chunk``
        also gets each, for progress). Each event gets the single action's result (202 or its problem)."""
        ids = list(dict.fromkeys(event_ids))

        def chunk(after: str | None) -> Call[Page[BulkAnswer]]:
            start = int(after) if after else 0
            end = start + BULK_CHUNK

            def parse(response: httpx.Response) -> Page[BulkAnswer]:
                answer = model(BulkAnswer, response)
                if on_chunk is not None:
                    on_chunk(answer)
                return Page([answer], str(end) if end < len(ids) else None)

            return self._bulk_chunk(action, endpoint, ids[start:end], message_ids, reason, by, parse)

        return Pages(chunk, empty=not ids)

    def _bulk_chunk(
        self,
        action: Literal["resubmit", "skip"],
        endpoint: str,
        ids: list[str],
        message_ids: Mapping[str, str] | None,
        reason: str | None,
        by: str | None,
        parse: Callable[[httpx.Response], T],
    ) -> Call[T]:
        addressed = {i: message_ids[i] for i in ids if message_ids and i in message_ids} or None
        body = present(action=action, eventIds=ids, messageIds=addressed, reason=reason, by=by)
        # Each event addressed to the message seen is answered from its claim when repeated.
        safety = Safety.IDEMPOTENT if addressed and len(addressed) == len(ids) else Safety.UNSAFE
        return self.requests.call(
            "POST",
            "v1/endpoints/bulk",
            parse,
            safety,
            ids={"endpointId": endpoint},
            path_form="v1/endpoints/{endpointId}/bulk",
            body=body,
        )

    def resolve(
        self,
        endpoint: str,
        event_id: str,
        *,
        message_id: str,
        resolution: Literal["delivered", "released"],
        reason: str,
        control_message_id: str | None = None,
        by: str | None = None,
    ) -> Call[SettlementResolved]:
        """Resolve an unconfirmed settlement: ``delivered`` (checked at the endpoint) or ``released``
        (the hand-off can be settled again); audited with who and why."""
        body = present(
            messageId=message_id,
            resolution=resolution,
            reason=reason,
            controlMessageId=control_message_id,
            by=by,
        )
        # A repeated resolution is answered from the earlier one's audit (``replayed``).
        return self.requests.call(
            "POST",
            "v1/events/settlement/resolve",
            parse_as(SettlementResolved),
            Safety.IDEMPOTENT,
            ids={"endpointId": endpoint, "eventId": event_id},
            path_form="v1/events/{endpointId}/{eventId}/settlement/resolve",
            body=body,
        )

    def poison(self, day: str, *, page_size: int | None = None) -> Pages[PoisonEntry]:
        """The poison messages of one UTC day (``YYYYMMDD``), in enqueue order; pages followed lazily."""

        def page(token: str | None) -> Call[Page[PoisonEntry]]:
            params: tuple[tuple[str, str], ...] = (("day", day),)
            if page_size is not None:
                params += (("pageSize", str(page_size)),)
            if token:
                params += (("continuationToken", token),)
            return self.requests.call("GET", "v1/poison", _poison_page, Safety.IDEMPOTENT, params=params)

        return Pages(page)

    def replay(
        self,
        day: str,
        poison_id: str,
        *,
        by: str | None = None,
        message_content: str | None = None,
        application_properties: Mapping[str, Any] | None = None,
    ) -> Call[ReplayAnswer]:
        """Replay a poison message through the resolver (409 :class:`Conflict` if replayed before)."""
        properties = dict(application_properties) if application_properties is not None else None
        body = present(by=by, messageContent=message_content, applicationProperties=properties)
        return self._poison("replay", day, poison_id, parse_as(ReplayAnswer), body)

    def dismiss(self, day: str, poison_id: str, reason: str, *, by: str | None = None) -> Call[PoisonEntry]:
        """Archive a poison message no fix will project, with why (409 if dismissed or projected before)."""
        return self._poison("dismiss", day, poison_id, parse_as(PoisonEntry), present(reason=reason, by=by))

    def _poison(
        self, action: str, day: str, poison_id: str, parse: Callable[[httpx.Response], M], body: Any
    ) -> Call[M]:
        # Refused when repeated (409), so not retried after a lost answer.
        return self.requests.call(
            "POST",
            f"v1/poison/{action}",
            parse,
            Safety.UNSAFE,
            ids={"day": day, "id": poison_id},
            path_form=f"v1/poison/{{day}}/{{id}}/{action}",
            body=body,
        )

    def lookup(self, key: KeyLike, *, page_size: int | None = None) -> Call[RecordLookup]:
        """A state record by its key (``record`` is ``None`` when it has none) with the first page of its
        history: the operator's read, which in Azure takes the operator's token, not a function key."""
        return self._lookup(Key.of(key), page_size, None, parse_as(RecordLookup))

    def history(self, key: KeyLike, *, page_size: int | None = None) -> Pages[Record]:
        """Every version of a record, newest first, through the operator's read; pages followed lazily."""
        parsed = Key.of(key)
        return Pages(lambda token: self._lookup(parsed, page_size, token, _history_page))

    def _lookup(
        self, key: Key, page_size: int | None, token: str | None, parse: Callable[[httpx.Response], T]
    ) -> Call[T]:
        body: dict[str, Any] = {"key": key.to_wire(), **present(pageSize=page_size, continuationToken=token)}
        return self.requests.call("POST", "v1/records/lookup", parse, Safety.IDEMPOTENT, body=body)


def _filters(**given: Any) -> tuple[tuple[str, str], ...]:
    """Query parameters of the ``given`` filters that are set (times in the API's form)."""
    return tuple(
        (k, iso(v) if isinstance(v, datetime) else str(v)) for k, v in given.items() if v is not None
    )


def _poison_page(response: httpx.Response) -> Page[PoisonEntry]:
    page = model(PoisonPage, response)
    return Page(page.items, page.continuation_token)


def _history_page(response: httpx.Response) -> Page[Record]:
    history = model(RecordLookup, response).history
    return Page(history.items, history.continuation_token)


class _Surface:
    """The operator's methods, each sending one builder's call (or its pages) through the client."""

    requests: Requests

    @functools.cached_property
    def calls(self) -> OperatorCalls:
        return OperatorCalls(self.requests)

    find = paged(OperatorCalls.find, via="calls")
    overview = operation(OperatorCalls.overview, via="calls")
    events = paged(OperatorCalls.events, via="calls")
    failed = paged(OperatorCalls.failed, via="calls")
    audits = paged(OperatorCalls.audits, via="calls")
    stuck = paged(OperatorCalls.stuck, via="calls")
    overdue = paged(OperatorCalls.overdue, via="calls")
    event = operation(OperatorCalls.event, via="calls")
    unconfirmed = paged(OperatorCalls.unconfirmed, via="calls")
    act = operation(OperatorCalls.act, via="calls")
    bulk = paged(OperatorCalls.bulk, via="calls")
    resolve = operation(OperatorCalls.resolve, via="calls")
    poison = paged(OperatorCalls.poison, via="calls")
    replay = operation(OperatorCalls.replay, via="calls")
    dismiss = operation(OperatorCalls.dismiss, via="calls")
    lookup = operation(OperatorCalls.lookup, via="calls")
    history = paged(OperatorCalls.history, via="calls")


class Operator(_Surface, Part):
    """``client.operator``: the management API (see the module docstring for auth and retries)."""


class AsyncOperator(_Surface, AsyncPart):
    """``AsyncSettleClient.operator``: :class:`Operator` for asyncio (the same calls, awaited)."""
