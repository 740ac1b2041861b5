"""The state guarantees against an adversary: killed processes, edited tokens, values at every boundary.

* Catch-up completeness: processes that take locks are ``SIGKILL``ed at random instants (and at chosen
  steps of the expiry-index preparation); afterwards catch-up must leave no record Processing past its
  lock, every expired lock must have its ``LockExpired`` history row, head and history must agree, and
  the index must hold nothing but (harmless) markers of killed preparations.
* Catch-up closing minutes while lockers keep adding locks to them: nothing is lost.
* Lock tokens: every field edited, truncated at every length, every byte flipped, another record's,
  another deployment's: 409 ``lock-lost`` (or 400), nothing written, never a 500.
* Every numeric and text field of every state operation at its limits (accepted and stored) and one step
  beyond (a 400 naming it), generated from the OpenAPI document.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from common import runtime
from common.clock import epoch_ms, from_epoch_ms, utcnow
from state import service
from state.catchup import Catchup
from state.keys import (
    BUCKET_MS,
    EXPIRY_TABLE,
    HEAD_SUFFIX,
    HISTORY_MARK,
    INDEX_END,
    INDEX_MARK,
    STATE_TABLE,
    bucket_of,
    partition_key,
)
from state.model import Status
from state.store import StateStore
from tests.conftest import Caller
from tests.reliability.records import check_head_and_history, read_rows
from tests.reliability.tally import TALLY, sized

pytestmark = pytest.mark.slow

AREA = "state adversary"
ROOT = Path(__file__).resolve().parents[2]


# -- helpers ---------------------------------------------------------------------------------------------
def start_locker(log: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.locker", str(log), *args],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def logged_count(log: Path) -> int:
    """How many keys were logged (cheap: the wait loop polls it while the lockers compete for the CPU)."""
    return log.read_bytes().count(b"\n") if log.exists() else 0


def logged_keys(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    keys = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut by the kill
            keys.append(json.loads(line))
    return keys


def catch_up_until_quiet(now: datetime | None = None, *, runs: int = 30) -> int:
    """Run catch-up (as the timer would) until a run finds nothing to do; returns locks failed."""
    failed = 0
    for _ in range(runs):
        result = service.catchup().run(now=now)
        failed += result.locks_failed
        if not (result.locks_failed or result.records_expired or result.stale_index_rows):
            return failed
    raise AssertionError(f"catch-up still had work after {runs} runs")


def index_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tables = runtime.tables()
    level2 = [
        dict(e)
        for e in tables.table(STATE_TABLE).query_entities(
            "RowKey ge @low and RowKey lt @high", parameters={"low": INDEX_MARK, "high": INDEX_END}
        )
    ]
    level1 = [dict(e) for e in tables.table(EXPIRY_TABLE).list_entities() if e["PartitionKey"][0] in "lr"]
    return level2, level1


def stored_records(keys: list[dict[str, Any]]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """Every version of every record in the keys' partitions, read in one range query per partition:
    (partition, item path) -> {version: row} (the head under its own version)."""
    partitions = {partition_key(k["tenantId"], k["scopeId"], k["entityId"]) for k in keys}
    table = runtime.tables().table(STATE_TABLE)
    records: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for pk in partitions:
        for entity in table.query_entities(
            "PartitionKey eq @pk and RowKey lt @index", parameters={"pk": pk, "index": INDEX_MARK}
        ):
            row_key = str(entity["RowKey"])
            path = (
                row_key[: -len(HEAD_SUFFIX)]
                if row_key.endswith(HEAD_SUFFIX)
                else row_key.rsplit(HISTORY_MARK, 1)[0]
            )
            records.setdefault((pk, path), {})[int(entity["Version"])] = dict(entity)
    return records


def check_every_lock_concluded(
    call: Caller, keys: list[dict[str, Any]], where: str, *, area: str = AREA
) -> dict[str, int]:
    """No record Processing; versions contiguous (one head, history rows superseded by the next version);
    every Processing version has a successor that ended it (holder, LockExpired) or continued it
    (takeover, extension). A sample is checked through the API as well (head/history agreement)."""
    check = TALLY.check
    seen: dict[str, int] = {"records": 0, "locks": 0, "expired": 0}
    for (_, path), versions in stored_records(keys).items():
        seen["records"] += 1
        top = max(versions)
        heads = [v for v, row in versions.items() if str(row["RowKey"]).endswith(HEAD_SUFFIX)]
        check(
            area,
            heads == [top] and sorted(versions) == list(range(1, top + 1)),
            f"{where}: {path} {sorted(versions)}",
        )
        head = versions[top]
        check(area, int(head["Status"]) != Status.PROCESSING, f"{where}: {path} left Processing")
        for v in range(1, top):
            row = versions[v]
            check(
                area,
                int(row["Status"]) == Status.SUPERSEDED and int(row["SupersededByVersion"]) == v + 1,
                f"{where}: {path} history v{v} {row['Status']}/{row.get('SupersededByVersion')}",
            )
            if int(row["RecordedStatus"]) != Status.PROCESSING:
                continue
            seen["locks"] += 1
            successor = versions[v + 1]
            if successor.get("Substatus") == "LockExpired":
                seen["expired"] += 1
                continue
            ended_by_holder = successor.get("ClosedLockId") == row["LockId"]
            continued = int(successor.get("RecordedStatus", successor["Status"])) == Status.PROCESSING
            check(
                area,
                ended_by_holder or continued,
                f"{where}: {path} v{v} followed by {successor.get('Substatus')}",
            )
    unique = list({json.dumps(k, sort_keys=True): k for k in keys}.values())
    for key in random.Random(1).sample(unique, min(50, len(unique))):
        if read_rows(key).head is not None:
            check_head_and_history(area, call, key, where)
    return seen


# -- catch-up completeness under kills ---------------------------------------------------------------------
# Thousands of locks by processes started and killed one after another: about 3.5 minutes on a quiet
# 2-core machine, more on a busy one (the lockers' pace is the machine's), so not the default 300 s.
@pytest.mark.timeout(1800)
def test_catch_up_is_complete_whatever_instant_the_locking_processes_are_killed(
    faulty_tables, call, tmp_path
):
    # Given processes that take short locks (1-3 s; some set, released, extended) on 8 partitions, each
    # SIGKILLed at a random instant and replaced by a fresh one
    warm = {"tenantId": 7, "scopeId": 4, "entityId": 1, "itemEntityKey": "w", "itemKey": "w"}
    call("state_lock", {"key": warm, "lockSeconds": 1})  # the signing key and the tables exist
    log = tmp_path / "locks.jsonl"
    kills, enough = sized(24, 6), sized(3000, 400)
    rng = random.Random(20261201)
    n = 0
    while n < kills or (logged_count(log) < enough and n < 4 * kills):
        process = start_locker(log, "--seed", str(n), "--threads", "4")
        deadline = time.monotonic() + 60
        started = logged_count(log)
        while logged_count(log) < started + 20 and time.monotonic() < deadline:  # it is working
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        TALLY.check(AREA, process.returncode == -signal.SIGKILL, f"locker {n} ended {process.returncode}")
        TALLY.add(AREA, faults=1)
        n += 1
    keys = logged_keys(log)
    TALLY.add(AREA, operations=len(keys))
    # When every lock has expired and catch-up runs as the timer would
    time.sleep(4)
    catch_up_until_quiet()
    # Then no record is Processing, every lock ended by its holder, a takeover, or LockExpired
    seen = check_every_lock_concluded(call, keys, "after kills")
    TALLY.check(
        AREA, seen["expired"] > 0 and len(keys) >= enough, f"too little work: {seen}, {len(keys)} keys"
    )
    # and once every minute is over, catch-up leaves no index row, only markers of killed preparations
    catch_up_until_quiet(utcnow() + timedelta(minutes=10))
    level2, level1 = index_rows()
    TALLY.check(AREA, level1 == [], f"level-1 rows left: {level1[:3]}")
    stray = [r for r in level2 if "StateRK" in r]
    TALLY.check(AREA, stray == [], f"index rows left: {stray[:3]}")
    TALLY.check(AREA, len(level2) <= n * 4, f"{len(level2)} markers left by {n} killed processes")


KILL_POINTS = ["marker", "level1", "batch", "after-batch"]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_process_killed_at_each_step_of_preparing_a_minute_loses_no_lock(
    faulty_tables, call, tmp_path, point
):
    # Given a partition whose minute M this instance prepared, then catch-up closed (marker and level-1 gone)
    entity = 900 + KILL_POINTS.index(point)
    first = {"tenantId": 7, "scopeId": 4, "entityId": entity, "itemEntityKey": "k", "itemKey": "first"}
    answer = call("state_lock", {"key": first, "lockSeconds": 90}).json
    bucket = bucket_of(epoch_ms(datetime.fromisoformat(answer["lockedUntil"])))
    call("state_set", {"key": first, "status": "Processed", "lockToken": answer["lockToken"]})
    after_m = from_epoch_ms((bucket + 1) * BUCKET_MS + 10_000)
    TALLY.check(AREA, service.catchup().run(now=after_m).minutes_closed == 1, f"{point}: minute not closed")

    def seconds_into_m() -> str:
        return str(round(((bucket * BUCKET_MS + 30_000) - epoch_ms(utcnow())) / 1000))

    # When another process locks a key expiring in M and is killed at that step
    second = {**first, "itemKey": "second"}
    log = tmp_path / "kill.jsonl"
    s = seconds_into_m()
    process = start_locker(
        log, "--keys", json.dumps([second]), "--kill-at", point, "--lock-seconds", f"{s},{s}"
    )
    process.wait(120)
    TALLY.add(AREA, operations=1, faults=1)
    TALLY.check(AREA, process.returncode == -signal.SIGKILL, f"{point}: locker ended {process.returncode}")
    # and this instance, whose cached marker of M is gone, locks a key expiring in M
    third = {**first, "itemKey": "third"}
    TALLY.check(
        AREA, call("state_lock", {"key": third, "lockSeconds": int(seconds_into_m())}).json["acquired"], point
    )
    TALLY.add(AREA, operations=1)
    # Then catch-up after M finds every lock that was applied (nothing else has touched M)
    catch_up_until_quiet(after_m)
    applied = [k for k in (second, third) if read_rows(k).head is not None]
    TALLY.check(AREA, third in applied, f"{point}: the lock of this instance is missing")
    TALLY.check(AREA, (second in applied) == (point == "after-batch"), f"{point}: second lock {applied}")
    for key in applied:
        head = read_rows(key).head
        assert head is not None
        TALLY.check(AREA, head.get("Substatus") == "LockExpired", f"{point}: {key['itemKey']} not caught up")
    # and a fresh process still locks in M after the killed one
    fourth = {**first, "itemKey": "fourth"}
    s = seconds_into_m()
    start_locker(log, "--keys", json.dumps([fourth]), "--lock-seconds", f"{s},{s}").wait(120)
    TALLY.add(AREA, operations=1)
    catch_up_until_quiet(after_m)
    for key in [*applied, fourth]:
        rows = check_head_and_history(AREA, call, key, point)
        assert rows.head is not None
        TALLY.check(
            AREA, rows.head.get("Substatus") == "LockExpired", f"{point}: {key['itemKey']} {rows.statuses}"
        )
    level2, _ = index_rows()
    TALLY.check(
        AREA, [r for r in level2 if "StateRK" in r and r["PartitionKey"].endswith(f"|{entity}")] == [], point
    )


def test_catch_up_closing_minutes_while_lockers_add_to_them_loses_nothing(faulty_tables, call):
    # Given four threads taking 1-second locks, and two catch-up instances running all the time with a
    # clock two minutes ahead, so they close every minute the lockers are still adding to (a real
    # catch-up never closes a minute a lock can still land in; this one deletes markers under them)
    stop = threading.Event()
    acquired: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    guard = threading.Lock()
    errors: list[str] = []

    def locker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            key = {"tenantId": 7, "scopeId": 4, "entityId": 700 + rng.randrange(3), "itemEntityKey": "c"}
            key["itemKey"] = f"{seed}-{rng.getrandbits(40):010x}"
            answer = call("state_lock", {"key": key, "lockSeconds": 1})
            with guard:
                if answer.status == 200 and answer.json["acquired"]:
                    acquired.append(key)
                elif answer.status == 409 and answer.json["type"] == "urn:settle:problem:conflict":
                    refused.append(key)  # "retry": the marker vanished on every attempt
                else:
                    errors.append(f"lock {answer.status} {answer.body!r}")

    def closer() -> None:
        catchup = Catchup(StateStore(runtime.tables()))
        while not stop.is_set():
            catchup.run(now=utcnow() + timedelta(minutes=2))

    threads = [threading.Thread(target=locker, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=closer) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(sized(20, 8))
    stop.set()
    for t in threads:
        t.join(120)
    TALLY.add(AREA, operations=len(acquired) + len(refused), races=1)
    TALLY.check(AREA, errors == [], f"lock errors: {errors[:3]}")
    TALLY.check(AREA, len(refused) * 10 < len(acquired), f"{len(refused)} refused, {len(acquired)} acquired")
    # When catch-up runs once more after every lock expired
    catch_up_until_quiet(utcnow() + timedelta(minutes=3))
    # Then every lock taken became Failed with its history row, a refused one wrote nothing, and the
    # index is empty
    seen = check_every_lock_concluded(call, acquired, "closing race")
    TALLY.check(
        AREA, seen["expired"] == seen["locks"] == len(acquired), f"closing race: {seen} of {len(acquired)}"
    )
    for key in refused:
        TALLY.check(AREA, read_rows(key).head is None, f"closing race: a refused lock wrote {key}")
    level2, level1 = index_rows()
    TALLY.check(
        AREA, [r for r in level2 if "StateRK" in r] == [] and level1 == [], "closing race: index left"
    )


# -- lock tokens ---------------------------------------------------------------------------------------
def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


def _mutations(value: Any) -> list[Any]:
    if isinstance(value, bool) or value is None:
        return [1, "x", None if value is not None else 0]
    if isinstance(value, int):
        return [value + 1, value - 1, 0, -value, 10**30, str(value), float(value), None, [value]]
    return [value + "x", value[:-1], value.upper(), "", None, 7, {"v": value}, value + "\r\nX: 1"]


FENCED: dict[str, dict[str, Any]] = {
    "state_set": {"status": "Processed", "data": {"by": "forger"}},
    "state_release": {"error": "forged"},
    "state_upsert": {"data": {"by": "forger"}},
    "state_lock_extend": {"lockSeconds": 3600},
}


def _refused(call: Caller, key: dict[str, Any], token: str, where: str) -> None:
    before = read_rows(key)
    for function, extra in FENCED.items():
        result = call(function, {"key": key, "lockToken": token, **extra})
        TALLY.add(AREA, fuzz_cases=1)
        TALLY.check(
            AREA,
            result.status in (400, 409) and result.content_type.startswith("application/problem+json"),
            f"{where}: {function} answered {result.status} {result.body[:200]!r}",
        )
        if result.status == 409:
            TALLY.check(
                AREA, result.json["type"] == "urn:settle:problem:lock-lost", f"{where}: {result.body!r}"
            )
    after = read_rows(key)
    TALLY.check(
        AREA, (after.head, after.history) == (before.head, before.history), f"{where}: something was written"
    )


def test_no_edit_of_a_lock_token_holds_the_lock(faulty_tables, call):
    # Given a live lock and an expired one (not taken over)
    key = {"tenantId": 7, "scopeId": 4, "entityId": 31, "itemEntityKey": "t", "itemKey": "live"}
    expired = {**key, "itemKey": "expired"}
    token = call("state_lock", {"key": key, "lockSeconds": 3600}).json["lockToken"]
    old = call("state_lock", {"key": expired, "lockSeconds": 1}).json["lockToken"]
    time.sleep(2.1)
    # When any field of either token is changed, removed or added, the token keeping its MAC
    for name, original in (("live", token), ("expired", old)):
        target = key if name == "live" else expired
        payload = _payload(original)
        edits: list[dict[str, Any]] = []
        for field, value in payload.items():
            edits += [{**payload, field: v} for v in _mutations(value)]
            edits.append({k: v for k, v in payload.items() if k != field})
        edits += [{**payload, "z": 1}, {**payload, "u": payload["u"] + 86_400_000}]
        for edit in edits:
            parts = original.split(".")
            parts[1] = _b64(json.dumps(edit).encode())
            _refused(call, target, ".".join(parts), f"{name} token edited {edit}")
    # Then (checked per edit) every fenced operation answered 409/400 and nothing was written;
    # and the genuine live token still works
    assert call("state_set", {"key": key, "status": "Processed", "lockToken": token}).status == 200


def test_truncated_flipped_foreign_and_forged_tokens_hold_no_lock(faulty_tables, call, new_tables):
    key = {"tenantId": 7, "scopeId": 4, "entityId": 32, "itemEntityKey": "t", "itemKey": "k"}
    other = {**key, "itemKey": "other"}
    token = call("state_lock", {"key": key, "lockSeconds": 3600}).json["lockToken"]
    other_token = call("state_lock", {"key": other, "lockSeconds": 3600}).json["lockToken"]
    candidates = [token[:cut] for cut in range(1, len(token))]
    rng = random.Random(7)
    for i in range(len(token)):
        flipped = list(token)
        flipped[i] = rng.choice([c for c in "AZaz09-_." if c != token[i]])
        candidates.append("".join(flipped))
    candidates += [other_token, token + token, token.replace("v2", "v1", 1), "v2." * 3, token + "="]
    for bad in candidates:
        _refused(call, key, bad, f"token {bad[:40]}...")
    # a token signed by another deployment (another key) for a record of the same key
    prefix = os.environ["SETTLE_TABLE_PREFIX"]
    new_tables()
    foreign = call("state_lock", {"key": key, "lockSeconds": 3600}).json["lockToken"]
    from tests.reliability.conftest import _use

    _use(os.environ["SETTLE_TABLES"], prefix, faults=True)
    _refused(call, key, foreign, "foreign deployment")
    assert call("state_set", {"key": key, "status": "Processed", "lockToken": token}).status == 200


# -- every numeric and text field at its limits -------------------------------------------------------------
def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _limited_fields(
    doc: dict[str, Any], schema: dict[str, Any], path: str = ""
) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every integer and string field with a documented limit."""
    schema = _resolve(doc, schema)
    found: list[tuple[str, dict[str, Any]]] = []
    for name, prop in schema.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        for option in prop.get("anyOf", [prop]):
            option = _resolve(doc, option)
            if option.get("type") == "object" or "properties" in option:
                found += _limited_fields(doc, option, here)
            elif (option.get("type") == "integer" and ("maximum" in option or "minimum" in option)) or (
                option.get("type") == "string" and "maxLength" in option
            ):
                found.append((here, option))
    return found


def _set(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(body))
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _request(call: Caller, operation: str, n: int, field: str, value: Any) -> dict[str, Any]:
    """A request of ``operation`` on a key of its own that succeeds, except for ``field`` set to ``value``.

    Fenced operations lock the (changed) key first, so the token is that key's."""
    key: dict[str, Any] = {
        "tenantId": 7,
        "scopeId": 4,
        "entityId": 40,
        "entityExecutionId": 1,
        "itemEntityKey": "b",
    }
    key["itemKey"] = f"{operation}-{n}"
    if field.startswith("key."):
        key = _set({"key": key}, field, value)["key"]
    body: dict[str, Any] = {"key": key}
    if operation in ("state_set", "state_release", "state_lock_extend", "state_upsert"):
        locked = call("state_lock", {"key": key})
        token = locked.json["lockToken"] if locked.status == 200 else "not-locked"
        extras: dict[str, dict[str, Any]] = {
            "state_set": {"status": "Failed", "error": "e", "substatus": "s"},
            "state_release": {"error": "e"},
            "state_lock_extend": {},
            "state_upsert": {"data": {}, "substatus": "s"},
        }
        extra = extras[operation]
        body = {"key": key, "lockToken": token, **extra}
    elif operation == "state_get":
        call("state_set", {"key": key, "status": "Processed"})
    elif operation == "state_query":
        body = {"tenantId": 7, "scopeId": 4, "entityId": 40}
    return body if field.startswith("key.") else _set(body, field, value)


def test_every_limited_field_of_every_state_operation_at_and_beyond_its_limits(faulty_tables, call):
    doc = call("openapi_document", method="GET").json
    cases = 0
    for operations in doc["paths"].values():
        for verb, op in operations.items():
            name = op["operationId"]
            if not name.startswith("state_") or "requestBody" not in op:
                continue
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            for field, limits in _limited_fields(doc, schema):
                if field.endswith(("lockToken", "continuationToken")):
                    continue  # a token's only valid values are the ones Settle issued (tests above)
                if limits.get("type") == "integer":
                    inside = [limits.get("minimum"), limits.get("maximum")]
                    outside = [limits["minimum"] - 1 if "minimum" in limits else None]
                    outside.append(limits["maximum"] + 1 if "maximum" in limits else None)
                else:
                    most = limits["maxLength"]
                    inside = ["a" * most, "\U0001f600" * (most // 2)]
                    outside = ["a" * (most + 1)]
                for value in [v for v in inside if v is not None]:
                    cases += 1
                    body = _request(call, name, cases, field, value)
                    result = call(name, body, method=verb.upper())
                    TALLY.add(AREA, fuzz_cases=1)
                    TALLY.check(
                        AREA,
                        result.status in (200, 204) or (name == "state_get" and result.status == 404),
                        f"{name} {field}={str(value)[:20]} (accepted by the schema): {result.status} "
                        f"{result.body[:300]!r}",
                    )
                for value in [v for v in outside if v is not None]:
                    cases += 1
                    body = _request(call, name, cases, field, value)
                    result = call(name, body, method=verb.upper())
                    TALLY.add(AREA, fuzz_cases=1)
                    TALLY.check(
                        AREA,
                        result.status == 400 and result.json.get("field") == field,
                        f"{name} {field}={str(value)[:20]} (beyond the limit): {result.status} "
                        f"{result.body[:300]!r}",
                    )
    TALLY.check(AREA, cases >= 60, f"only {cases} boundary cases found in the OpenAPI document")
