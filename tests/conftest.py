"""Fixtures shared by every suite: Azurite, the app's functions, and calling them like the worker does.

Storage is opt-in. A test that needs Table Storage requests ``settle_tables`` (a module says so once:
``pytestmark = pytest.mark.usefixtures("settle_tables")``), or a fixture that depends on it: ``call``,
``resolve``, ``fresh_tables``, and every fixture built on ``azurite_connection``. Such a test is marked
``storage`` at collection. ``make test-unit`` runs the others with no Azurite at all, except the few
marked ``heavy`` (seconds a test: they run deploy scripts, pip, the CLI or the worker's indexer).

Azurite is started once per session (in memory, on a free port), at the first test that needs it, unless
``SETTLE_TEST_AZURITE`` already holds a connection string (``.ci/run`` starts one for the whole run).
Each session uses its own table prefix; ``fresh_tables`` gives a test an empty set of tables of its own.

A test not marked ``storage`` that reaches Table Storage anyway fails at once, naming itself (the
app's table clients carry :data:`STORAGE_GUARD`; until a storage test runs they point at a closed port),
rather than passing only when another test happened to start Azurite first, or waiting on retries.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from azure.core.pipeline.policies import SansIOHTTPPolicy

from common import runtime
from common.settings import AZURITE_ACCOUNT_KEY
from tests.support.tiers import TierIndex

if TYPE_CHECKING:
    import azure.functions as func

    from tests.support.children import HostProcess, StartHost

# Imported where they are used, not here: under pytest-xdist the controller, which runs no test, loads this
# module too, and every worker waits for its start (azure.functions, devtools.azurite, Hypothesis).


def _property_tests_judge_behaviour_never_speed() -> None:
    """Property tests judge behaviour, never speed: Hypothesis's per-example deadline (200 ms) and its "too
    slow" health check fail a correct test on a busy machine (CI saw a 400 ms example of test_keys.py).
    Timing belongs to `make bench`. A test's own @settings still sets its sizes."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("settle", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("settle")


def _runs_no_test(config: pytest.Config) -> bool:
    """The pytest-xdist controller: it hands the tests to its workers (each of which runs this conftest)."""
    return bool(getattr(config.option, "numprocesses", None)) and "PYTEST_XDIST_WORKER" not in os.environ


# Where the app's tables point before any storage test ran: the discard port, closed on any machine
# that runs the tests, so a stray request is refused at once instead of reaching a developer's Azurite.
NO_STORAGE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZURITE_ACCOUNT_KEY};TableEndpoint=http://127.0.0.1:9/devstoreaccount1;"
)
STORAGE_MARK = "storage"
HEAVY_MARK = "heavy"
STORAGE_FIXTURE = "azurite_connection"
TIERS_PLUGIN = "settle-tiers"


class StorageNotRequested(RuntimeError):
    """A test reached Table Storage without asking for it."""


class StorageGuard(SansIOHTTPPolicy[Any, Any]):
    """Refuses every storage request of a test not marked ``storage`` (one per attempt: before the SDK's
    retries could wait), and remembers it, so the test fails even if the app answered the error as a 503."""

    def __init__(self) -> None:
        self.test: str | None = None  # the running test that may not reach storage; None: allowed
        self.refused: list[str] = []

    def begin(self, item: pytest.Item) -> None:
        self.test = None if item.get_closest_marker(STORAGE_MARK) else item.nodeid
        self.refused = []

    def on_request(self, request: Any) -> None:
        if self.test is None:
            return
        url = str(request.http_request.url).split("?", 1)[0]
        self.refused.append(url)
        raise StorageNotRequested(f"{self.test} reached Table Storage ({url}) but is not a storage test")

    def complaint(self) -> str | None:
        if not self.refused:
            return None
        return (
            f"this test reached Table Storage {len(self.refused)} time(s) (first: {self.refused[0]}) but "
            'does not request it: add pytestmark = pytest.mark.usefixtures("settle_tables") to its '
            "module, or request settle_tables (or call, fresh_tables) in the test"
        )


STORAGE_GUARD = StorageGuard()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{STORAGE_MARK}: needs Table Storage (Azurite); set on every test that requests "
        f"{STORAGE_FIXTURE}, or on a module that starts an Azurite of its own (make test-unit skips them)",
    )
    config.addinivalue_line(
        "markers",
        f"{HEAVY_MARK}: seconds a test (runs other programs: deploy scripts, pip, the CLI, the worker's "
        "indexer; or checks a whole copy of infra/); make test runs them, make test-unit does not",
    )
    _use_tables(NO_STORAGE, "settlenostorage")
    if not _runs_no_test(config):  # before any test module is imported
        _property_tests_judge_behaviour_never_speed()
    # A tier (-m) is chosen without importing the modules it would leave out: tests/support/tiers.py.
    config.pluginmanager.register(TierIndex(config), TIERS_PLUGIN)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if STORAGE_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(STORAGE_MARK)
    # Before -m deselects: the tier index records every test's marks as -m is about to read them.
    tiers = config.pluginmanager.get_plugin(TIERS_PLUGIN)
    if isinstance(tiers, TierIndex):
        tiers.observe(items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    STORAGE_GUARD.begin(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    complaint = STORAGE_GUARD.complaint()
    if complaint:
        pytest.fail(complaint)


@pytest.fixture(scope="session")
def azurite_connection() -> Iterator[str]:
    given = os.environ.get("SETTLE_TEST_AZURITE")
    if given:
        yield given
        return
    from devtools.azurite import Azurite

    with Azurite(services=("blob", "queue", "table")) as azurite:
        yield azurite.connection_string


def _use_tables(connection: str, prefix: str) -> None:
    os.environ["SETTLE_TABLES"] = connection
    os.environ["SETTLE_TABLE_PREFIX"] = prefix
    os.environ.pop("SETTLE_TABLES__tableServiceUri", None)
    runtime.reset()


_reset = runtime.reset


def _reset_guarded(*, policies: Sequence[Any] = (), client_options: Mapping[str, Any] | None = None) -> None:
    """``runtime.reset`` in the tests: whatever policies a test passes (fault injection, timelines), the
    app's table clients keep the guard too."""
    _reset(policies=[STORAGE_GUARD, *policies], client_options=client_options)


runtime.reset = _reset_guarded


def new_prefix() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def settle_tables(azurite_connection: str) -> Iterator[str]:
    """Point the app at the test Azurite with a prefix of this session's own (requested by every test
    that needs storage, directly, through a module's ``pytestmark``, or through another fixture)."""
    prefix = new_prefix()
    _use_tables(azurite_connection, prefix)
    yield prefix
    _use_tables(NO_STORAGE, "settlenostorage")


@pytest.fixture(autouse=True)
def _storage_tests_find_the_session_tables(request: pytest.FixtureRequest) -> None:
    """A test that asks for Azurite only (for a process of its own, a client of its own) still finds the
    app pointed at it, as every test did before storage was opt-in. Nothing for a pure test."""
    if STORAGE_FIXTURE in request.fixturenames:
        request.getfixturevalue("settle_tables")


@pytest.fixture
def fresh_tables(azurite_connection: str, settle_tables: str) -> Iterator[str]:
    """Empty tables for one test (a new prefix); the session's prefix is restored afterwards."""
    prefix = new_prefix()
    _use_tables(azurite_connection, prefix)
    yield prefix
    _use_tables(azurite_connection, settle_tables)


@pytest.fixture(scope="module")
def start_host(azurite_connection: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartHost]:
    """Start development hosts for a module (``tests/support/children.py``), on the test Azurite, each with
    a table prefix of its own; every one is stopped at the end."""
    from tests.support.children import start_devhost
    from tests.support.devhost import host_environment

    started: list[HostProcess] = []

    def start(*, app: str = "function_app", env: dict[str, str] | None = None) -> HostProcess:
        environ = host_environment(azurite_connection, new_prefix(), **(env or {}))
        host = start_devhost(tmp_path_factory.mktemp("devhost"), environ, "--app", app)
        started.append(host)
        return host

    yield start
    for host in started:
        host.stop()


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
        import azure.functions as func

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
def call(functions: dict[str, Any], settle_tables: str) -> Caller:
    return Caller(functions)
