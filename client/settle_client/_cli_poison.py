"""The ``settle poison`` commands: list the poison messages of a day or a range of days, replay or dismiss
them one by one (:mod:`settle_client.cli`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from settle_client import _cli_output as out
from settle_client._calls import Call
from settle_client._cli_context import FAILED, OK, USAGE, Context, DryRun, Failure, confirm, ids_arg
from settle_client.errors import Conflict, InvalidInput, NotFound

MAX_POISON_DAYS = 92


def _today() -> str:
    return datetime.now(UTC).strftime("%Y%m%d")


def _day(text: str, option: str) -> datetime:
    try:
        return datetime.strptime(text.replace("-", ""), "%Y%m%d").replace(tzinfo=UTC)
    except ValueError as error:
        raise Failure(f"{option} must be a UTC day, YYYYMMDD or YYYY-MM-DD (not {text!r})", USAGE) from error


def _days(ctx: Context) -> list[str]:
    a = ctx.args
    if a.day and (a.since or a.until):
        raise Failure("give --day, or --from/--to, not both", USAGE)
    if not (a.since or a.until):
        return [_day(a.day, "--day").strftime("%Y%m%d") if a.day else _today()]
    first = _day(a.since or a.until, "--from")
    last = _day(a.until, "--to") if a.until else datetime.now(UTC)
    if last < first:
        raise Failure("--from must not be after --to", USAGE)
    count = (last.date() - first.date()).days + 1
    if count > MAX_POISON_DAYS:
        raise Failure(f"at most {MAX_POISON_DAYS} days at once", USAGE)
    return [(first + timedelta(days=n)).strftime("%Y%m%d") for n in range(count)]


def cmd_poison_list(ctx: Context) -> int:
    days = _days(ctx)
    every = (
        p
        for day in days
        for p in ctx.client.operator.poison(day)
        if ctx.args.include_done or (p.replayed_at is None and p.dismissed_at is None)
    )
    entries = ctx.take(every, "poison messages")
    span = days[0] if len(days) == 1 else f"{days[0]}-{days[-1]}"
    ctx.emit(
        entries,
        lambda: (
            ctx.table(
                ("DAY", "ID", "ENDPOINT", "MESSAGE", "RECORDED", "REASON", "REPLAYED", "DISMISSED"),
                (
                    (
                        p.day,
                        out.pasteable(p.id),
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
            else f"no poison messages on {span}"
            + ("" if ctx.args.include_done else " waiting (--include-done: replayed and dismissed ones too)")
        ),
    )
    return OK


def _each(
    ctx: Context,
    verb: str,
    ids: list[str],
    one: Callable[[str], Call[Any]],
    failed: Callable[[Any], str | None],
) -> int:
    """Send ``one(id)`` per id (confirmed once), a progress line per id on stderr when there are several. A
    refused id (409, 404, 400) or a result ``failed`` names is reported and the others go on; the exit
    code says so."""
    if not ids:
        raise Failure("no ids given", USAGE)
    if ctx.args.dry_run:
        raise DryRun(*map(one, ids))
    confirm(ctx, f"{verb} {len(ids)} poison message{'s' if len(ids) > 1 else ''} ({', '.join(ids[:3])}…)")
    results: list[Any] = []
    problems: list[str] = []
    for n, item_id in enumerate(ids, 1):
        try:
            result = ctx.client.send(one(item_id))
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
    ctx.emit(results if len(ids) > 1 else results[0], lambda: _poison_results(ctx, verb, results))
    if not problems:
        return OK
    raise Failure(problems[0] if len(problems) == 1 else f"{len(problems)} of {len(ids)} not done", FAILED)


def _poison_results(ctx: Context, verb: str, results: list[Any]) -> str:
    rows = []
    for r in results:
        if isinstance(r, dict):
            rows.append((out.pasteable(r["id"]), "refused", r["error"]))
        elif hasattr(r, "outcome"):
            rows.append((out.pasteable(r.poison.id), r.outcome, r.detail))
        else:
            rows.append((out.pasteable(r.id), verb, r.dismiss_reason))
    return ctx.table(("ID", "OUTCOME", "DETAIL"), rows)


def cmd_poison_replay(ctx: Context) -> int:
    day = ctx.args.day
    return _each(
        ctx,
        "replay",
        ids_arg(ctx.args.ids),
        lambda i: ctx.client.operator.calls.replay(day, i, by=ctx.by),
        # Replayed, but not projected: the message is still poison (the detail says why).
        lambda r: f"poisoned again: {r.detail}" if r.outcome == "poisoned" else None,
    )


def cmd_poison_dismiss(ctx: Context) -> int:
    day, reason = ctx.args.day, ctx.args.reason
    return _each(
        ctx,
        "dismiss",
        ids_arg(ctx.args.ids),
        lambda i: ctx.client.operator.calls.dismiss(day, i, reason, by=ctx.by),
        lambda r: None,
    )
