"""Auth, tried for real, and no secret in any committed file.

The development host runs as a separate process with ``SETTLE_DEV_FUNCTION_KEY`` set, and every route
the app declares (read from ``app.get_functions()``, not a hand list) is called over HTTP: each FUNCTION
route without a key, with a wrong key (header and ``?code=``) answers 401 and writes nothing (storage
is read afterwards); anonymous routes answer without a key; the same calls with the right key reach the
functions (the control that shows the 401s were the key's doing and the storage check can see writes).
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.settings import AZURITE_ACCOUNT_KEY
from devtools.host import route_prefix
from tests.conftest import Caller, new_prefix
from tests.reliability.tally import TALLY
from tests.support.children import HostProcess, start_devhost
from tests.support.devhost import host_environment
from tests.support.routes import OPERATOR_ROUTES

pytestmark = pytest.mark.slow

AREA = "auth & secrets"
ROOT = Path(__file__).resolve().parents[2]
# A route with ids in its path has a twin that takes them in the query string, with the same auth level
# (the reviewed bindings name every function).
_BOUND = json.loads((ROOT / "tests" / "worker" / "host_bindings.json").read_text(encoding="utf-8"))
OPERATOR_TWINS = {
    n for n in _BOUND if n.endswith("_by_query") and n.removesuffix("_by_query") in OPERATOR_ROUTES
}
# state_meta: lookup lists, no I/O; the operator routes check the principal in code (ADR-0013).
ANONYMOUS = {"health", "openapi_document", "state_meta"} | OPERATOR_ROUTES | OPERATOR_TWINS

# A real key is long base64; placeholders ("...", "SAS_KEY_VALUE", a test's "eA==") are not.
SECRET_PATTERNS = {
    "storage/Service Bus key": re.compile(r"(?:AccountKey|SharedAccessKey)\s*=\s*([A-Za-z0-9+/]{40,}={0,2})"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "SAS signature": re.compile(r"[?&]sig=([A-Za-z0-9%+/=]{30,})"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "Functions key in a URL": re.compile(r"[?&]code=([A-Za-z0-9_\-]{40,}={0,2})"),
}
ALLOWED_VALUES = {AZURITE_ACCOUNT_KEY}
KEY = "reliability-" + uuid.uuid4().hex
# Settings the developer's shell must not hand the host: the test decides them.


def test_only_health_and_the_openapi_document_are_anonymous(functions):
    http = {n: f for n, f in functions.items() if type(f.get_trigger()).__name__ == "HttpTrigger"}
    for name, fn in http.items():
        level = str(getattr(fn.get_trigger().auth_level, "value", fn.get_trigger().auth_level)).lower()
        expected = "anonymous" if name in ANONYMOUS else "function"
        TALLY.check(AREA, level == expected, f"{name} is {level}, must be {expected}")
    TALLY.check(AREA, set(http) >= ANONYMOUS, f"missing anonymous functions: {ANONYMOUS - set(http)}")
    TALLY.check(AREA, len(http) > len(ANONYMOUS), "no operation functions found")


def test_the_openapi_document_requires_a_function_key_exactly_where_the_host_does(functions):
    document = Caller(functions)("openapi_document", method="GET").json
    for ops in document["paths"].values():
        for op in ops.values():
            secured = bool(op.get("security"))
            TALLY.check(
                AREA,
                secured == (op["operationId"] not in ANONYMOUS),
                f"{op['operationId']}: documented security {op.get('security')}",
            )


def committed_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_secret_is_committed():
    files = committed_files()
    assert len(files) > 20  # the scan really ran over the repository
    findings: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for kind, pattern in SECRET_PATTERNS.items():
            for match in pattern.finditer(text):
                value = match.group(1) if match.groups() else match.group(0)
                if value in ALLOWED_VALUES:
                    continue
                line = text.count("\n", 0, match.start()) + 1
                findings.append(f"{path.relative_to(ROOT)}:{line}: {kind}")
    TALLY.check(AREA, not findings, "secrets in committed files: " + "; ".join(findings))


def test_the_scanner_finds_what_it_looks_for():
    # Given text with a real-looking key, a private key and the Azurite key
    fake = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=" + "Zm9v" * 22 + ";"
    samples = [fake, "-----BEGIN RSA " + "PRIVATE KEY-----", "https://x/y?sv=2024&sig=" + "a" * 40]
    for sample in samples:
        TALLY.check(
            AREA, any(p.search(sample) for p in SECRET_PATTERNS.values()), f"not detected: {sample[:40]}"
        )
    azurite = f"AccountKey={AZURITE_ACCOUNT_KEY};"
    hits = [m.group(1) for p in SECRET_PATTERNS.values() for m in p.finditer(azurite) if m.groups()]
    TALLY.check(AREA, all(h in ALLOWED_VALUES for h in hits), "the Azurite well-known key is not a secret")


# ------------------------------------------------------------------------------------ auth, over HTTP


@pytest.fixture(scope="module")
def host(azurite_connection: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """``python -m devtools.host`` with a function key, on tables of its own, timers off (they write)."""
    environ = host_environment(azurite_connection, new_prefix(), SETTLE_DEV_FUNCTION_KEY=KEY)
    running = start_devhost(tmp_path_factory.mktemp("auth-host"), environ, "--no-timers")
    try:
        yield running
    finally:
        running.stop()


@dataclass(frozen=True)
class Route:
    function: str
    method: str
    path: str
    auth: str
    body: Any


def _fill(template: str) -> str:
    """A concrete path for a route template (a value per parameter that satisfies its constraint)."""

    def value(match: re.Match[str]) -> str:
        spec = match.group(1)
        if ":guid" in spec:
            return str(uuid.uuid4())
        if any(c in spec for c in (":int", ":long", ":min", ":max", ":range")):
            return "1"
        return "auth-probe-" + uuid.uuid4().hex[:6]

    return re.sub(r"\{([^}]*)\}", value, template)


def _minimal(schema: dict[str, Any], components: dict[str, Any], name: str = "") -> Any:
    """A small valid value of an OpenAPI schema (required fields only), shaped to reach storage."""
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    if name == "key":
        return {
            "tenantId": 1,
            "scopeId": 4,
            "entityId": 1,
            "itemEntityKey": "auth",
            "itemKey": uuid.uuid4().hex,
        }
    if name == "status":
        return "Processed"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return _minimal(next(s for s in schema[union] if s.get("type") != "null"), components, name)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: _minimal(v, components, k) for k, v in props.items() if k in schema.get("required", [])}
    if kind == "integer":
        return max(1, int(schema.get("minimum", 1)))
    if kind == "array":
        return []
    if kind == "boolean":
        return True
    return "auth-probe"


def declared_routes(functions: dict[str, Any]) -> list[Route]:
    """Every HTTP route the app declares, with its auth level, plus the admin endpoint of every other
    function (the host's own admin level); bodies built from the served OpenAPI document."""
    document = Caller(functions)("openapi_document", method="GET").json
    components = document["components"]["schemas"]
    schemas = {
        op["operationId"]: op.get("requestBody", {})
        .get("content", {})
        .get("application/json", {})
        .get("schema")
        for ops in document["paths"].values()
        for op in ops.values()
    }
    prefix = route_prefix(ROOT / "host.json")
    routes: list[Route] = []
    for name, fn in sorted(functions.items()):
        trigger = fn.get_trigger()
        if type(trigger).__name__ != "HttpTrigger":
            routes.append(Route(name, "POST", f"/admin/functions/{name}", "admin", {}))
            continue
        level = str(getattr(trigger.auth_level, "value", trigger.auth_level) or "function").lower()
        schema = schemas.get(name)
        body = _minimal(schema, components) if schema else None
        for method in trigger.methods or ["GET"]:
            verb = str(getattr(method, "value", method)).upper()
            routes.append(Route(name, verb, f"/{prefix}/{_fill(trigger.route or name)}", level, body))
    return routes


def stored_entities(connection: str, prefix: str) -> dict[str, int]:
    """Entities in every table of ``prefix`` (a table that exists at all shows up, even empty)."""
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(connection)
    found: dict[str, int] = {}
    for table in service.list_tables():
        if table.name.startswith(prefix):
            found[table.name] = sum(1 for _ in service.get_table_client(table.name).list_entities())
    return found


def send(
    host: HostProcess, route: Route, *, headers: dict[str, str] | None = None, code: str | None = None
) -> int:
    params = {"code": code} if code is not None else None
    response = httpx.request(
        route.method,
        host.base_url + route.path,
        json=route.body,
        headers=headers,
        params=params,
        timeout=60.0,
    )
    TALLY.add(AREA, operations=1)
    return response.status_code


def test_every_function_route_refuses_a_missing_or_wrong_key_and_writes_nothing(
    host, functions, azurite_connection
):
    # Given the host with a function key, and the routes the app declares
    routes = declared_routes(functions)
    secured = [r for r in routes if r.auth != "anonymous"]
    TALLY.check(AREA, len(secured) > 10, f"only {len(secured)} secured routes found: {routes}")
    # When each secured route is called without a key, a wrong key (header or ?code=) or an empty one
    for route in secured:
        for label, kwargs in (
            ("no key", {}),
            ("wrong key", {"headers": {"x-functions-key": KEY + "x"}}),
            ("wrong code", {"code": "x" + KEY}),
            ("empty key", {"headers": {"x-functions-key": ""}}),
        ):
            status = send(host, route, **kwargs)
            # Then every answer is 401
            TALLY.check(
                AREA, status == 401, f"{route.method} {route.path} ({route.function}), {label}: {status}"
            )
    # And nothing was written: not a row, not even a table
    TALLY.check(
        AREA,
        not stored_entities(azurite_connection, host.prefix),
        f"unauthorised calls wrote: {stored_entities(azurite_connection, host.prefix)}",
    )


def test_anonymous_routes_answer_without_a_key_and_the_key_opens_the_others(
    host, functions, azurite_connection
):
    routes = declared_routes(functions)
    anonymous = [r for r in routes if r.auth == "anonymous"]
    TALLY.check(AREA, {r.function for r in anonymous} == ANONYMOUS, f"anonymous routes: {anonymous}")
    for route in anonymous:
        status = send(host, route)
        # An operator route's probe addresses no real event or poison row: any answer but 401 (and never a
        # 5xx) shows the route is open to the host; the principal is checked in code (ADR-0013).
        operator = route.function in OPERATOR_ROUTES | OPERATOR_TWINS
        ok = (status != 401 and status < 500) if operator else status == 200
        TALLY.check(AREA, ok, f"{route.method} {route.path} without a key: {status}")
    # The control: with the right key (header, then ?code=) every secured route reaches its function...
    for route in routes:
        if route.auth == "anonymous":
            continue
        for status in (send(host, route, headers={"x-functions-key": KEY}), send(host, route, code=KEY)):
            TALLY.check(AREA, status != 401, f"{route.method} {route.path} with the right key: {status}")
    # ... and what they write is seen by the same storage check that saw nothing before.
    written = stored_entities(azurite_connection, host.prefix)
    TALLY.check(
        AREA, sum(written.values()) > 0, f"authorised calls wrote nothing the check could see: {written}"
    )
