"""The ``settle`` commands: each reads its arguments, calls the client, prints (:mod:`settle_client.cli`)
through its :class:`~settle_client._cli_context.Context`.

A command returns the exit code, or raises :class:`Failure` (one line and a code) or the client's error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from settle_client import _cli_output as out
from settle_client._calls import present
from settle_client._cli_context import (
    CONFLICT,
    FAILED,
    OK,
    USAGE,
    Context,
    DryRun,
    Failure,
    confirm,
    ids_arg,
    not_found,
)
from settle_client.errors import Conflict, InvalidInput, SettleError
from settle_client.models import Coordinates, Key, Record
from settle_client.operator import BULK_CHUNK
from settle_client.operator_models import FoundEvent, OperatorEvent

T = TypeVar("T")


# -- commands ---------------------------------------------------------------------------------------------

FOUND_HEADERS = ("ENDPOINT", "EVENT", "STATUS", "MATCHED", "UPDATED", "JOB", "SESSION", "REASON")


def _found_rows(found: Iterable[FoundEvent]) -> Iterable[tuple[Any, ...]]:
    for f in found:
        yield (
            f.endpoint_id,
            f.event_id,
            _status(f.resolution_status, f.pending_sub_status),
            _matched(f),
            f.updated_at,
            f.external_job_id,
            f.session_id,
            f.reason,
        )


def cmd_find(ctx: Context) -> int:
    found = ctx.take(ctx.client.operator.find(ctx.args.id, page_size=ctx.page_size(200)), "matches")
    if not found:
        raise not_found(f"nothing matches {ctx.args.id!r} at any endpoint")
    ctx.emit(found, lambda: ctx.table(FOUND_HEADERS, _found_rows(found)))
    return OK


def _matched(found: FoundEvent) -> str | None:
    first = found.matches[0] if found.matches else None
    return f"{first.kind} {first.value}" if first else found.matched_by


def _status(status: str, sub: str | None) -> str:
    return f"{status}/{sub}" if sub else status


def _event(ctx: Context, endpoint: str, event_id: str) -> OperatorEvent:
    event = ctx.client.operator.event(endpoint, event_id)
    if event is None:
        raise not_found(f"event {event_id!r} on endpoint {endpoint!r}")
    return event


def cmd_show(ctx: Context) -> int:
    event = _event(ctx, ctx.args.endpoint, ctx.args.event_id)
    ctx.emit(event, lambda: _show(ctx, event))
    return OK


def _show(ctx: Context, e: OperatorEvent) -> str:
    parts = [
        out.fields(
            [
                ("endpoint", e.endpoint_id),
                ("event", e.event_id),
                ("status", _status(e.resolution_status, e.pending_sub_status)),
                ("event type", e.event_type_id),
                ("last message", e.last_message_id),
                ("session", e.session_id),
                ("external job", e.external_job_id),
                ("hand-off reason", e.handoff_reason),
                ("expected by", e.expected_by),
                ("reason", e.reason),
                ("updated", e.updated_at),
                ("settlement", _settlement(e)),
                ("actions now", ", ".join(e.actions) or None),
            ]
        )
    ]
    if e.history:
        rows = ((h.enqueued_time_utc, h.message_type, h.message_id, h.from_, h.to) for h in e.history)
        parts.append("history:\n" + ctx.table(("ENQUEUED", "TYPE", "MESSAGE", "FROM", "TO"), rows))
    if e.audits:
        rows2 = ((a.audit_timestamp, a.audit_type, a.auditor_name, a.comment) for a in e.audits)
        parts.append("audits:\n" + ctx.table(("WHEN", "TYPE", "BY", "COMMENT"), rows2))
    return "\n\n".join(parts)


def _settlement(e: OperatorEvent) -> str | None:
    s = e.settlement
    if s is None:
        return None
    return f"{s.message_type} {s.state} by {s.settled_by or '?'} (control message {s.control_message_id})"


def _conflict(ctx: Context, error: Conflict, endpoint: str, event_id: str) -> Failure:
    """A 409 with what the event's state is now (read again), so the operator knows what to do."""
    try:
        event = ctx.client.operator.event(endpoint, event_id)
    except SettleError:
        event = None
    state = ""
    if event is not None:
        allowed = ", ".join(event.actions) or "nothing"
        state = f"; the event is {_status(event.resolution_status, event.pending_sub_status)}"
        if event.settlement is not None:
            state += f", its settlement {event.settlement.state}"
        state += f"; allowed now: {allowed}"
    return Failure(f"{' '.join(str(error).split())}{state}", CONFLICT)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def json_arg(text: str, option: str) -> Any:
    """``text`` as JSON, or a usage error naming ``option`` and where the JSON breaks (nothing is sent)."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise Failure(f"{option} is not valid JSON: {error}; nothing was sent", USAGE) from error


def cmd_action(ctx: Context) -> int:
    args, action = ctx.args, ctx.args.action
    ids = ids_arg(args.event_ids) if action in ("resubmit", "skip") else [out.unquoted(args.event_id)]
    if len(ids) > 1 or (action in ("resubmit", "skip") and "-" in args.event_ids):
        if getattr(args, "event_json", None):
            raise Failure("--event-json applies to one event, not to a bulk resubmission", USAGE)
        return _bulk(ctx, action, args.endpoint, ids)
    extra: dict[str, Any] = {}
    if action in ("resubmit", "skip"):
        extra["reason"] = args.reason
        if getattr(args, "event_json", None):
            text = _read(args.event_json)
            json_arg(text, "--event-json")  # the EventJson Settle sends on is JSON text
            extra["event_json"] = text
    elif action == "complete":
        extra["result"] = json_arg(args.result, "--result") if args.result is not None else None
    else:
        extra.update(error_text=args.error, error_type=args.error_type)
    event = _event(ctx, args.endpoint, ids[0])  # after the arguments: bad JSON or a bad file sends nothing
    call = ctx.client.operator.calls.act(
        action, args.endpoint, event.event_id, message_id=event.last_message_id, by=ctx.by, **extra
    )
    summary = f"{action} event {event.event_id!r} on {args.endpoint!r} ({event.resolution_status})"
    done = _acting(ctx, args.endpoint, event.event_id, lambda: ctx.act(call, summary))
    repeat = " (repeat: answered from the earlier action)" if done.replayed else ""
    headline = f"{action}: {done.message_type} {done.state or 'accepted'}{repeat}"
    ctx.emit(done, lambda: _control(headline, done, ("confirmed", done.confirmed)))
    return OK


def _acting(ctx: Context, endpoint: str, event_id: str, act: Callable[[], T]) -> T:
    """``act()``; a 409 becomes a :class:`Failure` saying what the event's state is now."""
    try:
        return act()
    except Conflict as error:
        raise _conflict(ctx, error, endpoint, event_id) from error


def _control(headline: str, done: Any, *more: tuple[str, Any]) -> str:
    """What an action or a resolution sent: one line, then the control message's fields."""
    return (
        headline
        + "\n"
        + out.fields(
            [
                ("endpoint", done.endpoint_id),
                ("event", done.event_id),
                ("addressed message", done.addressed_message_id),
                ("control message", done.control_message_id),
                ("by", done.by),
                *more,
            ]
        )
    )


def _bulk(ctx: Context, action: str, endpoint: str, ids: list[str]) -> int:
    if not ids:
        raise Failure("no event ids given", USAGE)
    if ctx.args.dry_run:
        pages = ctx.client.operator.calls.bulk(action, endpoint, ids, reason=ctx.args.reason, by=ctx.by)  # type: ignore[arg-type]
        raise DryRun(*(pages.page(str(n) if n else None) for n in range(0, len(ids), BULK_CHUNK)))
    confirm(ctx, f"{action} {len(ids)} events on {endpoint!r}")
    done = [0, 0]  # accepted, refused

    def progress(answer: Any) -> None:
        done[0] += answer.accepted
        done[1] += answer.refused
        ctx.progress(f"{action}: {done[0] + done[1]}/{len(ids)} ({done[0]} accepted, {done[1]} refused)")

    answers = list(
        ctx.client.operator.bulk(
            action,  # type: ignore[arg-type]
            endpoint,
            ids,
            reason=ctx.args.reason,
            by=ctx.by,
            on_chunk=progress,
        )
    )
    items = [item for answer in answers for item in answer.items]
    ctx.emit(
        items,
        lambda: ctx.table(
            ("EVENT", "STATUS", "RESULT"),
            ((i.event_id, i.status, (i.problem and f"{i.problem}: {i.detail}") or "accepted") for i in items),
        ),
    )
    refused = [f"{action} {i.event_id}: {i.status} {i.problem}: {i.detail}" for i in items if i.status != 202]
    if not refused:
        return OK
    raise Failure(refused[0] if len(refused) == 1 else f"{len(refused)} of {len(ids)} not done", FAILED)


def cmd_resolve(ctx: Context) -> int:
    args = ctx.args
    event = _event(ctx, args.endpoint, args.event_id)
    message = args.message or _unconfirmed_message(ctx, event)
    if not message:
        raise not_found(
            f"an unconfirmed settlement of event {event.event_id!r} (it is "
            f"{_status(event.resolution_status, event.pending_sub_status)}); --message names one"
        )
    call = ctx.client.operator.calls.resolve(
        args.endpoint,
        event.event_id,
        message_id=message,
        resolution=args.resolution,
        reason=args.reason,
        control_message_id=args.control_message,
        by=ctx.by,
    )
    summary = f"resolve the settlement of {event.event_id!r} on {args.endpoint!r} as {args.resolution}"
    done = _acting(ctx, args.endpoint, event.event_id, lambda: ctx.act(call, summary))
    headline = f"settlement {done.state}{' (repeat: resolved before)' if done.replayed else ''}"
    ctx.emit(done, lambda: _control(headline, done))
    return OK


def _unconfirmed_message(ctx: Context, event: OperatorEvent) -> str | None:
    """The message the event's unconfirmed settlement addressed (its claim on the current message, else
    the endpoint's list of unconfirmed settlements)."""
    if event.settlement is not None:  # a repeated resolution is then answered as the earlier one
        return event.settlement.addressed_message_id
    for settlement in ctx.client.operator.unconfirmed(event.endpoint_id):
        if settlement.event_id == event.event_id:
            return settlement.addressed_message_id
    return None


# -- what the console shows ---------------------------------------------------------------------------


def cmd_endpoints(ctx: Context) -> int:
    overview = ctx.client.operator.overview()
    rows = [
        (
            e.endpoint_id,
            _at_least(e.counts.pending, e.counts.pending_at_least),
            _at_least(e.counts.pending_handoff, e.counts.pending_handoff_at_least),
            _at_least(e.counts.deferred, e.counts.deferred_at_least),
            _at_least(e.counts.failed, e.counts.failed_at_least),
            _at_least(e.counts.dead_lettered, e.counts.dead_lettered_at_least),
            _at_least(e.counts.unsupported, e.counts.unsupported_at_least),
            e.poison,
            _at_least(e.unconfirmed, e.unconfirmed_at_least),
            _at_least(e.overdue_handoffs, e.overdue_handoffs_at_least),
            _or_earlier(e.oldest_pending_at, e.oldest_pending_at_least),
            _or_earlier(e.oldest_failed_at, e.oldest_failed_at_least),
        )
        for e in overview.items
    ]
    headers = (
        *("ENDPOINT", "PENDING", "HANDOFF", "DEFERRED", "FAILED", "DEADLET", "UNSUPP", "POISON"),
        *("UNCONFIRMED", "OVERDUE", "OLDEST PENDING", "OLDEST FAILED"),
    )

    def human() -> str:
        text = ctx.table(headers, rows) if rows else "no endpoint has parked or failed anything yet"
        if overview.unattributed_poison:
            text += f"\npoison naming no endpoint: {overview.unattributed_poison}"
        return "\n".join([text, *(f"warning: {w}" for w in overview.warnings)])

    ctx.emit(overview, human)
    return OK


def _at_least(count: int, at_least: bool) -> int | str:
    """A count as the table shows it: ``1000+`` where counting stopped."""
    return f"{count}+" if at_least else count


def _or_earlier(oldest: datetime | None, at_least: bool) -> datetime | str | None:
    """An oldest age as the table shows it: ``≤2026-12-05T17:08:24.702Z`` where not every event was read
    (the oldest is at least that old)."""
    return f"≤{out.when(oldest)}" if oldest is not None and at_least else oldest


EVENT_HEADERS = ("EVENT", "STATUS", "TYPE", "UPDATED", "JOB", "SESSION", "REASON")


def cmd_events(ctx: Context) -> int:
    a = ctx.args
    events = ctx.take(
        ctx.client.operator.calls.events(
            a.endpoint, status=a.status, event_types=a.event_type or (), since=a.since, until=a.until
        ),
        "events",
    )
    rows = (
        (
            e.event_id,
            _status(e.resolution_status, e.pending_sub_status),
            e.event_type_id,
            e.updated_at,
            e.external_job_id,
            e.session_id,
            e.reason,
        )
        for e in events
    )
    return ctx.listing(events, EVENT_HEADERS, rows, f"no such events on {a.endpoint!r}")


def cmd_failed(ctx: Context) -> int:
    found = ctx.take(ctx.client.operator.failed(page_size=ctx.page_size(200)), "failed events")
    return ctx.listing(found, FOUND_HEADERS, _found_rows(found), "no failed events")


def cmd_audits(ctx: Context) -> int:
    a = ctx.args
    audits = ctx.take(
        ctx.client.operator.audits(
            since=a.since, until=a.until, endpoint=a.endpoint, audit_type=a.type, by=a.operator
        ),
        "audits",
    )
    rows = (
        (x.audit_timestamp, x.audit_type, x.auditor_name, x.endpoint_id, x.event_id, x.comment)
        for x in audits
    )
    headers = ("WHEN", "TYPE", "BY", "ENDPOINT", "EVENT", "COMMENT")
    return ctx.listing(audits, headers, rows, "no audits in that window")


def cmd_stuck(ctx: Context) -> int:
    records = ctx.take(ctx.client.operator.stuck(page_size=ctx.page_size(1000)), "stuck records")
    rows = (
        (
            _record_key(r),
            r.locked_until,
            r.updated_at,
        )
        for r in records
    )
    headers = ("KEY", "LOCKED UNTIL", "UPDATED")
    return ctx.listing(records, headers, rows, "no record is stuck in Processing")


def cmd_unconfirmed(ctx: Context) -> int:
    listed = ctx.client.operator.calls.unconfirmed(ctx.args.endpoint, page_size=ctx.page_size(1000))
    items = ctx.take(listed, "unconfirmed settlements")
    rows = (
        (s.event_id, s.message_type, s.addressed_message_id, s.control_message_id, s.settled_by, s.claimed_at)
        for s in items
    )
    headers = ("EVENT", "TYPE", "ADDRESSED MESSAGE", "CONTROL MESSAGE", "BY", "CLAIMED")
    return ctx.listing(items, headers, rows, "no unconfirmed settlement")


def cmd_overdue(ctx: Context) -> int:
    listed = ctx.client.operator.calls.overdue(ctx.args.endpoint, page_size=ctx.page_size(1000))
    items = ctx.take(listed, "overdue hand-offs")
    rows = ((o.event_id, o.expected_by) for o in items)
    return ctx.listing(items, ("EVENT", "EXPECTED BY"), rows, "no overdue hand-off")


# -- state --------------------------------------------------------------------------------------------


def _key(args: argparse.Namespace) -> Key:
    given: dict[str, Any] = {}
    if args.key:
        loaded = json_arg(args.key, "--key")
        if not isinstance(loaded, dict):
            raise Failure("--key must be a JSON object", USAGE)
        given.update(loaded)
    named = {
        "tenantId": args.tenant,
        "entityId": args.entity,
        "itemEntityKey": args.item_entity_key,
        "itemKey": args.item_key,
        "subItemEntityKey": args.sub_item_entity_key,
        "subItemKey": args.sub_item_key,
        "entityExecutionId": args.execution,
    }
    given.update(present(**named))
    if args.scope is not None:
        given["scope" if not args.scope.isdigit() else "scopeId"] = (
            int(args.scope) if args.scope.isdigit() else args.scope
        )
    try:
        return Key.of(given)
    except (InvalidInput, ValueError) as error:
        raise Failure(f"the key is incomplete or wrong: {error}", USAGE) from error


def _record_key(r: Record) -> str:
    """How the CLI shows a record's key: tenant/scope/entity/item entity key/item key."""
    return f"{r.tenant_id}/{r.scope}/{r.entity_id}/{r.item_entity_key}/{r.item_key}"


def _record_rows(records: Iterable[Any]) -> Iterable[tuple[Any, ...]]:
    for r in records:
        yield (r.version, r.status, r.substatus, r.updated_at, r.locked_until, r.error, r.data)


RECORD_HEADERS = ("VERSION", "STATUS", "SUBSTATUS", "UPDATED", "LOCKED UNTIL", "ERROR", "DATA")


def _no_record(key: Key) -> Failure:
    return not_found(f"a record for {key.item_entity_key}/{key.item_key} (tenant {key.tenant_id})")


def cmd_state_get(ctx: Context) -> int:
    key = _key(ctx.args)
    record = ctx.client.operator.lookup(key, page_size=1).record
    if record is None:
        raise _no_record(key)
    ctx.emit(
        record,
        lambda: out.fields(
            [
                ("key", _record_key(record)),
                ("status", record.status),
                ("substatus", record.substatus),
                ("version", record.version),
                ("updated", record.updated_at),
                ("locked until", record.locked_until),
                ("error", record.error),
                ("data", record.data),
            ]
        ),
    )
    return OK


def cmd_state_history(ctx: Context) -> int:
    key = _key(ctx.args)
    versions = ctx.take(ctx.client.operator.history(key), "versions")
    if not versions:
        raise _no_record(key)
    ctx.emit(versions, lambda: ctx.table(RECORD_HEADERS, _record_rows(versions)))
    return OK


# -- an agent's lease ------------------------------------------------------------------------------------


def cmd_handoffs(ctx: Context) -> int:
    args = ctx.args
    if args.leased:
        handoff = ctx.client.handoffs.receive(
            args.endpoint, args.event_type, args.wait, lease_seconds=args.lease
        )
    else:
        handoff = ctx.client.handoffs.next(args.endpoint, args.event_type, args.wait)
    if handoff is None:
        raise not_found(f"a parked hand-off on {args.endpoint!r} (none free)")
    lease = handoff.lease
    ctx.emit(
        handoff,
        lambda: out.fields(
            [
                ("endpoint", handoff.endpoint_id),
                ("event", handoff.coordinates.event_id),
                ("event type", handoff.event_type_id),
                ("message", handoff.coordinates.message_id),
                ("session", handoff.coordinates.session_id),
                ("external job", handoff.external_job_id),
                ("hand-off reason", handoff.handoff_reason),
                ("expected by", handoff.expected_by),
                ("parked", handoff.parked_at),
                ("lease token", lease.token if lease else None),
                ("lease until", lease.expires_at if lease else None),
                ("leased by", lease.leased_by if lease else None),
                ("payload", handoff.payload),
            ]
        ),
    )
    return OK


def cmd_lease(ctx: Context) -> int:
    """Renew or release the lease ``--lease-token`` holds (a receive from another shell or process)."""
    a = ctx.args
    if a.lease_command == "renew":
        call = ctx.client.handoffs.requests.renew_lease(
            a.endpoint, a.event_id, a.lease_token, lease_seconds=a.lease
        )
    else:
        call = ctx.client.handoffs.requests.release_lease(a.endpoint, a.event_id, a.lease_token)
    answer = ctx.act(call, f"{a.lease_command} the lease on {a.event_id!r} at {a.endpoint!r}")
    ctx.emit(answer, lambda: out.fields([(k, v) for k, v in answer.items()]) or f"{a.lease_command}d")
    return OK


def cmd_settle_leased(ctx: Context) -> int:
    """Complete or fail a leased hand-off with its lease token (fenced: refused once another agent
    leased it)."""
    a = ctx.args
    result = json_arg(a.result, "--result") if getattr(a, "result", None) is not None else None
    event = ctx.client.events.get(a.endpoint, a.event_id)
    if event is None:
        raise not_found(f"event {a.event_id!r} on endpoint {a.endpoint!r}")
    coordinates = Coordinates(
        event_id=event.event_id,
        session_id=event.session_id,
        message_id=event.last_message_id,
        event_type_id=event.event_type_id,
        correlation_id=event.correlation_id,
    )
    requests = ctx.client.handoffs.requests
    if a.settle_command == "complete":
        call = requests.complete(
            a.endpoint, coordinates, result=result, settled_by=ctx.by, lease_token=a.lease_token
        )
    else:
        call = requests.fail(
            a.endpoint,
            coordinates,
            a.error,
            error_type=a.error_type,
            settled_by=ctx.by,
            lease_token=a.lease_token,
        )
    done = ctx.act(call, f"{a.settle_command} the hand-off {a.event_id!r} on {a.endpoint!r}")
    ctx.emit(
        done,
        lambda: out.fields(
            [
                ("settled", a.settle_command),
                ("event", a.event_id),
                ("control message", done.control_message_id),
                ("state", done.state),
                ("confirmed", done.confirmed),
                ("replayed", done.replayed),
            ]
        ),
    )
    return OK
