"""The ``settle`` command, as an operator in a terminal and a script use it: the installed console script,
run as its own process against the development host (real HTTP, test Azurite).

Each command prints a table (``--json``: JSON a script parses) and exits 0 when it found or did what it was
asked; otherwise exactly one line on stderr and the exit code of its kind (``settle --help`` lists them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.conftest import WAIT_S, park
from tests.conftest import new_prefix
from tests.support.children import HostProcess

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test

SETTLE = Path(sys.executable).parent / "settle"
COMMANDS = ("find", "show", "resubmit", "skip", "complete", "fail", "resolve", "poison", "state", "handoffs")
LEAVES = (
    ("find",),
    ("show",),
    ("resubmit",),
    ("skip",),
    ("complete",),
    ("fail",),
    ("resolve",),
    ("poison", "list"),
    ("poison", "replay"),
    ("poison", "dismiss"),
    ("state", "get"),
    ("state", "history"),
    ("handoffs", "next"),
    ("handoffs", "receive"),
    ("handoffs", "renew"),
    ("handoffs", "release"),
    ("handoffs", "complete"),
    ("handoffs", "fail"),
    ("endpoints",),
    ("events",),
    ("failed",),
    ("audits",),
    ("stuck",),
    ("unconfirmed",),
    ("overdue",),
)
# The exit codes of settle_client._cli_commands.
OK, NOTHING, USAGE, INVALID, AUTH, CONFLICT, UNAVAILABLE, FAILED, NOT_SETTLE = 0, 1, 2, 3, 4, 5, 6, 7, 8


def settle(
    host: HostProcess | str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``settle`` against ``host`` (its URL from SETTLE_URL, as a user sets it)."""
    assert SETTLE.exists(), f"{SETTLE} is missing: `make install` (pip install -e ./client) installs it"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    environ.update(
        SETTLE_URL=host if isinstance(host, str) else host.base_url, SETTLE_OPERATOR="cli-test", **(env or {})
    )
    return subprocess.run(
        [str(SETTLE), *args], input=stdin, capture_output=True, text=True, env=environ, timeout=WAIT_S * 2
    )


_WAITING = re.compile(r"settle: (still )?waiting for Settle at ")


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a command that did not find or do what it was asked (after any notices
    that it was waiting: an unreachable Settle is retried for seconds)."""
    lines = [line for line in result.stderr.strip().splitlines() if not _WAITING.match(line)]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("settle: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def prefix() -> str:
    return new_prefix()


@pytest.fixture(scope="module")
def host(start_host: Callable[..., HostProcess], prefix: str) -> HostProcess:
    # The host's table prefix is known, so a test can put the host's tables into a state only a failure makes.
    return start_host(env={"SETTLE_TABLE_PREFIX": prefix})


def endpoint() -> str:
    return f"Cli{uuid.uuid4().hex[:8]}"


def resolver(host: HostProcess, message: dict[str, Any]) -> None:
    answer = httpx.post(f"{host.base_url}/admin/functions/resolver", json=message, timeout=WAIT_S)
    assert answer.status_code == 202, answer.text


def failed_event(host: HostProcess, endpoint_id: str) -> str:
    """An event whose endpoint answered ErrorResponse (Failed: resubmit and skip allowed)."""
    run = uuid.uuid4().hex[:10]
    event_id = f"evt-{run}"
    common = {
        "EventId": event_id,
        "EventTypeId": "InvoiceCreated",
        "RetryCount": 0,
        "OriginatingFrom": "self",
    }
    content = {"EventTypeId": "InvoiceCreated", "EventJson": json.dumps({"run": run})}
    resolver(
        host,
        {
            "messageId": f"req-{run}",
            "sessionId": f"session-{run}",
            "correlationId": f"corr-{run}",
            "applicationProperties": {
                **common,
                "MessageType": "EventRequest",
                "To": endpoint_id,
                "From": "Erp",
                "OriginatingMessageId": "self",
                "ParentMessageId": "self",
            },
            "body": {"EventContent": content},
        },
    )
    resolver(
        host,
        {
            "messageId": f"err-{run}",
            "sessionId": f"session-{run}",
            "correlationId": f"req-{run}",
            "applicationProperties": {
                **common,
                "MessageType": "ErrorResponse",
                "To": "Resolver",
                "From": endpoint_id,
                "OriginatingMessageId": f"req-{run}",
                "ParentMessageId": f"req-{run}",
            },
            "body": {
                "EventContent": content,
                "ErrorContent": {"ErrorText": "ERP timeout", "ErrorType": "Timeout"},
            },
        },
    )
    return event_id


# -- help ------------------------------------------------------------------------------------------


def test_settle_help_names_every_command_and_how_to_connect() -> None:
    result = settle("http://127.0.0.1:9", "--help")
    assert result.returncode == 0, result.stderr
    for command in COMMANDS:
        assert f"\n    {command} " in result.stdout, command
    for text in ("SETTLE_URL", "SETTLE_FUNCTION_KEY", "SETTLE_TOKEN_SCOPE", "--json", "exit codes:", "409"):
        assert text in result.stdout, text


@pytest.mark.parametrize("command", LEAVES, ids=" ".join)
def test_each_command_has_complete_help(command: tuple[str, ...]) -> None:
    result = settle("http://127.0.0.1:9", *command, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"usage: settle {' '.join(command)}" in text
    assert "exit codes:" in text and "--json" in text and "--url" in text
    undocumented = [a.dest for a in _leaf(command)._actions if not a.help]
    assert undocumented == [], undocumented  # argparse prints a bare name for these


def _leaf(command: tuple[str, ...]) -> argparse.ArgumentParser:
    from settle_client.cli import parser

    found = parser()
    for name in command:
        [subs] = [a for a in found._actions if isinstance(a, argparse._SubParsersAction)]
        found = subs.choices[name]
    return found


# -- events ----------------------------------------------------------------------------------------


def test_show_prints_the_event_for_people_and_its_json_for_scripts(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)

    shown = settle(host, "show", where, event_id)
    assert shown.returncode == OK, shown.stderr
    assert "Pending/Handoff" in shown.stdout and "complete, fail" in shown.stdout
    assert "PendingHandoffResponse" in shown.stdout  # the history table

    as_json = settle(host, "show", where, event_id, "--json")
    data = json.loads(as_json.stdout)
    assert data["eventId"] == event_id and data["resolutionStatus"] == "Pending"
    assert "complete" in data["actions"]


def test_an_unknown_event_is_one_line_and_exit_1(host: HostProcess) -> None:
    result = settle(host, "show", endpoint(), "evt-never")
    assert result.returncode == NOTHING
    assert "not found: event 'evt-never'" in one_line(result)
    assert result.stdout == ""


def test_complete_is_done_once_and_a_second_is_refused_saying_what_the_state_is(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)

    done = settle(host, "complete", where, event_id, "--result", '{"posted": true}', "--json", "--yes")
    assert done.returncode == OK, done.stderr
    accepted = json.loads(done.stdout)
    assert accepted["messageType"] == "HandoffCompletedRequest" and accepted["by"] == "cli-test"
    assert accepted["addressedMessageId"].startswith("handoff-")  # addressed to the message it read

    again = settle(host, "complete", where, event_id, "--yes")
    assert again.returncode == CONFLICT
    line = one_line(again)
    assert "409" in line and "the event is Pending" in line and "allowed now: nothing" in line


def test_skip_of_many_events_goes_in_bulk_with_progress_and_says_which_were_refused(
    host: HostProcess,
) -> None:
    where = endpoint()
    failed = [failed_event(host, where) for _ in range(3)]
    unknown = "evt-never"

    result = settle(
        host, "skip", where, "-", "--reason", "duplicates", "--yes", stdin="\n".join([*failed, unknown])
    )
    assert result.returncode == FAILED, result.stderr
    assert "skip: 4/4 (3 accepted, 1 refused)" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("settle: skip evt-never: 404 not-found")
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert all("accepted" in rows[e] for e in failed)
    assert "404" in rows[unknown] and "not-found" in rows[unknown]


def test_resubmit_of_one_failed_event_is_done(host: HostProcess) -> None:
    where = endpoint()
    event_id = failed_event(host, where)

    result = settle(host, "resubmit", where, event_id, "--reason", "ERP is back", "--yes")
    assert result.returncode == OK, result.stderr
    assert result.stdout.startswith("resubmit: ResubmissionRequest")


# -- resolve an unconfirmed settlement -------------------------------------------------------------


def unconfirmed_settlement(prefix: str, endpoint_id: str, event_id: str) -> None:
    """Make the parked hand-off's settlement unconfirmed, as it happens: a send whose outcome is unknown
    on topics without duplicate detection, the reconciler past its wait (this process, the host's tables)."""
    from common import runtime
    from handoff import service
    from handoff.messages.contract import Coordinates, MessageType
    from handoff.settlement.settler import Settlement
    from tests.handoff.broker import Broker, BrokerTransport

    saved = os.environ.get("SETTLE_TABLE_PREFIX")
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    runtime.reset()
    try:
        service.use_transport(BrokerTransport(Broker(window=None)).then(["lost-before"]))
        settlement = service.settlement_service()
        settlement.settle(
            Settlement(
                kind=MessageType.HandoffCompletedRequest,
                endpoint_id=endpoint_id,
                coordinates=Coordinates(
                    event_id=event_id, message_id=f"handoff-{event_id.removeprefix('evt-')}"
                ),
                settled_by="erp-agent",
            )
        )
        settlement.clock = lambda: datetime.now(UTC) + timedelta(minutes=3)
        service.reconciler().run()
    finally:
        if saved is not None:
            os.environ["SETTLE_TABLE_PREFIX"] = saved
        runtime.reset()


def test_resolve_releases_an_unconfirmed_settlement_once(host: HostProcess, prefix: str) -> None:
    where = endpoint()
    event_id = park(host, where)
    unconfirmed_settlement(prefix, where, event_id)

    released = settle(
        host, "resolve", where, event_id, "--released", "--reason", "checked: never arrived", "--yes"
    )
    assert released.returncode == OK, released.stderr
    assert released.stdout.startswith("settlement released")

    # Resolved: nothing is unconfirmed any more, and a script repeating the resolution of the message it
    # names is answered from the earlier one.
    again = settle(
        host, "resolve", where, event_id, "--released", "--reason", "checked: never arrived", "--yes"
    )
    assert again.returncode == NOTHING
    assert "(it is Pending/Handoff)" in one_line(again)
    message = json.loads(settle(host, "show", where, event_id, "--json").stdout)["lastMessageId"]
    repeat = settle(
        host,
        "resolve",
        where,
        event_id,
        "--released",
        "--reason",
        "again",
        "--message",
        message,
        "--json",
        "--yes",
    )
    assert repeat.returncode == OK, repeat.stderr
    assert json.loads(repeat.stdout)["replayed"] is True


def test_resolve_without_an_unconfirmed_settlement_says_so(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)
    result = settle(host, "resolve", where, event_id, "--delivered", "--reason", "looked", "--yes")
    assert result.returncode == NOTHING
    assert "(it is Pending/Handoff)" in one_line(result)


# -- poison ----------------------------------------------------------------------------------------


def test_poison_is_listed_replayed_and_dismissed_once(host: HostProcess) -> None:
    message_id = f"bad-{uuid.uuid4().hex[:8]}"
    resolver(
        host,
        {
            "messageId": message_id,
            "applicationProperties": {
                "MessageType": "Nonsense",
                "To": "Resolver",
                "From": "Erp",
                "EventId": "e",
            },
            "body": {"x": 1},
        },
    )
    listed = settle(host, "poison", "list", "--json")
    assert listed.returncode == OK, listed.stderr
    [entry] = [p for p in json.loads(listed.stdout) if p["messageId"] == message_id]
    day, poison_id = entry["day"], entry["id"]

    replayed = settle(host, "poison", "replay", day, poison_id, "--yes")
    assert replayed.returncode == FAILED  # replayed, but still not projectable
    assert "poisoned again: Unknown MessageType 'Nonsense'" in one_line(replayed)
    assert "poisoned" in replayed.stdout

    dismissed = settle(host, "poison", "dismiss", day, poison_id, "--reason", "a test message", "--yes")
    assert dismissed.returncode == OK, dismissed.stderr
    again = settle(host, "poison", "dismiss", day, poison_id, "--reason", "a test message", "--yes")
    assert again.returncode == CONFLICT
    assert "was dismissed at" in one_line(again)
    # the instant as the API writes instants, never Python's "2026-12-05 17:09:56.455031+00:00"
    assert re.search(r"dismissed at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z by", one_line(again)), one_line(
        again
    )

    waiting = settle(host, "poison", "list", "--day", day)
    assert poison_id not in waiting.stdout  # dismissed: not waiting any more
    assert poison_id in settle(host, "poison", "list", "--day", day, "--include-done").stdout


# -- state records ---------------------------------------------------------------------------------


def test_state_get_and_history_of_a_record_by_its_key_fields(host: HostProcess) -> None:
    from settle_client import SettleClient

    item = f"INV-{uuid.uuid4().hex[:8]}"
    key = {"tenantId": 1, "scopeId": 4, "entityId": 100, "itemEntityKey": "invoice", "itemKey": item}
    with SettleClient(host.base_url, handle_sigterm=False) as client, client.processing(key) as work:
        work.data = {"posted": True}
    fields = ["--tenant", "1", "--scope", "Element", "--entity", "100", "--item-entity-key", "invoice"]

    got = settle(host, "state", "get", *fields, "--item-key", item)
    assert got.returncode == OK, got.stderr
    assert "Processed" in got.stdout and '{"posted":true}' in got.stdout

    history = settle(host, "state", "history", "--key", json.dumps(key), "--json")
    assert [v["status"] for v in json.loads(history.stdout)] == ["Processed", "Superseded"]

    missing = settle(host, "state", "get", *fields, "--item-key", "INV-never")
    assert missing.returncode == NOTHING
    assert "not found: a record for invoice/INV-never" in one_line(missing)


# -- hand-offs -------------------------------------------------------------------------------------


def test_handoffs_next_reads_and_receive_leases_the_oldest(host: HostProcess) -> None:
    where = endpoint()
    empty = settle(host, "handoffs", "next", where)
    assert empty.returncode == NOTHING and "not found: a parked hand-off" in one_line(empty)

    event_id = park(host, where)
    seen = settle(host, "handoffs", "next", where)
    assert seen.returncode == OK and event_id in seen.stdout

    leased = settle(host, "handoffs", "receive", where, "--json")
    assert leased.returncode == OK, leased.stderr
    data = json.loads(leased.stdout)
    assert data["coordinates"]["eventId"] == event_id and data["lease"]["token"]

    taken = settle(host, "handoffs", "receive", where)
    assert taken.returncode == NOTHING  # leased to the first: no one else gets it


# -- find ------------------------------------------------------------------------------------------


def test_find_by_external_job_id_or_an_event_id_prefix_in_another_case(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)
    job = "job-" + event_id.removeprefix("evt-")

    by_job = settle(host, "find", job, "--json")
    assert by_job.returncode == OK, by_job.stderr
    [found] = json.loads(by_job.stdout)
    assert (found["endpointId"], found["eventId"]) == (where, event_id)
    assert found["matchedBy"] == "externalJobId"
    assert f"externalJobId {job}" in settle(host, "find", job).stdout  # the table says what matched

    by_prefix = settle(host, "find", event_id[:9].upper())
    assert by_prefix.returncode == OK, by_prefix.stderr
    assert event_id in by_prefix.stdout and where in by_prefix.stdout

    nothing = settle(host, "find", f"job-{uuid.uuid4().hex}")
    assert nothing.returncode == NOTHING
    assert "nothing matches" in one_line(nothing)


# -- auth and reachability -------------------------------------------------------------------------


def test_a_refused_credential_is_one_line_saying_what_to_pass(start_host: Callable[..., HostProcess]) -> None:
    locked = start_host(env={"SETTLE_DEV_FUNCTION_KEY": "the-key"})
    refused = settle(locked, "handoffs", "next", "Billing")
    assert refused.returncode == AUTH
    line = one_line(refused)
    assert "401" in line and "--function-key" in line and "SETTLE_FUNCTION_KEY" in line

    with_key = settle(locked, "handoffs", "next", "Billing", env={"SETTLE_FUNCTION_KEY": "the-key"})
    assert with_key.returncode == NOTHING, with_key.stderr  # let in: nothing is parked there


def test_what_the_client_refuses_before_sending_is_one_line() -> None:
    blank = settle("http://127.0.0.1:9", "find", "  ")
    assert blank.returncode == 2 and "give an id to find" in one_line(blank)
    missing = settle(
        "http://127.0.0.1:9", "resubmit", "Billing", "evt-1", "--event-json", "/nonexistent.json"
    )
    assert missing.returncode == 2 and "No such file" in one_line(missing)  # before any request


def test_an_unreachable_settle_is_one_line() -> None:
    from devtools.azurite import free_port

    result = settle(f"http://127.0.0.1:{free_port()}", "show", "Billing", "evt-1")
    assert result.returncode == NOT_SETTLE  # not "nothing found" (1), not "Settle is busy" (6)
    assert "could not be sent" in one_line(result)


# -- complete lists, conventions, an agent's lease ---------------------------------------------------


def test_find_past_fifty_says_more_match_and_all_lists_every_one(host: HostProcess) -> None:
    where = endpoint()
    session = f"sess-{uuid.uuid4().hex[:8]}"
    parked = [park(host, where, session_id=session) for _ in range(53)]
    first = settle(host, "find", session)
    assert first.returncode == OK, first.stderr
    assert len(first.stdout.strip().splitlines()) == 1 + 50
    assert "more match" in first.stderr and "--all" in first.stderr
    every = settle(host, "--output", "jsonl", "find", session, "--all")
    assert every.returncode == OK and "more match" not in every.stderr
    assert sorted(json.loads(line)["eventId"] for line in every.stdout.splitlines()) == sorted(parked)
    few = settle(host, "--json", "find", session, "--limit", "3")
    assert len(json.loads(few.stdout)) == 3


def test_a_list_cut_short_says_of_how_many_where_the_answer_counts_them(host: HostProcess) -> None:
    where = endpoint()
    for _ in range(4):
        park(host, where)
    cut = settle(host, "events", where, "--status", "PendingHandoff", "--limit", "2")
    assert cut.returncode == OK, cut.stderr
    assert len(cut.stdout.strip().splitlines()) == 1 + 2
    assert "showing the first 2 of 4 events; more match" in cut.stderr
    whole = settle(host, "events", where, "--status", "PendingHandoff")
    assert whole.returncode == OK and "more match" not in whole.stderr


def test_a_closed_pipe_is_quiet(host: HostProcess) -> None:
    where = endpoint()
    session = f"pipe-{uuid.uuid4().hex[:8]}"
    for _ in range(5):
        park(host, where, session_id=session)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    environ["SETTLE_URL"] = host.base_url
    for _ in range(3):
        piped = subprocess.run(
            ["bash", "-c", f"'{SETTLE}' --output jsonl find {session} --all | head -1"],
            capture_output=True,
            text=True,
            env=environ,
            timeout=WAIT_S,
        )
        assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1
        assert "Errno 32" not in piped.stderr and "Traceback" not in piped.stderr, piped.stderr


def test_an_action_checks_its_json_and_asks_before_sending(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)
    bad = settle(host, "complete", where, event_id, "--result", "{bad", "--yes")
    assert bad.returncode == USAGE and "--result is not valid JSON" in one_line(bad)
    unasked = settle(host, "complete", where, event_id, "--result", "{}")  # stdin is not a terminal
    assert unasked.returncode == USAGE and "--yes" in one_line(unasked)
    dry = settle(host, "complete", where, event_id, "--result", '{"posted": true}', "--dry-run")
    assert dry.returncode == OK, dry.stderr
    request = json.loads(dry.stdout)
    assert request["method"] == "POST" and request["body"]["result"] == {"posted": True}
    shown = json.loads(settle(host, "--json", "show", where, event_id).stdout)
    assert shown["resolutionStatus"] == "Pending" and "complete" in shown["actions"]  # nothing was sent


def test_not_found_is_one_shape_for_every_command_and_json_errors_under_json(host: HostProcess) -> None:
    where = endpoint()
    results = [
        settle(host, "show", where, "evt-none"),
        settle(host, "find", f"none-{uuid.uuid4().hex}"),
        settle(host, "handoffs", "next", where),
        settle(
            host,
            "state",
            "get",
            "--tenant",
            "1",
            "--scope",
            "4",
            "--entity",
            "1",
            "--item-entity-key",
            "x",
            "--item-key",
            f"none-{uuid.uuid4().hex}",
        ),
    ]
    for result in results:
        assert result.returncode == NOTHING, result.stderr
        assert one_line(result).startswith("settle: not found: ") and result.stdout == ""
    as_json = settle(host, "--output", "json", "show", where, "evt-none")
    assert as_json.returncode == NOTHING and as_json.stdout == ""
    error = json.loads(as_json.stderr)["error"]
    assert error["exitCode"] == NOTHING and error["message"].startswith("not found")


def test_times_print_as_the_api_writes_them(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)
    shown = settle(host, "show", where, event_id)
    as_json = json.loads(settle(host, "--json", "show", where, event_id).stdout)
    api = httpx.get(
        f"{host.base_url}/api/v1/endpoints/event", params={"endpointId": where, "eventId": event_id}
    )
    assert as_json["updatedAt"] == api.json()["updatedAt"]
    assert as_json["updatedAt"] in shown.stdout
    printed = shown.stdout + json.dumps(as_json)
    assert not re.search(r"\d\d:\d\d:\d\d(\.\d+)?\+00:00|\.\d{4,}Z", printed)


def test_show_says_why_an_event_failed(host: HostProcess) -> None:
    where = endpoint()
    event_id = failed_event(host, where)
    shown = json.loads(settle(host, "--json", "show", where, event_id).stdout)
    found = json.loads(settle(host, "--json", "find", event_id).stdout)
    assert shown["reason"] and shown["reason"] == found[0]["reason"]
    assert "reason:" in settle(host, "show", where, event_id).stdout


def test_the_console_views_have_commands(host: HostProcess) -> None:
    where = endpoint()
    failed = failed_event(host, where)
    overview = json.loads(settle(host, "--json", "endpoints").stdout)
    assert any(e["endpointId"] == where and e["counts"]["failed"] == 1 for e in overview["items"])
    events = json.loads(settle(host, "--json", "events", where, "--status", "Failed").stdout)
    assert [e["eventId"] for e in events] == [failed]
    assert failed in settle(host, "failed", "--all").stdout
    assert settle(host, "--json", "audits").returncode == OK
    for command in (("stuck",), ("unconfirmed", where), ("overdue", where)):
        assert settle(host, "--json", *command).returncode == OK, command
    today = datetime.now(UTC)
    week = settle(host, "poison", "list", "--from", (today - timedelta(days=6)).strftime("%Y%m%d"))
    assert week.returncode == OK, week.stderr


def test_an_agent_leases_renews_and_settles_from_a_shell(host: HostProcess) -> None:
    where = endpoint()
    event_id = park(host, where)
    leased = json.loads(settle(host, "--json", "handoffs", "receive", where, "--agent", "agent-7").stdout)
    token = leased["lease"]["token"]
    assert leased["lease"]["leasedBy"] == "agent-7"
    renewed = settle(host, "handoffs", "renew", where, event_id, "--lease-token", token, "--yes")
    assert renewed.returncode == OK, renewed.stderr
    done = settle(
        host, "handoffs", "complete", where, event_id, "--lease-token", token, "--result", '{"ok":1}', "--yes"
    )
    assert done.returncode == OK, done.stderr
    again = settle(host, "handoffs", "next", where)
    assert again.returncode == NOTHING


def test_a_completion_script_names_every_command() -> None:
    script = settle("http://127.0.0.1:9", "completion", "bash").stdout
    assert all(command in script for command in (*COMMANDS, "endpoints", "audits", "completion"))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
