"""A small development host for the Settle function app (a development tool, never deployed).

``python -m devtools.host --port 7071`` serves ``function_app.app`` where Azure Functions Core Tools is
not installed. It is not the Functions host: it exists so a newcomer (and our tests) can reach the same
functions at the same URLs with nothing but Python and Azurite. ``.funcignore`` excludes ``devtools/``.

What it does, all derived from the app's own metadata (``app.get_functions()``), so a new function
needs no change here:

* Every invocation goes through the pinned ``azure-functions-runtime`` with the host's own messages
  (:mod:`devtools.calls`, :mod:`devtools.worker`), as in Azure; ``--direct`` calls the functions directly.
* Paths are decoded once before routes are matched, as the deployed host does (``%2F`` is a separator).

* HTTP functions at ``/{routePrefix}/{route}`` (prefix from ``host.json``, default ``api``), with route
  templates (``{id}``, ``{id:guid}``, ``{name?}``, ``{*rest}``), the declared methods (405 + ``Allow``
  otherwise), query, headers and body passed in a ``func.HttpRequest``. Repeated query parameters are
  joined with ``,`` in ``req.params`` (what the Functions host does); ``req.url`` keeps the full query
  string so a function can read every value with ``urllib.parse.parse_qs``.
* Auth levels: ``anonymous`` functions are open. ``function``/``admin`` functions (and the admin endpoint)
  need ``x-functions-key: <key>`` or ``?code=<key>`` when ``SETTLE_DEV_FUNCTION_KEY`` is set (401
  otherwise); when it is not set they are open and the host prints a warning at start. (Core Tools
  itself ignores auth levels locally; the key is there so a client's key handling can be exercised.)
* Timers on their NCRONTAB schedule (six fields, ``%SETTING%`` resolved from the settings), called with
  ``azure.functions.timer.TimerRequest(past_due=...)``; ``run_on_startup`` is honoured.
* ``POST /admin/functions/{name}``: invoke a timer, or a Service Bus trigger with a message built from
  JSON: ``{"input": ...}`` (the Functions host's shape: the body) or ``{"body": ..., "messageId": ...,
  "sessionId": ..., "correlationId": ..., "applicationProperties": {...}, "enqueuedTimeUtc": ...,
  "deliveryCount": ...}``. Answers 202 like the host, or 500 problem+json with the exception message.
* Service Bus triggers also receive from their topic/subscription when their connection setting
  (``ServiceBusConnection`` or ``ServiceBusConnection__fullyQualifiedNamespace``) is set: a real
  namespace or the emulator. Unset (the loopback default), the admin endpoint is their only input.
* ``local.settings.json`` ``Values`` become environment variables (never overriding ones already set);
  ``AzureWebJobs.<name>.Disabled=true`` disables a function as on Azure.

The parts live by concern: :mod:`devtools.appsettings` (settings, ``host.json``, ``%NAME%``),
:mod:`devtools.ncrontab` (schedules), :mod:`devtools.routing` (route templates, path decoding),
:mod:`devtools.functiontable` (the functions by trigger), :mod:`devtools.invocation` (calling a function
with its context), :mod:`devtools.busreceiver` (Service Bus), :mod:`devtools.timers` and
:mod:`devtools.serving` (HTTP on the wire). This module routes requests and runs ``main``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from pydantic import ValidationError

from common.invocation import http_deadline
from devtools import indexing
from devtools.appsettings import apply_settings, read_settings, resolve_expression, route_prefix
from devtools.busreceiver import BusReceiver, BusSource, admin_message_from_received
from devtools.calls import Calls, DirectCalls, FunctionFailed, HttpCall, RuntimeCalls
from devtools.functiontable import (
    FunctionTable,
    HttpFunction,
    ServiceBusFunction,
    TimerFunction,
    build_function_table,
)
from devtools.invocation import (
    AdminMessage,
    InvocationContext,
    TraceContext,
    build_service_bus_message,
    host_trace,
    invoke,
)
from devtools.ncrontab import Schedule
from devtools.routing import RouteTemplate, decode_path
from devtools.serving import PROBLEM, Answer, DrainingServer, make_server, problem
from devtools.timers import Timers
from devtools.worker import Worker

__all__ = [  # what callers (tests, devtools.run, the infra checks) import from here
    "PROBLEM",
    "AdminMessage",
    "Answer",
    "BusReceiver",
    "BusSource",
    "DevHost",
    "FunctionTable",
    "HttpFunction",
    "InvocationContext",
    "RouteTemplate",
    "Schedule",
    "ServiceBusFunction",
    "TimerFunction",
    "TraceContext",
    "admin_message_from_received",
    "apply_settings",
    "build_function_table",
    "build_service_bus_message",
    "decode_path",
    "host_trace",
    "invoke",
    "main",
    "read_settings",
    "resolve_expression",
    "route_prefix",
]

ROOT = Path(__file__).resolve().parent.parent
FUNCTION_KEY_SETTING = "SETTLE_DEV_FUNCTION_KEY"
BANNER = (
    "Settle development host: a development tool, NOT the Azure Functions host and never deployed. "
    "Use `func start` (Azure Functions Core Tools) where it is installed."
)

log = logging.getLogger("settle.devhost")
# Stopping waits for the requests in flight: each answers within the HTTP deadline (common/invocation.py),
# and this much more is allowed for the answer to be written.
DRAIN_MARGIN_S = 5.0


class DevHost:
    """The function table plus what serves it: routing, auth, timers and the admin endpoint."""

    def __init__(
        self,
        table: FunctionTable,
        *,
        prefix: str = "api",
        function_key: str | None = None,
        environ: Mapping[str, str] | None = None,
        calls: Calls | None = None,
    ) -> None:
        self.table = table
        self.calls: Calls = calls or DirectCalls()
        self.prefix = prefix
        self.function_key = function_key or None
        self.environ = os.environ if environ is None else environ
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: DrainingServer | None = None
        self.timers = Timers(table.timers, self.environ, self._stop, self.calls)

    @classmethod
    def from_module(
        cls,
        module: str = "function_app",
        *,
        host_json: Path = ROOT / "host.json",
        function_key: str | None = None,
        through_runtime: bool = True,
    ) -> DevHost:
        """Serve what the Python worker accepts of ``module``'s app (:func:`devtools.indexing.index`): a
        function the real worker rejects is refused here too (:class:`~devtools.indexing.IndexingFailed`).

        With ``through_runtime`` (the default) every invocation goes through the pinned runtime, started
        and loaded as the host starts it (:class:`devtools.calls.RuntimeCalls`)."""
        prefix = route_prefix(host_json)
        functions = indexing.index_module(module)
        table = build_function_table(functions, prefix)
        key = function_key if function_key is not None else os.environ.get(FUNCTION_KEY_SETTING)
        calls: Calls | None = None
        if through_runtime:
            script = indexing.script_of(module)
            worker = Worker(script, prefix=prefix)
            failures = worker.start_and_load()
            if failures:
                raise indexing.IndexingFailed(failures)
            calls = RuntimeCalls(worker)
        return cls(table, prefix=prefix, function_key=key, calls=calls)

    # -- HTTP --------------------------------------------------------------------------------------

    def _authorised(self, level: str, headers: Mapping[str, str], query: list[tuple[str, str]]) -> bool:
        if level == "anonymous" or self.function_key is None:
            return True
        given = headers.get("x-functions-key") or next((v for k, v in query if k == "code"), None)
        return given == self.function_key

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes, base: str) -> Answer:
        """Answer one HTTP request (``target`` is the request line's path and query)."""

        parts = urlsplit(target)
        # Decoded once, before routing, as the deployed host does: `%2F` becomes a path separator.
        path = decode_path(parts.path or "/")
        query = parse_qsl(parts.query, keep_blank_values=True)
        lower = {k.lower(): v for k, v in headers.items()}
        if path.rstrip("/").startswith("/admin/functions/"):
            return self._admin(method, path, lower, query, body)

        allowed: set[str] = set()
        for fn in self.table.http:
            route_params = fn.route.match(path)
            if route_params is None:
                continue
            if fn.methods and method not in fn.methods:
                allowed.update(fn.methods)
                continue
            if not self._authorised(fn.auth_level, lower, query):
                return Answer(401, [], b"", fn.name)
            params: dict[str, str] = {}
            for key, value in query:
                # The Functions host joins repeated values with ","; req.url keeps every value.
                params[key] = f"{params[key]},{value}" if key in params else value
            try:
                trace = host_trace(lower.get("traceparent"), lower.get("tracestate"))
                call = HttpCall(method, base + target, lower, params, route_params, body, trace)
                return self.calls.http(fn, call)
            except Exception as exc:
                return _failed(fn.name, exc)
        if allowed:
            answer = problem(405, "Method not allowed", f"{method} is not allowed on {path}.")
            answer.headers.append(("Allow", ", ".join(sorted(allowed))))
            return answer
        return problem(404, "Not found", f"No function is routed at {path}.")

    def _admin(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        query: list[tuple[str, str]],
        body: bytes,
    ) -> Answer:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if method != "POST":
            answer = problem(405, "Method not allowed", "The admin endpoint takes POST.")
            answer.headers.append(("Allow", "POST"))
            return answer
        if not self._authorised("admin", headers, query):
            return Answer(401, [], b"", name)
        if name not in self.table.names:
            return problem(404, "Not found", f"No function named {name!r}.")
        try:
            payload = AdminMessage.model_validate_json(body or b"{}")
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return problem(400, "Invalid input", f"{where}: {first['msg']}", field=where)
        try:
            if name in self.table.timers:
                self.run_timer(name, past_due=False)
            elif name in self.table.service_bus:
                self.calls.service_bus(self.table.service_bus[name], build_service_bus_message(payload))
            else:
                kind = self.table.other[name]
                return problem(400, "Not invocable", f"{name} has a {kind} the development host cannot feed.")
        except Exception as exc:
            return _failed(name, exc)
        return Answer(202, [], b"", name)

    # -- timers and serving ------------------------------------------------------------------------

    def run_timer(self, name: str, *, past_due: bool) -> None:
        """Invoke timer function ``name`` once (waits for a run of it in progress)."""
        self.timers.run(name, past_due=past_due)

    def start_timers(self) -> dict[str, Schedule]:
        """Run every timer on its schedule; returns the schedules (unresolvable ones are skipped)."""
        return self.timers.start()

    def make_server(self, host: str, port: int) -> DrainingServer:
        self._server = make_server(self.handle, host, port)
        return self._server

    def start_receivers(self) -> dict[str, BusSource]:
        """Feed each Service Bus trigger whose connection is configured (none by default: loopback)."""
        sources: dict[str, BusSource] = {}
        for fn in self.table.service_bus.values():
            try:
                source = BusSource.resolve(fn.binding, self.environ)
            except KeyError as exc:
                log.error("%s not fed from Service Bus: %s", fn.name, exc)
                continue
            if source is None:
                continue
            sources[fn.name] = source
            receiver = BusReceiver(fn, source, self._stop, self.calls)
            thread = threading.Thread(target=receiver.run, name=f"bus-{fn.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return sources

    def stop(self) -> None:
        """Stop accepting, answer the requests in flight (for up to the HTTP deadline and
        :data:`DRAIN_MARGIN_S`: each answers within the deadline), then stop timers and receivers."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()  # new connections are refused from here
            bound = http_deadline() + DRAIN_MARGIN_S
            left = self._server.drain(bound)
            if left:
                log.warning("%d request(s) still in flight after %.0f s: stopping anyway", left, bound)
        for thread in [*self._threads, *self.timers.threads]:
            thread.join(timeout=5)

    def describe(self, base: str) -> list[str]:
        """The lines printed at start: every function and where it is."""
        lines = []
        for fn in sorted(self.table.http, key=lambda f: f.route.template):
            methods = ",".join(fn.methods) or "*"
            route = fn.route.template.strip("/")
            path = f"/{self.prefix}/{route}" if self.prefix else f"/{route}"
            lines.append(f"  {fn.name}: [{methods}] {base}{path}  (auth: {fn.auth_level})")
        for timer in self.table.timers.values():
            lines.append(f"  {timer.name}: timerTrigger {timer.schedule_expression}")
        for bus in self.table.service_bus.values():
            lines.append(f"  {bus.name}: serviceBusTrigger (POST {base}/admin/functions/{bus.name})")
        for name, kind in self.table.other.items():
            lines.append(f"  {name}: {kind} (not hosted by the development host)")
        return lines


def _failed(name: str, exc: Exception) -> Answer:
    """A 500 problem naming the function's exception; its traceback goes to the log."""
    if isinstance(exc, FunctionFailed):
        log.error("function %s raised:\n%s", name, exc.stack_trace or exc.detail)
        detail = exc.detail
    else:
        log.error("function %s raised:\n%s", name, traceback.format_exc())
        detail = f"{type(exc).__name__}: {exc}"
    answer = problem(500, "Function failed", detail, function=name)
    answer.function = name
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7071)
    parser.add_argument("--settings", type=Path, default=ROOT / "local.settings.json")
    parser.add_argument("--no-timers", action="store_true", help="do not run timers on their schedules")
    parser.add_argument(
        "--direct",
        action="store_true",
        help="call the Python functions directly instead of through the pinned azure-functions-runtime",
    )
    parser.add_argument(
        "--app",
        default="function_app",
        help="module whose FunctionApp is served (found as the worker finds it)",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [dev-host] %(message)s", stream=sys.stdout)
    # host.json keeps Azure.Core at Warning; the SDKs' per-request INFO lines would drown ours.
    logging.getLogger("azure").setLevel(logging.WARNING)
    print(BANNER, flush=True)
    applied = apply_settings(read_settings(args.settings))
    log.info("settings: %d values from %s (environment variables win)", len(applied), args.settings)
    sys.path.insert(0, str(ROOT))
    module_name = args.app.partition(":")[0]
    try:
        devhost = DevHost.from_module(
            module_name, host_json=ROOT / "host.json", through_runtime=not args.direct
        )
    except indexing.IndexingFailed as exc:
        log.error("%s; the Functions host would serve none of them. Nothing is served.", exc)
        return 1
    if devhost.function_key is None:
        log.warning(
            "%s is not set: function-level HTTP functions are open (no key needed). "
            "Set it in local.settings.json to require x-functions-key / ?code=.",
            FUNCTION_KEY_SETTING,
        )
    server = devhost.make_server(args.host, args.port)
    base = f"http://{args.host}:{server.server_address[1]}"
    print("Functions:\n" + "\n".join(devhost.describe(base)), flush=True)
    if not args.no_timers:
        for name, schedule in devhost.start_timers().items():
            log.info(
                "timer %s: %s, next %s", name, schedule.expression, schedule.next_after(datetime.now(UTC))
            )
    receivers = devhost.start_receivers()
    for name, source in receivers.items():
        log.info("%s: receiving from %s", name, source.describe())
    for name in devhost.table.service_bus.keys() - receivers.keys():
        log.info(
            "%s: no Service Bus connection configured; feed it with POST /admin/functions/%s", name, name
        )

    stopping: list[threading.Thread] = []

    def _stop(*_: object) -> None:
        if not stopping:  # a second signal changes nothing: the first one's stop is under way
            stopping.append(threading.Thread(target=devhost.stop, name="devhost-stop", daemon=True))
            stopping[0].start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("listening on %s (Ctrl-C stops)", base)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.2)
    # The interpreter must not exit under a request: its invocation would fail with a 500 after its
    # storage write may have been applied. Stopping drains them first (DevHost.stop).
    _stop()
    stopping[0].join()
    server.server_close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
