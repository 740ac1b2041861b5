"""First start: mistakes that deploy cleanly and then leave the app unable to start or to run its timers.

The function metadata comes from the Python worker's own indexer (devtools/indexing.py): the schedules
and connection names the host will read, not a list kept here.

* Every timer schedule the host may be given (the ``%SETTING%`` each timer binding names, set in the
  app settings; the Bicep parameter defaults and ``main.parameters.json`` values of schedule parameters)
  is a six-field NCRONTAB expression (``second minute hour day month day-of-week``: the form the host's
  NCrontab accepts on Flex Consumption; a five-field cron or prose fails the timer listener at start).
  The parser is the development host's (``devtools.host.Schedule``), which serves the timers locally.
* Every storage account the app needs is reachable: a firewall that denies by default
  (``networkAcls.defaultAction: 'Deny'``) only together with the site's virtual network integration
  (``virtualNetworkSubnetId``) and a private endpoint to that account. Without them the host cannot
  reach ``AzureWebJobsStorage`` and nothing starts (or the data account answers every request 403).
* Every app setting that names a connection (``X__serviceUri``, ``X__fullyQualifiedNamespace``,
  ``X__clientId``, ``X__credential``, ...) belongs to a connection something reads: a binding's
  ``connection`` in the indexed metadata, the host's ``AzureWebJobsStorage``, or a setting the code reads
  (tests/infra/codescan.py). A typo there leaves the real connection without its identity settings.
* No setting makes the worker set up telemetry of its own beside Settle's (``WORKER_TELEMETRY``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from devtools import indexing
from devtools.host import Schedule
from tests.infra.bicep import Expr
from tests.infra.codescan import scan_code
from tests.infra.report import Finding, Report
from tests.infra.units import Unit
from tests.infra.wiring import SITE, app_settings

STORAGE = "microsoft.storage/storageaccounts"
PRIVATE_ENDPOINT = "microsoft.network/privateendpoints"
CONNECTION_SUFFIXES = (
    "__serviceUri",
    "__fullyQualifiedNamespace",
    "__clientId",
    "__credential",
    "__blobServiceUri",
    "__queueServiceUri",
    "__tableServiceUri",
    "__accountName",
)
HOST_CONNECTIONS = {"AzureWebJobsStorage"}
_SETTING = re.compile(r"^%([^%]+)%$")


def _schedule_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return None  # computed at deployment: traced through the parameter it comes from
    try:
        Schedule.parse(value)
    except ValueError as exc:
        return f"{value!r} is not a six-field NCRONTAB expression ({exc}); the timer would never start"
    return None


def _sites(units: dict[str, Unit]) -> list[tuple[Unit, Any]]:
    return [
        (unit, res)
        for unit in units.values()
        for res in unit.file.resources
        if res.type.lower() == SITE and not res.existing
    ]


# App settings with which the Python worker sets up OpenTelemetry / Azure Monitor itself, beside Settle's
# own pipeline (common/telemetry.py): a second exporter, and an ERROR at start where it cannot.
WORKER_TELEMETRY = {
    "PYTHON_ENABLE_OPENTELEMETRY": "the worker then configures OpenTelemetry itself (and logs an error at "
    "start without its own connection string); Settle reads the host's trace context from "
    "context.trace_context",
    "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY": "the worker then configures the Azure Monitor distro "
    "itself: a second exporter beside Settle's",
}


def check_first_start(units: dict[str, Unit], root: Path) -> Report:
    report = Report()
    functions = indexing.index()
    _check_schedules(units, root, functions, report)
    _check_storage_reachable(units, report)
    _check_connection_names(units, functions, report)
    for unit, site in _sites(units):
        for name in sorted(set(app_settings(site, unit)) & set(WORKER_TELEMETRY)):
            report.errors.append(
                Finding(unit.rel, site.line, site.symbol, f"appSettings.{name}", WORKER_TELEMETRY[name])
            )
    return report


def _check_schedules(
    units: dict[str, Unit], root: Path, functions: tuple[indexing.IndexedFunction, ...], report: Report
) -> None:
    timer_settings = {}
    for fn in functions:
        if fn.trigger_type == "timerTrigger":
            match = _SETTING.match(str(fn.trigger["schedule"]))
            if match:
                timer_settings[match.group(1)] = fn.name
            elif problem := _schedule_problem(fn.trigger["schedule"]):
                report.errors.append(Finding("function_app.py", 0, fn.name, "schedule", problem))
    for unit, site in _sites(units):
        settings = app_settings(site, unit)
        for setting, function in sorted(timer_settings.items()):
            if setting not in settings:
                report.errors.append(
                    Finding(
                        unit.rel,
                        site.line,
                        site.symbol,
                        "appSettings",
                        f"{setting}: the schedule of timer {function} (%{setting}%) is not set; "
                        "the host cannot start the timer",
                    )
                )
            elif problem := _schedule_problem(settings[setting]):
                path = f"appSettings.{setting}"
                report.errors.append(Finding(unit.rel, site.line, site.symbol, path, problem))
    for unit in units.values():
        for param in unit.file.params.values():
            problem = _schedule_problem(param.default) if "schedule" in param.name.lower() else None
            if param.has_default and problem:
                report.errors.append(Finding(unit.rel, param.line, param.name, "default", problem))
    parameters = root / "main.parameters.json"
    if parameters.exists():
        values = json.loads(parameters.read_text(encoding="utf-8")).get("parameters", {})
        for name, entry in values.items():
            given = entry.get("value") if isinstance(entry, dict) else None
            if "schedule" in name.lower() and (problem := _schedule_problem(given)):
                report.errors.append(Finding("main.parameters.json", 0, name, "value", problem))


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _source(value: Any) -> str:
    return str(getattr(value, "text", value))


def _check_storage_reachable(units: dict[str, Unit], report: Report) -> None:
    resources = [(unit, res) for unit in units.values() for res in unit.file.resources if not res.existing]
    integrated = any(
        _get(res.body, "properties", "virtualNetworkSubnetId") is not None
        for _, res in resources
        if res.type.lower() == SITE
    )
    endpoints = [res for _, res in resources if res.type.lower() == PRIVATE_ENDPOINT]
    for unit, res in resources:
        if res.type.lower() != STORAGE:
            continue
        action = _get(res.body, "properties", "networkAcls", "defaultAction")
        if isinstance(action, Expr) or str(action or "Allow").lower() != "deny":
            continue
        linked = any(res.symbol in json.dumps(ep.body, default=_source) for ep in endpoints)
        missing = [
            what
            for what, present in (
                ("the function app's virtual network integration (virtualNetworkSubnetId)", integrated),
                ("a private endpoint to this account", linked),
            )
            if not present
        ]
        if missing:
            report.errors.append(
                Finding(
                    unit.rel,
                    res.line,
                    res.symbol,
                    "properties.networkAcls.defaultAction",
                    "'Deny' without " + " and ".join(missing) + ": the app cannot reach this account "
                    "(for the host's account, AzureWebJobsStorage: nothing starts)",
                )
            )


def _check_connection_names(
    units: dict[str, Unit], functions: tuple[indexing.IndexedFunction, ...], report: Report
) -> None:
    bindings = {str(b["connection"]) for fn in functions for b in fn.bindings if b.get("connection")}
    read = set(scan_code().reads)
    known = bindings | HOST_CONNECTIONS
    for unit, site in _sites(units):
        settings = app_settings(site, unit)
        for name in sorted(settings):
            suffix = next((s for s in CONNECTION_SUFFIXES if name.endswith(s)), None)
            if suffix is None:
                continue
            prefix = name[: -len(suffix)]
            if prefix in known or name in read or any(r.startswith(prefix + "__") for r in read):
                continue
            report.errors.append(
                Finding(
                    unit.rel,
                    site.line,
                    site.symbol,
                    f"appSettings.{name}",
                    f"names the connection {prefix!r}, which no binding uses (bindings: "
                    f"{', '.join(sorted(bindings)) or 'none'}) and neither the host nor the code reads",
                )
            )
        for connection in sorted(bindings):
            for suffix in ("__fullyQualifiedNamespace", "__credential", "__clientId"):
                if f"{connection}{suffix}" not in settings and connection not in settings:
                    report.errors.append(
                        Finding(
                            unit.rel,
                            site.line,
                            site.symbol,
                            "appSettings",
                            f"{connection}{suffix}: the binding connection {connection} (indexed metadata) "
                            "needs it (identity-based)",
                        )
                    )
