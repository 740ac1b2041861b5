"""Fixtures shared by every suite: Azurite, the app's functions, and calling them like the worker does.

Azurite is started once per session (in memory, on a free port) unless ``SETTLE_TEST_AZURITE`` already
holds a connection string (``.ci/run`` starts one for the whole run). Each session uses its own table
prefix; ``fresh_tables`` gives a test an empty set of tables of its own.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import azure.functions as func
import pytest
from hypothesis import HealthCheck, settings

from common import runtime
from devtools.azurite import Azurite

# Property tests judge behaviour, never speed: Hypothesis's per-example deadline (200 ms) and its "too slow"
# health check fail a correct test on a busy machine (CI saw a 400 ms example of test_keys.py). Timing
# belongs to `make bench`. A test's own @settings still sets its sizes.
settings.register_profile("settle", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("settle")


@pytest.fixture(scope="session")
def azurite_connection() -> Iterator[str]:
    given = os.environ.get("SETTLE_TEST_AZURITE")
    if given:
        yield given
        return
    with Azurite(services=("blob", "queue", "table")) as azurite:
        yield azurite.connection_string


def _use_tables(connection: str, prefix: str) -> None:
    os.environ["SETTLE_TABLES"] = connection
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    os.environ.pop("SETTLE_TABLES__tableServiceUri", None)
    runtime.reset()


def new_prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session", autouse=True)
def settle_tables(azurite_connection: str) -> Iterator[str]:
    """Point the app at the test Azurite with a prefix of this session's own."""
    prefix = new_prefix()
    _use_tables(azurite_connection, prefix)
    yield prefix
    runtime.reset()


@pytest.fixture
def fresh_tables(azurite_connection: str, settle_tables: str) -> Iterator[str]:
    """Empty tables for one test (a new prefix); the session's prefix is restored afterwards."""
    prefix = new_prefix()
    _use_tables(azurite_connection, prefix)
    yield prefix
    _use_tables(azurite_connection, settle_tables)


@pytest.fixture(scope="session")
def functions() -> dict[str, Any]:
    """The app's functions by name, as the Python worker indexes and accepts them (once per process:
    ``get_functions`` may run once per app object; a function the worker rejects fails here)."""
    from devtools import indexing

    return {f.name: f.sdk_function for f in indexing.index()}


@dataclass
class HttpResult:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


@dataclass
class Caller:
    functions: dict[str, Any]

    def __call__(
        self,
        name: str,
        body: Any = None,
        *,
        method: str | None = None,
        raw: bytes | None = None,
        params: dict[str, str] | None = None,
        route_params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> HttpResult:
        """Invoke HTTP function ``name`` the way the Functions worker does."""
        fn = self.functions[name]
        trigger = fn.get_trigger()
        methods = [str(getattr(m, "value", m)) for m in (trigger.methods or ["POST"])]
        verb = method or methods[0]
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        route = trigger.route or name
        req = func.HttpRequest(
            verb,
            f"http://localhost/api/{route}",
            headers={"content-type": "application/json", **(headers or {})},
            params=params or {},
            route_params=route_params or {},
            body=payload,
        )
        resp: func.HttpResponse = fn.get_user_function()(req)
        hdrs = {str(k).lower(): str(v) for k, v in resp.headers.items()}
        if resp.mimetype:
            hdrs.setdefault("content-type", resp.mimetype)
        return HttpResult(resp.status_code, hdrs, resp.get_body())


@pytest.fixture
def call(functions: dict[str, Any]) -> Caller:
    return Caller(functions)
