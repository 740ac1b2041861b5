"""Figure 6: cold start (first invocation). A Functions cold start ends at the first response, not at the
import, so each side runs in a fresh interpreter from its first import to its first answers.

* Settle: ``import function_app``, index it (``app.get_functions()``, as the worker does), answer a
  ``state_lock`` on a new key through the function object, then project a NimBus ``EventRequest``
  through the ``resolver`` function.
* The equivalent floor: the same SDK imports (``azure.functions``, ``azure.data.tables``, pydantic's
  ``BaseModel``), a body parsed by a pydantic model, and the same storage work as Settle's first lock and
  first message, request for request, written straight against the SDK (``EQUIVALENT_PROBE``). The bench
  counts both at the wire in every run and only judges the figure when they match.
* The naive floor (context): a table create-if-not-exists and one insert for the lock; a create-if-not-
  exists, a point read and one 2-entity transaction for the message: less work than Settle does.

Both sides find their tables already created (an earlier, untimed run of each did it), as an instance
that starts in a deployed app does. Interpreter start-up is outside every timing. The sides take turns,
rotating which goes first; medians over several fresh interpreters. For context, the import alone
(``import function_app`` against ``import azure.functions, azure.data.tables, pydantic``) is timed in
the same interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Environment, Figure, median, verdict_at_most
from bench.proxy import CountingProxy, Tally, tally

SECTION = "cold start"
TARGET = 1.3  # against the equivalent floor (the same storage work); the naive floor is context
HEAVY = ("azure.servicebus", "azure.identity", "azure.storage", "aiohttp", "cryptography")

_COMMON = """
import json, sys, time, uuid
from datetime import datetime, timezone
started = time.perf_counter()
"""

_MESSAGE = """
from azure.functions.servicebus import ServiceBusMessage
event_id = "cold-" + uuid.uuid4().hex
message = ServiceBusMessage(
    body=json.dumps({"EventContent": {"EventTypeId": "InvoiceCreated", "EventJson": "{}"}}).encode(),
    message_id="InvoiceCreated-" + uuid.uuid4().hex,
    session_id="cold",
    correlation_id=event_id,
    enqueued_time_utc=datetime.now(timezone.utc),
    delivery_count=1,
    application_properties={
        "MessageType": "EventRequest", "EventId": event_id, "To": "Billing", "From": "Billing-producer",
        "OriginatingMessageId": "self", "ParentMessageId": "self", "OriginatingFrom": "self",
        "EventTypeId": "InvoiceCreated", "RetryCount": 0,
    },
    user_properties={},
)
"""

# Every probe's first request: a lock on a new key (timed from lock_started).
_LOCK_REQUEST = """
body = {"key": {"tenantId": 1, "scopeId": 4, "entityId": 42, "itemEntityKey": "invoice",
                "itemKey": "cold-" + uuid.uuid4().hex}}
request = func.HttpRequest("POST", "http://localhost/api/v1/state/lock",
                           headers={"content-type": "application/json"}, params={}, route_params={},
                           body=json.dumps(body).encode())
lock_started = time.monotonic()
"""

SETTLE_PROBE = (
    _COMMON
    + """
import function_app
imported = time.perf_counter()
import azure.functions as func
functions = {str(f.get_function_name()): f for f in function_app.app.get_functions()}
"""
    + _LOCK_REQUEST
    + """answer = functions["state_lock"].get_user_function()(request)
assert answer.status_code == 200 and json.loads(answer.get_body())["acquired"], answer.get_body()
locked = time.perf_counter()
"""
    + _MESSAGE
    + """
message_started = time.monotonic()
functions["resolver"].get_user_function()(message)
done = time.perf_counter()
heavy = [h for h in __HEAVY__ if h in sys.modules]
import importlib.util, os
bytecode = os.path.exists(importlib.util.cache_from_source(function_app.__file__))
print(json.dumps({"import": imported - started, "first_lock": locked - imported,
                   "first_message": done - locked, "total": done - started,
                   "modules": len(sys.modules), "heavy": heavy, "bytecode": bytecode,
                   "phases": [lock_started, message_started]}))
"""
)

# What both floors share: the lock request parsed as a pydantic model (after their imports, before their
# storage work), the first message as it reaches them, and what they print.
_FLOOR_LOCK_REQUEST = (
    """
class Key(BaseModel):
    tenantId: int
    scopeId: int
    entityId: int
    itemEntityKey: str
    itemKey: str

class LockIn(BaseModel):
    key: Key
"""
    + _LOCK_REQUEST
    + """parsed = LockIn.model_validate_json(request.get_body())
service = TableServiceClient.from_connection_string(__CONNECTION__)
"""
)

_FLOOR_MESSAGE = (
    _MESSAGE
    + """
message_started = time.monotonic()
props = message.application_properties
content = json.loads(message.get_body())
"""
)

_FLOOR_ANSWER = """
done = time.perf_counter()
print(json.dumps({"import": imported - started, "first_lock": locked - imported,
                   "first_message": done - locked, "total": done - started,
                   "modules": len(sys.modules), "heavy": [], "phases": [lock_started, message_started]}))
"""

FLOOR_PROBE = (
    _COMMON
    + """
import azure.functions, azure.data.tables, pydantic
imported = time.perf_counter()
import azure.functions as func
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient
from pydantic import BaseModel

"""
    + _FLOOR_LOCK_REQUEST
    + """state = service.create_table_if_not_exists(__STATE_TABLE__)
now = datetime.now(timezone.utc)
state.create_entity({"PartitionKey": f"1|4|{parsed.key.entityId}", "RowKey": parsed.key.itemKey, "Status": 2,
                      "LockId": uuid.uuid4().hex, "LockedAt": now, "LockedUntil": now, "Version": 1})
answer = func.HttpResponse(json.dumps({"acquired": True}), status_code=200, mimetype="application/json")
locked = time.perf_counter()
"""
    + _FLOOR_MESSAGE
    + """events = service.create_table_if_not_exists(__EVENTS_TABLE__)
try:
    events.get_entity("Billing", "ev|" + props["EventId"] + "|e")
except ResourceNotFoundError:
    pass
row = {"PartitionKey": "Billing", "RowKey": "ev|" + props["EventId"] + "|e", "ResolutionStatus": "Pending",
        "MessageType": props["MessageType"], "LastMessageId": message.message_id,
        "EventJson": content["EventContent"]["EventJson"]}
history = dict(row, RowKey="ev|" + props["EventId"] + "|m|" + message.message_id)
events.submit_transaction([("create", history), ("upsert", row)])
"""
    + _FLOOR_ANSWER
)


# The equivalent floor: the same SDKs and the same storage work as Settle's first lock and first message,
# written straight against the SDK with nothing of Settle's. Request for request it mirrors what the
# counting proxy sees Settle send (the bench checks it each run: the figure says "not equivalent" when the
# wire counts differ): for the lock, the table listing, the recorded layouts' read, the signing key's read,
# the catch-up minute's marker, the lock-index upsert and one 2-entity transaction (head, the marker merge
# naming the lock: ADR-0021); for the message, three find-index inserts, the endpoint's registration
# (already there), the event's point read, all five at once as Settle sends them, then one 7-entity
# transaction.
EQUIVALENT_PROBE = (
    _COMMON
    + """
import azure.functions, azure.data.tables, pydantic
imported = time.perf_counter()
import azure.functions as func
from concurrent.futures import ThreadPoolExecutor
from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, UpdateMode
from pydantic import BaseModel

"""
    + _FLOOR_LOCK_REQUEST
    + """prefix = __PREFIX__
list(service.query_tables("TableName ge @p and TableName lt @q", parameters={"p": prefix, "q": prefix + "{"}))
locks = service.get_table_client(prefix + "eqlocks")
state = service.get_table_client(prefix + "eqstate")
list(locks.query_entities("PartitionKey eq '~layout' and RowKey lt '~'"))
try:
    locks.get_entity("hmac", "v1")
except ResourceNotFoundError:
    pass
now = datetime.now(timezone.utc)
minute = "l" + str(int(now.timestamp()) // 60)
marker = {"PartitionKey": "1|4|42", "RowKey": "~" + minute + "|m" + uuid.uuid4().hex, "Count": 0,
          "Since": now}
created = state.create_entity(marker)
locks.upsert_entity({"PartitionKey": minute, "RowKey": "1|4|42", "Since": now}, mode=UpdateMode.MERGE)
lock_id = uuid.uuid4().hex
head = {"PartitionKey": "1|4|42", "RowKey": parsed.key.itemEntityKey + "|" + parsed.key.itemKey,
        "TenantId": 1, "ScopeId": 4, "EntityId": 42, "ItemEntityKey": parsed.key.itemEntityKey,
        "ItemKey": parsed.key.itemKey, "Status": 2, "Version": 1, "LockId": lock_id, "LockedAt": now,
        "LockedUntil": now, "LockedBy": "floor", "Attempt": 1, "CreatedAt": now, "UpdatedAt": now}
state.submit_transaction([
    ("create", head),
    ("update", dict(marker, Count=1, **{"L" + lock_id: "0|" + head["RowKey"]}),
     {"mode": UpdateMode.MERGE, "etag": created["etag"], "match_condition": MatchConditions.IfNotModified}),
])
answer = func.HttpResponse(json.dumps({"acquired": True, "lockId": lock_id}), status_code=200,
                           mimetype="application/json")
locked = time.perf_counter()
"""
    + _FLOOR_MESSAGE
    + """ids = service.get_table_client(prefix + "eqids")
endpoints = service.get_table_client(prefix + "eqendpoints")
events = service.get_table_client(prefix + "eqevents")
event_id = props["EventId"]

def index(kind, value):
    ids.create_entity({"PartitionKey": value[:2], "RowKey": kind + "|" + value + "|" + event_id,
                       "Endpoint": props["To"], "EventId": event_id, "MessageId": message.message_id})

def register():
    try:
        endpoints.create_entity({"PartitionKey": "e", "RowKey": props["To"]})
    except ResourceExistsError:
        pass

def look():
    try:
        events.get_entity(props["To"], "ev|" + event_id + "|e")
    except ResourceNotFoundError:
        pass

with ThreadPoolExecutor(5) as pool:
    for done_ in [pool.submit(index, "m", message.message_id), pool.submit(index, "e", event_id),
                  pool.submit(index, "s", message.session_id), pool.submit(register), pool.submit(look)]:
        done_.result()
stamp = now.strftime("%Y%m%dT%H%M%S%fZ")
row = {"PartitionKey": props["To"], "RowKey": "ev|" + event_id + "|e", "ResolutionStatus": "Pending",
       "MessageType": props["MessageType"], "LastMessageId": message.message_id,
       "SessionId": message.session_id,
       "EventTypeId": props["EventTypeId"], "From": props["From"], "UpdatedAt": now,
       "EventJson": content["EventContent"]["EventJson"]}
listing = {"PartitionKey": props["To"], "EventId": event_id, "ResolutionStatus": "Pending", "UpdatedAt": now}
events.submit_transaction([
    ("create", dict(row, RowKey="ev|" + event_id + "|m|" + message.message_id)),
    ("create", row),
    ("create", dict(listing, RowKey="sd|Pending|" + stamp + "|" + event_id)),
])
"""
    + _FLOOR_ANSWER
)


def settle_probe() -> str:
    return SETTLE_PROBE.replace("__HEAVY__", repr(HEAVY))


def floor_probe(connection: str, prefix: str) -> str:
    return (
        FLOOR_PROBE.replace("__CONNECTION__", repr(connection))
        .replace("__STATE_TABLE__", repr(f"{prefix}floorstate"))
        .replace("__EVENTS_TABLE__", repr(f"{prefix}floorevents"))
    )


def equivalent_probe(connection: str, prefix: str) -> str:
    return EQUIVALENT_PROBE.replace("__CONNECTION__", repr(connection)).replace("__PREFIX__", repr(prefix))


def prepare_equivalent(connection: str, prefix: str) -> None:
    """The equivalent floor's tables, and what Settle finds already there at its first start: the recorded
    layout and the endpoint's registration (untimed, as Settle's warm-up run makes them)."""
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(connection)
    for name in ("eqlocks", "eqstate", "eqids", "eqendpoints", "eqevents"):
        service.create_table_if_not_exists(prefix + name)
    locks = service.get_table_client(prefix + "eqlocks")
    locks.upsert_entity({"PartitionKey": "~layout", "RowKey": "0", "Shards": 1})
    locks.upsert_entity({"PartitionKey": "~layout", "RowKey": "1", "Shards": 1})
    locks.upsert_entity({"PartitionKey": "hmac", "RowKey": "v1", "Key": uuid.uuid4().hex})
    service.get_table_client(prefix + "eqendpoints").upsert_entity({"PartitionKey": "e", "RowKey": "Billing"})


def probe(code: str, env: dict[str, str], cwd: Path = ROOT) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (in ``cwd``) and return what it printed."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )
    if out.returncode != 0:
        raise RuntimeError(f"probe failed ({out.returncode}): {out.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def deployed_package(into: Path) -> Path:
    """The app as infra/deploy.sh ships it (infra/package.py: the kept files and their bytecode), unpacked
    into ``into``. The probes run there with nothing else of the repository on their path, read-only as a
    deployed package is (PYTHONDONTWRITEBYTECODE), so what the package lacks is compiled at each start."""
    built = subprocess.run(
        [sys.executable, str(ROOT / "infra" / "package.py"), str(into / "settle.zip")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    log_line = built.stdout.strip()
    app = into / "wwwroot"
    with zipfile.ZipFile(into / "settle.zip") as archive:
        archive.extractall(app)
    (app / "package.txt").write_text(log_line)
    return app


def own_import_costs(env: dict[str, str], cwd: Path, top: int = 20) -> dict[str, float]:
    """Self time (ms) of Settle's modules loaded by a cold first invocation (``-X importtime``)."""
    code = settle_probe()
    stderr = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    ).stderr
    own: dict[str, float] = {}
    for line in stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        module = parts[2].strip()
        if module.split(".")[0] in ("function_app", "common", "state", "handoff"):
            own[module] = int(parts[0]) / 1000
    return dict(sorted(own.items(), key=lambda kv: -kv[1])[:top])


PHASES = ("first lock", "first message")


def wire_cost(
    code: str, environ: dict[str, str], cwd: Path, proxy: CountingProxy, quiet_s: float
) -> dict[str, Tally]:
    """One untimed probe through the counting proxy: what storage received in each phase (from the lock's
    start to the message's, then to the end), told apart by the probe's monotonic clock (the same clock as
    the proxy's on one machine). Requests before the lock (the import) would be a phase of their own."""
    start = proxy.count
    result = probe(code, environ, cwd)
    proxy.wait_quiet(quiet_s)
    lock_started, message_started = (float(t) for t in result["phases"])
    seen = proxy.since(start)
    phases = {
        "import": tally([r for r in seen if r.at < lock_started]),
        PHASES[0]: tally([r for r in seen if lock_started <= r.at < message_started]),
        PHASES[1]: tally([r for r in seen if r.at >= message_started]),
    }
    return {k: v for k, v in phases.items() if k != "import" or v.requests}


def same_work(settle: dict[str, Tally], floor: dict[str, Tally]) -> str:
    """Empty when ``floor`` asked of storage what ``settle`` asked in each phase (requests, entity writes by
    kind); else what differs."""
    differences = []
    for phase in PHASES:
        ours, theirs = settle.get(phase, Tally()), floor.get(phase, Tally())
        if ours.requests != theirs.requests or ours.written != theirs.written:
            differences.append(
                f"{phase}: Settle {ours.requests} requests {dict(ours.written)}, "
                f"floor {theirs.requests} requests {dict(theirs.written)}"
            )
    return "; ".join(differences)


def _wire_note(costs: dict[str, Tally]) -> str:
    return " + ".join(
        f"{cost.requests} requests ({cost.writes} entities written)" for name, cost in costs.items()
    )


def run(env: Environment) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="settle-coldstart-") as scratch:
        return _run(env, deployed_package(Path(scratch)))


def _run(env: Environment, app: Path) -> list[Figure]:
    prefix = "c" + uuid.uuid4().hex[:12]
    base = {k: v for k, v in os.environ.items() if not k.startswith("ServiceBusConnection")}
    base.update(
        SETTLE_TABLES=env.connection,
        SETTLE_TABLE_PREFIX=prefix,
        SETTLE_LOOPBACK="false",
        PYTHONDONTWRITEBYTECODE="1",
    )
    base.pop("SETTLE_TABLES__tableServiceUri", None)
    base.pop("PYTHONPATH", None)
    deployed_env = dict(base, PYTHONPATH=str(app))
    sources_env = dict(base, PYTHONPATH=str(ROOT))
    # settle: the package as deploy.sh ships it; floor: the SDKs (their pycs come with the install, as the
    # remote build's install makes them: pip compiles by default, Oryx's uv path asks for it); sources: the
    # same app from its sources alone (what azd and Core Tools ship, .funcignore leaving pycs out), context.
    sides: dict[str, tuple[str, dict[str, str], Path]] = {
        "settle": (settle_probe(), deployed_env, app),
        "equivalent": (equivalent_probe(env.connection, prefix), sources_env, ROOT),
        "floor": (floor_probe(env.connection, prefix), sources_env, ROOT),
        "sources": (settle_probe(), sources_env, ROOT),
    }
    prepare_equivalent(env.connection, prefix)
    for code, environ, cwd in sides.values():
        probe(code, environ, cwd)  # creates each side's tables and warms the file cache alike (not timed)
    # What each side asks of storage, counted at the wire in one more untimed probe (the timed ones reach
    # Azurite directly: the proxy's hop stays out of the timings).
    with CountingProxy(env.table_endpoint()) as proxy:
        through = proxy.connection_string(env.connection)
        wire = {
            "settle": wire_cost(
                settle_probe(),
                dict(deployed_env, SETTLE_TABLES=through),
                app,
                proxy,
                env.sizes.roundtrip_quiet_s,
            ),
            "equivalent": wire_cost(
                equivalent_probe(through, prefix), sources_env, ROOT, proxy, env.sizes.roundtrip_quiet_s
            ),
            "floor": wire_cost(
                floor_probe(through, prefix), sources_env, ROOT, proxy, env.sizes.roundtrip_quiet_s
            ),
        }
    equivalent = same_work(wire["settle"], wire["equivalent"])
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for n in range(env.sizes.coldstart_processes):
        order = list(sides)[n % len(sides) :] + list(sides)[: n % len(sides)]  # no side always first
        for side in order:
            code, environ, cwd = sides[side]
            runs[side].append(probe(code, environ, cwd))
    own = own_import_costs(deployed_env, app)

    def med(side: str, part: str) -> float:
        return median([float(r[part]) for r in runs[side]])

    settle_total, floor_total = med("settle", "total"), med("floor", "total")
    equivalent_total = med("equivalent", "total")
    value = settle_total / equivalent_total
    # The same ratio within each round (the sides ran back to back, under the same load): its spread says
    # how far a busy machine moves the figure (so the spread is reported).
    per_round = sorted(
        float(a["total"]) / float(b["total"]) for a, b in zip(runs["settle"], runs["equivalent"], strict=True)
    )
    env.details["coldstart"] = {
        "package": (app / "package.txt").read_text(),
        "settle": runs["settle"],
        "equivalent": runs["equivalent"],
        "floor": runs["floor"],
        "sources": runs["sources"],
        "equivalent_at_the_wire": equivalent,
        "own_modules_self_ms": own,
        "ratio_per_round": per_round,
        "medians_s": {
            side: {p: med(side, p) for p in ("import", "first_lock", "first_message", "total")}
            for side in runs
        },
    }
    heavy = sorted({h for r in runs["settle"] for h in r.get("heavy", [])})
    env.details["coldstart"]["wire"] = {
        side: {phase: cost.as_dict() for phase, cost in phases.items()} for side, phases in wire.items()
    }

    def read_from(side: str) -> str:
        if all(r.get("bytecode") for r in runs[side]):
            return "Settle's modules read from the package's bytecode"
        if not any(r.get("bytecode") for r in runs[side]):
            return "Settle's modules compiled from source in each interpreter"
        return "Settle's modules read from bytecode in some interpreters only"

    def parts(side: str) -> str:
        return (
            " + ".join(f"{med(side, p) * 1000:.0f}" for p in ("import", "first_lock", "first_message"))
            + " ms"
        )

    return [
        Figure(
            section=SECTION,
            name="cold start (first invocation)",
            settle=settle_total,
            baseline=equivalent_total,
            ratio=value,
            target=f"<= {TARGET}x",
            verdict=verdict_at_most(value, TARGET) if equivalent == "" else "missing",
            unit="s",
            note=(
                f"{len(runs['settle'])} fresh interpreters each, the package as infra/deploy.sh ships it "
                f"(infra/package.py), against the equivalent floor: the same SDKs and the same storage work "
                f"written straight against the SDK ("
                + (
                    "the same requests and entity writes in each phase, counted at the wire"
                    if equivalent == ""
                    else f"NOT equivalent at the wire: {equivalent}"
                )
                + f"); import + first lock + first message: "
                f"Settle {parts('settle')}, equivalent floor {parts('equivalent')}; the first lock + the "
                f"first message at the wire (one more probe each, through the counting proxy): Settle "
                f"{_wire_note(wire['settle'])}, equivalent floor {_wire_note(wire['equivalent'])}; "
                f"ratio within each round: median {median(per_round):.2f}, "
                f"{per_round[0]:.2f}-{per_round[-1]:.2f}; "
                "heavy SDKs loaded: "
                f"{', '.join(heavy) or 'none'}; {read_from('settle')}; "
                f"Settle's own modules {sum(own.values()):.0f} ms self time "
                "(largest: " + ", ".join(f"{m} {ms:.0f} ms" for m, ms in list(own.items())[:3]) + ")"
            ),
        ),
        Figure(
            section=SECTION,
            name="cold start against the naive floor",
            settle=settle_total,
            baseline=floor_total,
            ratio=settle_total / floor_total,
            target="(context)",
            verdict="info",
            unit="s",
            note=(
                "the same Settle runs against a floor that does less storage work than Settle's first "
                "requests (a table create-if-not-exists and one insert for the lock; a create, a point read "
                f"and one 2-entity transaction for the message): floor {parts('floor')}, at the wire "
                f"{_wire_note(wire['floor'])}"
            ),
        ),
        Figure(
            section=SECTION,
            name="cold start, sources only (azd, Core Tools)",
            settle=med("sources", "total"),
            baseline=equivalent_total,
            ratio=med("sources", "total") / equivalent_total,
            target="(context)",
            verdict="info",
            unit="s",
            note=(
                "the same app without its bytecode, as `azd deploy` and `func azure functionapp publish` "
                f"ship it (.funcignore leaves pycs out): Settle {parts('sources')}; {read_from('sources')}"
            ),
        ),
        Figure(
            section=SECTION,
            name="import function_app / import SDKs",
            settle=med("settle", "import"),
            baseline=med("floor", "import"),
            ratio=med("settle", "import") / med("floor", "import"),
            target="(context)",
            verdict="info",
            unit="s",
            note=(
                "the import alone, in the same interpreters: `import function_app` from the package against "
                "`import azure.functions, azure.data.tables, pydantic`"
            ),
        ),
    ]
