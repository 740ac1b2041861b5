"""What a ``settle`` command gets and how it ends (:mod:`settle_client._cli_commands` holds the commands):
the :class:`Context` (the client, the arguments, where and how to print, confirming an action), the exit
codes, and :class:`Failure`, one line and a code.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, TextIO, TypeVar

from settle_client import _cli_output as out
from settle_client._calls import Call, Page, Pages
from settle_client._core import read_pages
from settle_client.client import SettleClient

T = TypeVar("T")

# Exit codes (argparse itself exits 2 on a usage error).
OK, NOTHING, USAGE, INVALID, AUTH, CONFLICT, UNAVAILABLE, FAILED, NOT_SETTLE = 0, 1, 2, 3, 4, 5, 6, 7, 8
EXIT_CODES = f"""exit codes:
  {OK}  found / done (a closed pipe, as `| head` closes it, too: quietly)
  {NOTHING}  not found (unknown id, event, record, no parked hand-off): "settle: not found: ..."
  {USAGE}  wrong usage (the command line, bad JSON, an action not confirmed)
  {INVALID}  Settle refused the input (400: the message names the field)
  {AUTH}  401/403: no or a refused credential (the message says what to pass)
  {CONFLICT}  409: the state does not allow it (the message says what the state is)
  {UNAVAILABLE}  Settle unavailable or unreachable (503/429 after retries, no answer)
  {FAILED}  some items of a bulk command were refused (each is listed), or another error
  {NOT_SETTLE}  no Settle at --url: nothing listens there, or what answers is not a Settle function app"""

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
    """What a command gets: the client, the parsed arguments, where to print and how."""

    def __init__(
        self, args: argparse.Namespace, client: SettleClient, stdout: TextIO, stderr: TextIO
    ) -> None:
        self.args = args
        self.client = client
        self.stdout = stdout
        self.stderr = stderr
        self.by: str = args.by or os.environ.get("SETTLE_OPERATOR") or _user()
        self.output: str = args.output
        # A table fits the terminal it is shown in; in a pipe nothing is cut.
        self.width = shutil.get_terminal_size().columns if _isatty(stdout) else None

    def print(self, text: str) -> None:
        if text:
            print(text, file=self.stdout)

    def emit(self, value: Any, human: Callable[[], str]) -> None:
        if self.output == "json":
            self.print(out.as_json(value))
        elif self.output == "jsonl":
            self.print(out.as_jsonl(value))
        else:
            self.print(human())

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
        return out.table(headers, rows, width=self.width)

    def listing(
        self, items: Sequence[Any], headers: Sequence[str], rows: Iterable[Sequence[Any]], empty: str
    ) -> int:
        """A listing's ``items`` as JSON, or as a table of ``rows`` (``empty`` when there are none)."""
        self.emit(items, lambda: self.table(headers, rows) if items else empty)
        return OK

    def progress(self, text: str) -> None:
        print(text, file=self.stderr, flush=True)

    def take(self, items: Iterable[T] | Pages[T], what: str) -> list[T]:
        """The items ``--limit`` / ``--all`` ask for (pages read only as far as needed); says on stderr
        when more remain, so a list is complete or says it is not, and of how many where the listing's
        answer counts them ("of 1234", "of at least 1000")."""
        first: list[Page[T]] = []
        if isinstance(items, Pages):
            items = read_pages(self.client, items, lambda page: first.append(page) if not first else None)
        limit = None if self.args.all else self.args.limit
        taken = list(islice(items, None if limit is None else limit + 1))
        if limit is not None and len(taken) > limit:
            total = first[0] if first and first[0].count is not None else None
            of = f" of {'at least ' if total.at_least else ''}{total.count}" if total else ""
            self.progress(f"settle: showing the first {limit}{of} {what}; more match (--all, or --limit N)")
            return taken[:limit]
        return taken

    def page_size(self, maximum: int) -> int:
        """The page size that reads ``--limit`` items and whether more match in one page (``--all``: the
        largest page the server gives, so the fewest requests)."""
        limit = None if self.args.all else self.args.limit
        return maximum if limit is None else min(limit + 1, maximum)

    def act(self, call: Call[T], summary: str) -> T:
        """Send an action's ``call`` once it is confirmed; ``--dry-run``: print what would be sent."""
        if self.args.dry_run:
            raise DryRun(call)
        confirm(self, summary)
        return self.client.send(call)


class DryRun(Exception):
    """``--dry-run``: the call that would have been sent (printed, exit 0)."""

    def __init__(self, *calls: Call[Any]) -> None:
        super().__init__("dry run")
        self.calls = calls


def confirm(ctx: Context, summary: str) -> None:
    """Ask on a terminal before acting (``--yes`` skips it); without a terminal, refuse unless ``--yes``."""
    if ctx.args.yes:
        return
    if not (_isatty(sys.stdin) and _isatty(ctx.stderr)):
        raise Failure(
            f"not confirmed: {summary}; pass --yes to act without a terminal (or --dry-run to see it)", USAGE
        )
    print(f"{summary}? [y/N] ", end="", file=ctx.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise Failure("not confirmed: nothing was sent", USAGE)


def not_found(what: str) -> Failure:
    """The one "not found" of every command: one line, exit code NOTHING, nothing on stdout."""
    return Failure(f"not found: {what}", NOTHING)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in a container: the audit still says it came from here
        return "settle-cli"


def ids_arg(values: Iterable[str]) -> list[str]:
    """The ids a command was given, each once, in order ('-': one a line from stdin; quoted ones as
    the tables print them are unquoted)."""
    ids: list[str] = []
    for value in values:
        if value == "-":
            ids += [out.unquoted(line.strip()) for line in sys.stdin if line.strip()]
        else:
            ids.append(out.unquoted(value))
    return list(dict.fromkeys(ids))
