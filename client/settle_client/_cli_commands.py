"""The ``settle`` commands: each reads its arguments, calls the client, prints (:mod:`settle_client.cli`).

A command returns the exit code, or raises :class:`Failure` (one line and a code) or the client's error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

from settle_client import _cli_output as out
from settle_client._calls import present
from settle_client.client import SettleClient
from settle_client.errors import Conflict, InvalidInput, NotFound, SettleError
from settle_client.models import Key
from settle_client.operator_models import FoundEvent, OperatorEvent

T = TypeVar("T")

# Exit codes (argparse itself exits 2 on a usage error).
OK, NOTHING, USAGE, INVALID, AUTH, CONFLICT, UNAVAILABLE, FAILED = 0, 1, 2, 3, 4, 5, 6, 7
EXIT_CODES = f"""exit codes:
  {OK}  found / done
  {NOTHING}  nothing found (unknown id, event, record, no parked hand-off)
  {USAGE}  wrong usage (the command line)
  {INVALID}  Settle refused the input (400: the message names the field)
  {AUTH}  401/403: no or a refused credential (the message says what to pass)
  {CONFLICT}  409: the state does not allow it (the message says what the state is)
  {UNAVAILABLE}  Settle unavailable or unreachable (503/429 after retries, no answer)
  {FAILED}  some items of a bulk command were refused (each is listed), or another error"""

ENVIRONMENT = """environment:
  SETTLE_URL            the function app (default what `make run` serves: http://127.0.0.1:7071,
                        or the port SETTLE_RUN_PORT names)
  SETTLE_FUNCTION_KEY   a function key (sent as x-functions-key)
  SETTLE_TOKEN_SCOPE    get an Entra ID token for this scope (api://<app-client-id>/.default) with
                        azure-identity's DefaultAzureCredential (pip install azure-identity): the
                        operator's sign-in the management API wants in Azure
  SETTLE_OPERATOR       who acts, recorded in the audit when no principal is signed in (default: $USER)"""


class Failure(Exception):
    """One line for stderr and the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- what a command gets ---------------------------------------------------------------------------


class Context:
    """What a command gets: the client, the parsed arguments, where to print."""

    def __init__(
        self, args: argparse.Namespace, client: SettleClient, stdout: TextIO, stderr: TextIO
    ) -> None:
        self.args = args
        self.client = client
        self.stdout = stdout
        self.stderr = stderr
        self.by: str = args.by or os.environ.get("SETTLE_OPERATOR") or _user()

    def print(self, text: str) -> None:
        print(text, file=self.stdout)

    def emit(self, value: Any, human: Callable[[], str]) -> None:
        self.print(out.as_json(value) if self.args.json else human())

    def nothing(self, empty: str, message: str) -> Failure:
        """What to raise when there is nothing to show: ``message``, exit code NOTHING; with ``--json``,
        ``empty`` (``[]`` or ``null``) is printed first, so a script still reads JSON."""
        if self.args.json:
            self.print(empty)
        return Failure(message, NOTHING)

    def progress(self, text: str) -> None:
        print(text, file=self.stderr, flush=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in a container: the audit still says it came from here
        return "settle-cli"


# -- commands ---------------------------------------------------------------------------------------------


def cmd_find(ctx: Context) -> int:
    found = ctx.client.operator.find(ctx.args.id)
    if not found:
        raise ctx.nothing("[]", f"nothing matches {ctx.args.id!r} at any endpoint")
    ctx.emit(
        found,
        lambda: out.table(
            ("ENDPOINT", "EVENT", "STATUS", "MATCHED", "UPDATED", "JOB", "SESSION", "REASON"),
            (
                (
                    f.endpoint_id,
                    f.event_id,
                    _status(f.resolution_status, f.pending_sub_status),
                    _matched(f),
                    f.updated_at,
                    f.external_job_id,
                    f.session_id,
                    f.reason,
                )
                for f in found
            ),
        ),
    )
    return OK


def _matched(found: FoundEvent) -> str | None:
    first = found.matches[0] if found.matches else None
    return f"{first.kind} {first.value}" if first else found.matched_by


def _status(status: str, sub: str | None) -> str:
    return f"{status}/{sub}" if sub else status


def _event(ctx: Context, endpoint: str, event_id: str) -> OperatorEvent:
    event = ctx.client.operator.event(endpoint, event_id)
    if event is None:
        raise Failure(f"event {event_id!r} is unknown on endpoint {endpoint!r}", NOTHING)
    return event


def cmd_show(ctx: Context) -> int:
    event = _event(ctx, ctx.args.endpoint, ctx.args.event_id)
    ctx.emit(event, lambda: _show(event))
    return OK


def _show(e: OperatorEvent) -> str:
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
        parts.append("history:\n" + out.table(("ENQUEUED", "TYPE", "MESSAGE", "FROM", "TO"), rows))
    if e.audits:
        rows2 = ((a.audit_timestamp, a.audit_type, a.auditor_name, a.comment) for a in e.audits)
        parts.append("audits:\n" + out.table(("WHEN", "TYPE", "BY", "COMMENT"), rows2))
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


def _ids(values: Iterable[str]) -> list[str]:
    ids: list[str] = []
    for value in values:
        if value == "-":
            ids += [line.strip() for line in sys.stdin if line.strip()]
        else:
            ids.append(value)
    return list(dict.fromkeys(ids))


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def cmd_action(ctx: Context) -> int:
    args, action = ctx.args, ctx.args.action
    ids = _ids(args.event_ids) if action in ("resubmit", "skip") else [args.event_id]
    if len(ids) > 1 or (action in ("resubmit", "skip") and "-" in args.event_ids):
        if getattr(args, "event_json", None):
            raise Failure("--event-json applies to one event, not to a bulk resubmission", USAGE)
        return _bulk(ctx, action, args.endpoint, ids)
    extra: dict[str, Any] = {}
    if action in ("resubmit", "skip"):
        extra["reason"] = args.reason
        if getattr(args, "event_json", None):
            extra["event_json"] = _read(args.event_json)
    elif action == "complete":
        extra["result"] = _json_arg(args.result) if args.result is not None else None
    else:
        extra.update(error_text=args.error, error_type=args.error_type)
    event = _event(ctx, args.endpoint, ids[0])  # after the arguments: a bad file sends nothing
    done = _acting(
        ctx,
        args.endpoint,
        event.event_id,
        lambda: ctx.client.operator.act(
            action, args.endpoint, event.event_id, message_id=event.last_message_id, by=ctx.by, **extra
        ),
    )
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


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a plain string is sent verbatim (the server takes a string as EventJson)


def _bulk(ctx: Context, action: str, endpoint: str, ids: list[str]) -> int:
    if not ids:
        raise Failure("no event ids given", USAGE)
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
        lambda: out.table(
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
        raise Failure(
            f"event {event.event_id!r} has no unconfirmed settlement (it is "
            f"{_status(event.resolution_status, event.pending_sub_status)}); --message names one",
            NOTHING,
        )
    done = _acting(
        ctx,
        args.endpoint,
        event.event_id,
        lambda: ctx.client.operator.resolve(
            args.endpoint,
            event.event_id,
            message_id=message,
            resolution=args.resolution,
            reason=args.reason,
            control_message_id=args.control_message,
            by=ctx.by,
        ),
    )
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


def _today() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


def cmd_poison_list(ctx: Context) -> int:
    day = ctx.args.day or _today()
    entries = [
        p
        for p in ctx.client.operator.poison(day)
        if ctx.args.all or (p.replayed_at is None and p.dismissed_at is None)
    ]
    ctx.emit(
        entries,
        lambda: (
            out.table(
                ("DAY", "ID", "ENDPOINT", "MESSAGE", "RECORDED", "REASON", "REPLAYED", "DISMISSED"),
                (
                    (
                        p.day,
                        p.id,
                        p.endpoint_id,
                        p.message_id,
                        p.recorded_at,
                        p.reason,
                        p.replay_outcome,
                        p.dismissed_at,
                    )
                    for p in entries
                ),
            )
            if entries
            else f"no poison messages on {day}"
            + ("" if ctx.args.all else " waiting (--all: replayed ones too)")
        ),
    )
    return OK


def _each(
    ctx: Context, verb: str, ids: list[str], one: Callable[[str], Any], failed: Callable[[Any], str | None]
) -> int:
    """Run ``one`` per id, a progress line per id on stderr when there are several. A refused id (409,
    404, 400) or a result ``failed`` names is reported and the others go on; the exit code says so."""
    if not ids:
        raise Failure("no ids given", USAGE)
    results: list[Any] = []
    problems: list[str] = []
    for n, item_id in enumerate(ids, 1):
        try:
            result = one(item_id)
            outcome = failed(result)
            results.append(result)
        except (Conflict, NotFound, InvalidInput) as error:
            if len(ids) == 1:
                raise
            outcome = " ".join(str(error).split())
            results.append({"id": item_id, "error": outcome, "status": error.status})
        if outcome:
            problems.append(f"{verb} {item_id}: {outcome}")
        if len(ids) > 1:
            ctx.progress(f"{verb}: {n}/{len(ids)} {item_id}: {outcome or 'ok'}")
    ctx.emit(results if len(ids) > 1 else results[0], lambda: _poison_results(verb, results))
    if not problems:
        return OK
    raise Failure(problems[0] if len(problems) == 1 else f"{len(problems)} of {len(ids)} not done", FAILED)


def _poison_results(verb: str, results: list[Any]) -> str:
    rows = []
    for r in results:
        if isinstance(r, dict):
            rows.append((r["id"], "refused", r["error"]))
        elif hasattr(r, "outcome"):
            rows.append((r.poison.id, r.outcome, r.detail))
        else:
            rows.append((r.id, verb, r.dismiss_reason))
    return out.table(("ID", "OUTCOME", "DETAIL"), rows)


def cmd_poison_replay(ctx: Context) -> int:
    day = ctx.args.day
    return _each(
        ctx,
        "replay",
        _ids(ctx.args.ids),
        lambda i: ctx.client.operator.replay(day, i, by=ctx.by),
        # Replayed, but not projected: the message is still poison (the detail says why).
        lambda r: f"poisoned again: {r.detail}" if r.outcome == "poisoned" else None,
    )


def cmd_poison_dismiss(ctx: Context) -> int:
    day, reason = ctx.args.day, ctx.args.reason
    return _each(
        ctx,
        "dismissed",
        _ids(ctx.args.ids),
        lambda i: ctx.client.operator.dismiss(day, i, reason, by=ctx.by),
        lambda r: None,
    )


def _key(args: argparse.Namespace) -> Key:
    given: dict[str, Any] = {}
    if args.key:
        loaded = _json_arg(args.key)
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


def _record_rows(records: Iterable[Any]) -> Iterable[tuple[Any, ...]]:
    for r in records:
        yield (r.version, r.status, r.substatus, r.updated_at, r.locked_until, r.error, r.data)


RECORD_HEADERS = ("VERSION", "STATUS", "SUBSTATUS", "UPDATED", "LOCKED UNTIL", "ERROR", "DATA")


def _no_record(key: Key) -> str:
    return f"no record for {key.item_entity_key}/{key.item_key} (tenant {key.tenant_id})"


def cmd_state_get(ctx: Context) -> int:
    key = _key(ctx.args)
    record = ctx.client.operator.lookup(key, page_size=1).record
    if record is None:
        raise ctx.nothing("null", _no_record(key))
    ctx.emit(
        record,
        lambda: out.fields(
            [
                (
                    "key",
                    f"{record.tenant_id}/{record.scope}/{record.entity_id}/{record.item_entity_key}/"
                    f"{record.item_key}",
                ),
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
    versions = []
    for record in ctx.client.operator.history(key):
        versions.append(record)
        if ctx.args.limit and len(versions) >= ctx.args.limit:
            break
    if not versions:
        raise ctx.nothing("[]", _no_record(key))
    ctx.emit(versions, lambda: out.table(RECORD_HEADERS, _record_rows(versions)))
    return OK


def cmd_handoffs(ctx: Context) -> int:
    args = ctx.args
    if args.leased:
        handoff = ctx.client.handoffs.receive(
            args.endpoint, args.event_type, args.wait, lease_seconds=args.lease
        )
    else:
        handoff = ctx.client.handoffs.next(args.endpoint, args.event_type, args.wait)
    if handoff is None:
        raise ctx.nothing("null", f"no parked hand-off on {args.endpoint!r}")
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
                ("payload", handoff.payload),
            ]
        ),
    )
    return OK
