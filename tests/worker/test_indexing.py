"""The app as the deployed host's Python worker sees it, checked by the worker's own code.

Given ``function_app.py`` with production settings, when the worker's indexer
(``azure_functions_runtime.loader``, through :mod:`devtools.indexing`) validates each function, then it
accepts every one; the bindings it reports to the host (routes, methods, auth levels, schedules, topics,
connections) are the reviewed ones in ``host_bindings.json``; and the development host serves exactly
those functions, so nothing runs locally that the host would refuse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools import host, indexing

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("host_bindings.json")
# What the host reads from each trigger binding (the rest, such as "direction", is fixed by the SDK).
READ_BY_HOST = (
    "type",
    "route",
    "methods",
    "authLevel",
    "schedule",
    "runOnStartup",
    "useMonitor",
    "topicName",
    "subscriptionName",
    "queueName",
    "connection",
    "isSessionsEnabled",
)


def _production_env() -> dict[str, str]:
    """This process's environment less every Settle / test setting: what a fresh Azure instance has."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SETTLE_", "AzureWebJobs", "DEVHOST_")) and k != "PYTHONPATH"
    }


def test_the_workers_indexer_accepts_every_function_with_production_settings() -> None:
    script = textwrap.dedent(
        """
        from devtools import indexing
        try:
            functions = indexing.index()
        except indexing.IndexingFailed as exc:
            raise SystemExit(str(exc))
        print(len(functions))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=_production_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert int(run.stdout.split()[-1]) >= 40


def _bindings_table(functions: tuple[indexing.IndexedFunction, ...]) -> dict[str, dict[str, object]]:
    return {
        f.name: {key: f.trigger[key] for key in READ_BY_HOST if key in f.trigger}
        for f in sorted(functions, key=lambda f: f.name)
    }


def test_every_binding_the_host_reads_is_the_reviewed_one() -> None:
    """The one place a route, method, auth level, schedule, topic or connection name is asserted.

    After an intended change, regenerate with ``SETTLE_UPDATE_BINDINGS=1`` and review the diff."""
    table = _bindings_table(indexing.index())
    if os.environ.get("SETTLE_UPDATE_BINDINGS") == "1":
        EXPECTED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert table == json.loads(EXPECTED.read_text(encoding="utf-8"))


def test_http_functions_have_the_only_signature_the_worker_accepts() -> None:
    import inspect
    import typing

    import azure.functions as func

    for f in indexing.index():
        if f.trigger_type != "httpTrigger":
            continue
        parameters = list(inspect.signature(f.user_function).parameters)
        hints = typing.get_type_hints(f.user_function)
        # context: the worker passes its invocation context (the host's trace context) by that name.
        expected = {"req": func.HttpRequest, "context": func.Context, "return": func.HttpResponse}
        assert parameters in (["req"], ["req", "context"]), f.name
        assert hints == {name: expected[name] for name in [*parameters, "return"]}, f.name


# The console's static files make no span and touch no storage: nothing of theirs joins a trace.
NO_SPANS = {"console", "console_asset"}


def test_every_function_that_makes_spans_takes_the_invocation_context_for_its_trace() -> None:
    import inspect

    for f in indexing.index():
        if f.name not in NO_SPANS:
            assert "context" in inspect.signature(f.user_function).parameters, f.name


def test_the_development_host_serves_exactly_what_the_worker_accepted() -> None:
    functions = indexing.index()
    table = host.build_function_table(functions, "api", environ={})
    assert table.names == {f.name for f in functions}
    assert not table.other
    served = {fn.name: (fn.route.template, fn.methods, fn.auth_level) for fn in table.http}
    for f in functions:
        if f.trigger_type == "httpTrigger":
            trigger = f.trigger
            methods = tuple(m.upper() for m in trigger["methods"])
            assert served[f.name] == (trigger["route"], methods, trigger["authLevel"].lower())
    assert {name: t.schedule_expression for name, t in table.timers.items()} == {
        f.name: f.trigger["schedule"] for f in functions if f.trigger_type == "timerTrigger"
    }


BAD_APP = """
from __future__ import annotations
import azure.functions as func
from pydantic import BaseModel

app = func.FunctionApp()


class Answer(BaseModel):
    ok: bool


@app.route(route="fine")
def fine(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("ok")


@app.route(route="typed")
def typed(req: func.HttpRequest) -> Answer:  # what guard() once exposed: the worker refuses it
    return Answer(ok=True)
"""


@pytest.fixture
def bad_app(tmp_path: Path) -> Path:
    script = tmp_path / "bad_function_app.py"
    script.write_text(BAD_APP, encoding="utf-8")
    return script


def test_a_function_the_worker_rejects_fails_the_index_naming_it(bad_app: Path) -> None:
    with pytest.raises(indexing.IndexingFailed) as raised:
        indexing.index(bad_app)
    assert set(raised.value.failures) == {"typed"}
    assert 'return annotation "Answer" does not match binding type "http"' in raised.value.failures["typed"]


def test_the_development_host_refuses_to_serve_an_app_the_worker_rejects(bad_app: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devtools.host", "--port", "0", "--app", bad_app.stem, "--no-timers"],
        cwd=ROOT,
        env={**_production_env(), "PYTHONPATH": str(bad_app.parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert "rejects 1 function(s)" in run.stdout and "typed:" in run.stdout


def test_the_runtime_the_tests_drive_is_the_one_requirements_txt_pins_for_azure() -> None:
    import re
    import sys
    from importlib.metadata import version

    pins = re.findall(
        r"^azure-functions-runtime==([\w.]+)\s*$", (ROOT / "requirements.txt").read_text(), flags=re.M
    )
    assert len(pins) == 1, "requirements.txt must pin azure-functions-runtime==X (Azure then runs exactly X)"
    assert version("azure-functions-runtime") == pins[0]
    assert sys.version_info[:2] == (3, 13)  # the runtime's Python, and the app's in infra/
