"""``settle``: Settle from a terminal, on the typed client (what the console does, for people and scripts).

Each command prints a table (``--json``: the API's JSON) and exits 0 when it found or did what was asked;
otherwise it prints one line on stderr and exits with a code a script can branch on (:data:`EXIT_CODES`).
While an answer is slow (:data:`WAIT_NOTICE_S`) it says on stderr that it is waiting, and for whom, so a
person is not left guessing; stdout only ever carries the answer.

azure-identity is an optional extra, so it is imported inside the function that makes a credential.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

from settle_client import _cli_output as out
from settle_client._calls import Call
from settle_client._cli_commands import (
    cmd_action,
    cmd_audits,
    cmd_endpoints,
    cmd_events,
    cmd_failed,
    cmd_find,
    cmd_handoffs,
    cmd_lease,
    cmd_overdue,
    cmd_resolve,
    cmd_settle_leased,
    cmd_show,
    cmd_state_get,
    cmd_state_history,
    cmd_stuck,
    cmd_unconfirmed,
)
from settle_client._cli_completion import completion_script
from settle_client._cli_context import (
    AUTH,
    CONFLICT,
    ENVIRONMENT,
    EXIT_CODES,
    FAILED,
    INVALID,
    NOT_SETTLE,
    NOTHING,
    UNAVAILABLE,
    USAGE,
    Context,
    DryRun,
    Failure,
)
from settle_client._cli_poison import (
    cmd_poison_dismiss,
    cmd_poison_list,
    cmd_poison_replay,
)
from settle_client._version import VERSION
from settle_client.address import default_url
from settle_client.client import SettleClient
from settle_client.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    ServerError,
    SettleError,
    TransportFailure,
    Unauthorized,
    Unavailable,
)

T = TypeVar("T")

# -- the parser ---------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Options every command takes, before or after its name (the top level holds the defaults)."""
    default: Callable[[Any], Any] = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    group = parser.add_argument_group("connection and output")
    group.add_argument(
        "--url", default=default(None), help="the function app (env SETTLE_URL; default what make run serves)"
    )
    group.add_argument(
        "--function-key", default=default(None), help="a function key (env SETTLE_FUNCTION_KEY)"
    )
    group.add_argument(
        "--token-scope",
        default=default(None),
        help="sign in with azure-identity for this scope (env SETTLE_TOKEN_SCOPE)",
    )
    group.add_argument(
        "--by",
        default=default(None),
        help="who acts, for the audit when no one is signed in (env SETTLE_OPERATOR)",
    )
    group.add_argument(
        "--timeout", type=float, default=default(30.0), help="seconds per request (default 30)"
    )
    group.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "jsonl"),
        default=default("table"),
        help="table (people), json (the API's JSON; errors as JSON on stderr) or jsonl (one item a line)",
    )
    group.add_argument(
        "--json",
        action="store_const",
        dest="output",
        const="json",
        default=argparse.SUPPRESS,
        help="--output json",
    )


def _sub(
    subs: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, description: str
) -> argparse.ArgumentParser:
    parser = subs.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser, top=False)
    return parser


def _listing(parser: argparse.ArgumentParser, default: int | None = 50) -> None:
    """``--limit`` / ``--all``: how much of a listing to read (pages are followed as far as needed)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--limit",
        type=_positive,
        default=default,
        help=f"at most N (default {default}); says when more match",
    )
    group.add_argument("--all", action="store_true", help="every one (all pages)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, not {text!r}")
    return int(text)


def _time(text: str) -> datetime:
    """A time as the API takes it (``2026-12-05T17:08:24.702Z``, or a UTC day ``2026-12-05``)."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"a UTC time like 2026-12-05T17:08:24Z, not {text!r}") from error
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _acting(parser: argparse.ArgumentParser) -> None:
    """``--yes`` / ``--dry-run``: every command that changes something asks first on a terminal."""
    group = parser.add_argument_group("confirmation")
    group.add_argument(
        "-y", "--yes", action="store_true", help="act without asking (needed without a terminal)"
    )
    group.add_argument(
        "--dry-run", action="store_true", help="print the request that would be sent, send nothing"
    )


def _event_args(parser: argparse.ArgumentParser, *, many: bool = False) -> None:
    parser.add_argument("endpoint", metavar="endpointId", help="the NimBus endpoint")
    if many:
        parser.add_argument(
            "event_ids",
            metavar="eventId",
            nargs="+",
            help="one or more event ids; '-' reads them from stdin, one a line (more than one: the bulk "
            "route, 50 a call, with progress on stderr)",
        )
    else:
        parser.add_argument("event_id", metavar="eventId", help="the event")


def _action(
    subs: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str,
    *,
    many: bool = False,
) -> argparse.ArgumentParser:
    """The command of an operator action on an event (``many``: on one or many), run by ``cmd_action``."""
    parser = _sub(subs, name, help, description)
    _event_args(parser, many=many)
    _acting(parser)
    parser.set_defaults(run=cmd_action, action=name)
    return parser


def _poison_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("day", help="YYYYMMDD")
    parser.add_argument("ids", metavar="id", nargs="+", help="poison ids ('-': from stdin, one a line)")


def _key_args(parser: argparse.ArgumentParser) -> None:
    key = parser.add_argument_group("the record's key (or --key with its JSON)")
    key.add_argument("--key", help='the whole key as JSON: \'{"tenantId":1,"scopeId":4,...}\'')
    key.add_argument("--tenant", type=int, help="tenantId")
    key.add_argument("--scope", help="scopeId (1-7) or the scope's name (Entity, Node, ...)")
    key.add_argument("--entity", type=int, help="entityId")
    key.add_argument("--item-entity-key", help="itemEntityKey")
    key.add_argument("--item-key", help="itemKey")
    key.add_argument("--sub-item-entity-key", help="subItemEntityKey")
    key.add_argument("--sub-item-key", help="subItemKey")
    key.add_argument("--execution", type=int, help="entityExecutionId (part of the key for execution scopes)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="settle",
        description="Settle from a terminal: find any hand-off by any id, act on it as the console does, "
        "replay poison, read state records, take parked hand-offs. Tables for people, --json for scripts.",
        epilog=f"{ENVIRONMENT}\n\n{EXIT_CODES}\n\n'settle <command> --help' describes each command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"settle {VERSION} (settle-client)")
    _common(top, top=True)
    subs = top.add_subparsers(dest="command", metavar="<command>", required=True)

    find = _sub(
        subs,
        "find",
        "find hand-offs at every endpoint by any id",
        "Every hand-off, at any endpoint, matching the id: an event id or its first characters (any case), "
        "a session id, a message id or an external job id. Says what matched.",
    )
    find.add_argument("id", help="the id (at least 3 characters of an event id)")
    _listing(find)
    find.set_defaults(run=cmd_find)

    show = _sub(
        subs,
        "show",
        "one event: status, history, audits, what it allows now",
        "One event with its history, audits, the actions it allows now and its settlement claim.",
    )
    _event_args(show)
    show.set_defaults(run=cmd_show)

    for name, what in (("resubmit", "resubmit (send its EventJson again)"), ("skip", "skip")):
        action = _action(
            subs,
            name,
            f"{what} one or many events",
            f"{what.capitalize()} events, addressed to the message read just before (so a repeat is "
            "answered from its claim and an event that moved on is refused). One audited control message "
            "each.",
            many=True,
        )
        action.add_argument("--reason", help="why (kept in the audit)")
        if name == "resubmit":
            action.add_argument(
                "--event-json",
                metavar="FILE",
                help="resubmit with changes: the edited EventJson ('-': stdin)",
            )

    complete = _action(
        subs,
        "complete",
        "complete an event's parked hand-off as an operator",
        "Complete the event's parked hand-off (one HandoffCompletedRequest, audited).",
    )
    complete.add_argument("--result", help="the result as JSON (checked before anything is sent)")

    fail = _action(
        subs,
        "fail",
        "fail an event's parked hand-off as an operator",
        "Fail the event's parked hand-off (one HandoffFailedRequest, audited).",
    )
    fail.add_argument("--error", required=True, help="the error text")
    fail.add_argument("--error-type", help="the error type")

    resolve = _sub(
        subs,
        "resolve",
        "resolve an unconfirmed settlement (delivered or released)",
        "Resolve a settlement Settle could neither confirm nor safely re-send. --delivered: you checked "
        "the endpoint got it; --released: it did not, the hand-off can be settled again.",
    )
    _event_args(resolve)
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--delivered",
        action="store_const",
        dest="resolution",
        const="delivered",
        help="the endpoint got the control message (you checked): the settlement stands",
    )
    how.add_argument(
        "--released",
        action="store_const",
        dest="resolution",
        const="released",
        help="it never arrived: release the claim, so the hand-off can be settled again",
    )
    resolve.add_argument("--reason", required=True, help="why (kept in the audit)")
    resolve.add_argument("--message", help="the message the settlement addressed (default: its claim's)")
    resolve.add_argument("--control-message", help="the control message you checked (refused if another)")
    _acting(resolve)
    resolve.set_defaults(run=cmd_resolve)

    poison = _sub(
        subs, "poison", "list, replay or dismiss poison messages", "Resolver messages stored as poison."
    )
    poison_subs = poison.add_subparsers(dest="poison_command", metavar="<list|replay|dismiss>", required=True)
    listing = _sub(
        poison_subs,
        "list",
        "poison messages of a UTC day or a range of days",
        "Poison messages of one UTC day (--day) or of every day from --from to --to (both included). Ids "
        "a shell would misread (they hold '|') are printed quoted, ready to paste.",
    )
    listing.add_argument("--day", help="YYYYMMDD (default: today, UTC)")
    listing.add_argument("--from", dest="since", metavar="DAY", help="first UTC day, YYYYMMDD or YYYY-MM-DD")
    listing.add_argument("--to", dest="until", metavar="DAY", help="last UTC day (default: today)")
    listing.add_argument("--include-done", action="store_true", help="include replayed and dismissed ones")
    _listing(listing, 200)
    listing.set_defaults(run=cmd_poison_list)
    replay = _sub(
        poison_subs,
        "replay",
        "replay poison messages through the resolver",
        "Replay poison messages through the resolver (each once: a second replay is refused).",
    )
    _poison_args(replay)
    _acting(replay)
    replay.set_defaults(run=cmd_poison_replay)
    dismiss = _sub(
        poison_subs,
        "dismiss",
        "archive poison messages no fix will project",
        "Dismiss poison messages with the reason no fix will ever project them (audited).",
    )
    _poison_args(dismiss)
    dismiss.add_argument("--reason", required=True, help="why (kept on the row and in the audit)")
    _acting(dismiss)
    dismiss.set_defaults(run=cmd_poison_dismiss)

    state = _sub(subs, "state", "read a state record or its history", "Idempotent node state records.")
    state_subs = state.add_subparsers(dest="state_command", metavar="<get|history>", required=True)
    get = _sub(state_subs, "get", "a record by its key", "The current record of a key.")
    _key_args(get)
    get.set_defaults(run=cmd_state_get)
    history = _sub(
        state_subs, "history", "every version of a record", "Every version of a record, newest first."
    )
    _key_args(history)
    _listing(history, None)
    history.set_defaults(run=cmd_state_history)

    handoffs = _sub(subs, "handoffs", "parked hand-offs of an endpoint", "Parked hand-offs of an endpoint.")
    handoff_subs = handoffs.add_subparsers(
        dest="handoffs_command", metavar="<next|receive|renew|release|complete|fail>", required=True
    )
    nxt = _sub(
        handoff_subs,
        "next",
        "the oldest parked hand-off (not claimed)",
        "The oldest parked hand-off of the endpoint, without claiming it.",
    )
    receive = _sub(
        handoff_subs,
        "receive",
        "lease the oldest parked hand-off no one holds",
        "Lease the oldest parked hand-off no one holds; then renew, release, complete or fail it with its "
        "lease token before the lease ends (settle handoffs renew|release|complete|fail).",
    )
    for sub in (nxt, receive):
        sub.add_argument("endpoint", metavar="endpointId", help="the NimBus endpoint")
        sub.add_argument("--event-type", action="append", help="only this event type (repeatable)")
        sub.add_argument("--wait", type=float, default=0.0, help="seconds to wait for one (at most 20)")
    receive.add_argument("--lease", type=float, help="lease seconds (10-3600, server default 300)")
    receive.add_argument(
        "--agent", help="the agent id the lease is held by (x-agent-id; env SETTLE_AGENT_ID)"
    )
    nxt.set_defaults(run=cmd_handoffs, leased=False)
    receive.set_defaults(run=cmd_handoffs, leased=True)
    for name, what in (("renew", "extend a lease"), ("release", "give a leased hand-off back at once")):
        lease = _sub(handoff_subs, name, what, f"{what.capitalize()} (the token from handoffs receive).")
        _event_args(lease)
        lease.add_argument("--lease-token", required=True, help="the lease token receive answered")
        if name == "renew":
            lease.add_argument(
                "--lease", type=float, help="lease seconds from now (default: the lease's own)"
            )
        _acting(lease)
        lease.set_defaults(run=cmd_lease, lease_command=name)
    for name, what in (("complete", "complete"), ("fail", "fail")):
        settle = _sub(
            handoff_subs,
            name,
            f"{what} a leased hand-off with its lease token",
            f"{what.capitalize()} a hand-off you leased; fenced by the lease: refused (409 lease-lost) once "
            "it ran out and another agent leased it.",
        )
        _event_args(settle)
        settle.add_argument("--lease-token", required=True, help="the lease token receive answered")
        if name == "complete":
            settle.add_argument("--result", help="the result as JSON (checked before anything is sent)")
        else:
            settle.add_argument("--error", required=True, help="the error text")
            settle.add_argument("--error-type", help="the error type")
        _acting(settle)
        settle.set_defaults(run=cmd_settle_leased, settle_command=name)

    endpoints = _sub(
        subs,
        "endpoints",
        "every endpoint with its counts (the console's overview)",
        "Every endpoint with its counts by status, poison, unconfirmed settlements, overdue hand-offs "
        "and the oldest pending and failed.",
    )
    endpoints.set_defaults(run=cmd_endpoints)
    events = _sub(
        subs,
        "events",
        "an endpoint's events by status, type and time",
        "An endpoint's events, newest change first.",
    )
    events.add_argument("endpoint", metavar="endpointId", help="the NimBus endpoint")
    events.add_argument(
        "--status",
        help="Pending, PendingHandoff, Deferred, Failed, DeadLettered, Unsupported, Completed, Skipped, ...",
    )
    events.add_argument("--event-type", action="append", help="only this event type (repeatable)")
    events.add_argument("--from", dest="since", type=_time, help="changed at or after (UTC)")
    events.add_argument("--to", dest="until", type=_time, help="changed at or before (UTC)")
    _listing(events)
    events.set_defaults(run=cmd_events)
    failed = _sub(
        subs, "failed", "failed and dead-lettered events of every endpoint", "Failed events, newest first."
    )
    _listing(failed)
    failed.set_defaults(run=cmd_failed)
    audits = _sub(
        subs,
        "audits",
        "operator audits by endpoint, type, operator and time",
        "Operator audits, oldest first (default: the last 24 hours; a window of at most 31 days).",
    )
    audits.add_argument("--from", dest="since", type=_time, help="from (UTC)")
    audits.add_argument("--to", dest="until", type=_time, help="to (UTC)")
    audits.add_argument("--endpoint", help="one endpoint")
    audits.add_argument("--type", help="one audit type (Resubmit, Skip, ResolveSettlement, ...)")
    audits.add_argument("--operator", help="who acted")
    _listing(audits)
    audits.set_defaults(run=cmd_audits)
    stuck = _sub(
        subs, "stuck", "state records stuck in Processing past their lock", "Records stuck in Processing."
    )
    _listing(stuck)
    stuck.set_defaults(run=cmd_stuck)
    for name, what, run in (
        ("unconfirmed", "settlements Settle could not confirm (resolve each)", cmd_unconfirmed),
        ("overdue", "parked hand-offs past their ExpectedBy", cmd_overdue),
    ):
        sub = _sub(subs, name, what, f"An endpoint's {what}.")
        sub.add_argument("endpoint", metavar="endpointId", help="the NimBus endpoint")
        _listing(sub)
        sub.set_defaults(run=run)

    completion = subs.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a completion script; in your shell rc: eval "$(settle completion bash)" (or zsh).',
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(run=None)
    return top


def _credential(scope: str | None) -> Any:
    if not scope:
        return None
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise Failure(
            "--token-scope needs azure-identity: pip install azure-identity (or pass --function-key).", USAGE
        ) from exc
    return DefaultAzureCredential()


# After this long without an answer the command says on stderr that it is waiting, then every
# WAIT_REPEAT_S (a call's retries included: Settle answers a storage that does not answer 503 within 20 s).
WAIT_NOTICE_S = 2.0
WAIT_REPEAT_S = 10.0


class PatientClient(SettleClient):
    """The command's client: while a call waits for its answer it says so on ``notices`` (stderr)."""

    notices: TextIO = sys.stderr

    def send(self, call: Call[T]) -> T:
        answered = threading.Event()
        watch = threading.Thread(target=self._wait_notices, args=(answered,), daemon=True)
        watch.start()
        try:
            return super().send(call)
        finally:
            answered.set()
            watch.join()

    def _wait_notices(self, answered: threading.Event) -> None:
        started = time.monotonic()
        if answered.wait(WAIT_NOTICE_S):
            return
        print(f"settle: waiting for Settle at {self.base_url}...", file=self.notices, flush=True)
        while not answered.wait(WAIT_REPEAT_S):
            waited = time.monotonic() - started
            print(
                f"settle: still waiting for Settle at {self.base_url} ({waited:.0f} s)...",
                file=self.notices,
                flush=True,
            )


def _client(args: argparse.Namespace, notices: TextIO) -> SettleClient:
    url = args.url or default_url()
    key = args.function_key or os.environ.get("SETTLE_FUNCTION_KEY") or None
    scope = args.token_scope or os.environ.get("SETTLE_TOKEN_SCOPE") or None
    try:
        client = PatientClient(
            url,
            function_key=key,
            credential=_credential(scope),
            token_scope=scope,
            timeout=args.timeout,
            handle_sigterm=False,
            agent_id=getattr(args, "agent", None) or os.environ.get("SETTLE_AGENT_ID") or None,
        )
    except ValueError as exc:
        raise Failure(f"{exc}", USAGE) from exc
    client.notices = notices
    return client


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """The ``settle`` console script; returns the exit code (see :data:`EXIT_CODES`)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    args = parser().parse_args(argv)
    try:
        if args.run is None:  # settle completion bash|zsh
            print(completion_script(parser(), args.shell), file=stdout)
            return 0
        with _client(args, stderr) as client:
            code: int = args.run(Context(args, client, stdout, stderr))
        stdout.flush()
        return code
    except BrokenPipeError:
        return _reader_left()
    except DryRun as dry:
        print(
            out.as_json([_request(c) for c in dry.calls] if len(dry.calls) > 1 else _request(dry.calls[0])),
            file=stdout,
        )
        return 0
    except Failure as failure:
        return _fail(args, stderr, str(failure), failure.code)
    except SettleError as error:
        message, code = explain(error)
        return _fail(args, stderr, message, code, error)
    except (ValueError, OSError) as error:  # refused before sending: an empty id, an unreadable file
        return _fail(args, stderr, str(error), USAGE)
    except KeyboardInterrupt:
        return _fail(args, stderr, "interrupted", 130)


def _reader_left() -> int:
    """``settle ... | head``: the reader left. Quietly, as a program killed by SIGPIPE would (and Python
    must not complain when it flushes stdout at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


def _fail(args: argparse.Namespace, stderr: TextIO, message: str, code: int, error: Any = None) -> int:
    """One line on stderr (a JSON object under ``--output json|jsonl``) and the exit code."""
    if getattr(args, "output", "table") == "table":
        text = "settle: " + " ".join(message.split())
    else:
        problem = {"message": " ".join(message.split()), "exitCode": code}
        if isinstance(error, SettleError):
            problem.update({k: v for k, v in (("status", error.status), ("type", error.type)) if v})
        text = json.dumps({"error": problem}, ensure_ascii=False)
    try:
        print(text, file=stderr)
    except BrokenPipeError:
        return _reader_left()
    return code


def _request(call: Any) -> dict[str, Any]:
    """What ``--dry-run`` prints of a call: method, route, query and body."""
    return {"method": call.method, "path": call.path, "query": dict(call.params), "body": call.body}


AUTH_HINT = (
    "pass --function-key (or SETTLE_FUNCTION_KEY), or --token-scope api://<app-client-id>/.default "
    "(or SETTLE_TOKEN_SCOPE) to sign in as an operator with the app role Settle.Operator"
)


def explain(error: SettleError) -> tuple[str, int]:
    """The one line and exit code of an error the client raised."""
    text = " ".join(str(error).split())
    if isinstance(error, Unauthorized):
        refused = "refused the credential" if error.status == 403 else "wants a credential"
        return f"Settle {refused} ({error.status}): {AUTH_HINT}.", AUTH
    if isinstance(error, Conflict):
        return text, CONFLICT
    if isinstance(error, InvalidInput):
        return text, INVALID
    if isinstance(error, NotFound):
        if error.type:  # one of Settle's own problems: the id is unknown
            return f"not found: {text}", NOTHING
        # Not one of Settle's problems: a wrong --url or route prefix, rather than an unknown id.
        return f"{text}: is --url a Settle function app?", NOT_SETTLE
    if isinstance(error, TransportFailure) and not error.maybe_applied:
        return f"{text}: is Settle running at --url (SETTLE_URL)?", NOT_SETTLE
    if isinstance(error, Unavailable | TransportFailure):
        return text, UNAVAILABLE
    if isinstance(error, ServerError) and "cannot read" in text:
        return f"{text}: is --url a Settle function app?", NOT_SETTLE
    return text, FAILED


if __name__ == "__main__":
    sys.exit(main())
