"""Values Azure enforces that its type data does not: the type data says "string" or "int", Azure says
which strings and ints. Each rule names its source (the reference pages of /work/shared/reference, the
type data's own descriptions, or two public sources), so a rule can be re-checked, never remembered.

Values are traced (tests/infra/trace.py) to every literal they can take: literals, both branches of
``c ? a : b``, module parameters (what the caller passes, else the default), parameters of main.bicep
(their @allowed list, else their default) and members of literal arrays a resource loop iterates
(``for alert in settleLogAlerts: ... alert.severity`` checks each alert's severity). A value that cannot
be known statically is listed as skipped.

Diagnostic settings are checked against the categories each resource type has (``CATEGORIES``): an
account-level storage setting takes metrics only (request logs belong to the blob/table/queue/file
services), and a category name must exist on the resource the setting is scoped to.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.infra.bicep import Resource
from tests.infra.report import Finding, Report
from tests.infra.trace import Form, Tracer
from tests.infra.units import Unit
from tests.infra.wiring import Wiring, show

_DURATION = re.compile(r"^P(?!$)(?:(\d+)D)?(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")

TYPE_DATA = "the type data's description (tests/infra/bicep-types)"
METRIC_ALERT_TIMES = (
    "public Bicep modules' @allowed lists for Microsoft.Insights/metricAlerts (e.g. Azure Verified Modules' "
    "metric-alert module and Microsoft quickstart templates), and Azure Monitor's metric alert docs"
)


def seconds(duration: str) -> float | None:
    """An ISO 8601 duration (days, hours, minutes, seconds) in seconds; None if it is not one."""
    match = _DURATION.match(duration)
    if match is None:
        return None
    days, hours, minutes, secs = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0)


def _quote(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else str(v)


def one_of(*allowed: Any) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in allowed else f"is not one of {', '.join(str(a) for a in allowed)}"

    return check


def duration(at_most: str | None = None) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        length = seconds(v) if isinstance(v, str) else None
        if length is None:
            return "is not an ISO 8601 duration (PT30S, PT5M, PT1H, P1D)"
        if at_most is not None and length > (seconds(at_most) or 0):
            return f"is longer than {at_most}, the most Azure allows"
        return None

    return check


@dataclass(frozen=True)
class ValueRule:
    type: str  # resource type, any case
    path: tuple[str, ...]  # keys from the resource body
    check: Callable[[Any], str | None]  # the problem, or None
    source: str


RULES = [
    ValueRule(
        "Microsoft.ServiceBus/namespaces/topics/subscriptions",
        ("properties", "lockDuration"),
        duration(at_most="PT5M"),
        "the Service Bus type data (a queue's lockDuration: 'The maximum value for LockDuration is 5 "
        "minutes'); for subscriptions, the Azure SDK for Java (withMessageLockDurationInSeconds: 'the "
        "maximum allowed value is 300 seconds') and the Azure Ruby SDK (Subscription#lock_duration: "
        "'Range: 0 - 5 minutes')",
    ),
    ValueRule(
        "Microsoft.Insights/scheduledQueryRules",
        ("properties", "severity"),
        one_of(0, 1, 2, 3, 4),
        f"{TYPE_DATA}: 'Should be an integer between [0-4]'",
    ),
    ValueRule(
        "Microsoft.Insights/scheduledQueryRules",
        ("properties", "windowSize"),
        duration(),
        f"{TYPE_DATA}: 'in ISO 8601 duration format'",
    ),
    ValueRule(
        "Microsoft.Insights/scheduledQueryRules",
        ("properties", "evaluationFrequency"),
        duration(),
        f"{TYPE_DATA}: 'represented in ISO 8601 duration format'",
    ),
    ValueRule(
        "Microsoft.Insights/metricAlerts",
        ("properties", "severity"),
        one_of(0, 1, 2, 3, 4),
        f"{TYPE_DATA}: 'Alert severity {{0, 1, 2, 3, 4}}'",
    ),
    ValueRule(
        "Microsoft.Insights/metricAlerts",
        ("properties", "evaluationFrequency"),
        one_of("PT1M", "PT5M", "PT15M", "PT30M", "PT1H"),
        METRIC_ALERT_TIMES,
    ),
    ValueRule(
        "Microsoft.Insights/metricAlerts",
        ("properties", "windowSize"),
        one_of("PT1M", "PT5M", "PT15M", "PT30M", "PT1H", "PT6H", "PT12H", "P1D"),
        METRIC_ALERT_TIMES,
    ),
    ValueRule(
        "Microsoft.Web/sites",
        ("properties", "functionAppConfig", "scaleAndConcurrency", "instanceMemoryMB"),
        one_of(512, 2048, 4096),
        "shared/reference/azure-practice.md §1.2 and checklist 4 (Microsoft's Flex Consumption samples: "
        "@allowed([512, 2048, 4096]) instanceMemoryMB)",
    ),
]


@dataclass(frozen=True)
class Categories:
    metrics: frozenset[str]
    logs: frozenset[str]
    groups: frozenset[str]
    source: str


_STORAGE_SERVICE_LOGS = frozenset({"StorageRead", "StorageWrite", "StorageDelete"})
_STORAGE_METRICS = frozenset({"Transaction", "Capacity"})
_STORAGE_SOURCE = (
    "Azure Monitor reference: 'Supported metrics - Microsoft.Storage/storageAccounts' (categories Capacity "
    "and Transaction, no log categories) and 'Supported logs - Microsoft.Storage/storageAccounts/"
    "blobServices' (StorageRead, StorageWrite, StorageDelete); allLogs is the category group of every "
    "resource with logs (Azure Monitor diagnostic settings)"
)
# Resource types whose diagnostic categories are verified; a setting scoped to another type is skipped.
CATEGORIES = {
    "microsoft.storage/storageaccounts": Categories(
        _STORAGE_METRICS, frozenset(), frozenset(), _STORAGE_SOURCE
    ),
    **{
        f"microsoft.storage/storageaccounts/{service}": Categories(
            _STORAGE_METRICS, _STORAGE_SERVICE_LOGS, frozenset({"allLogs"}), _STORAGE_SOURCE
        )
        for service in ("blobservices", "tableservices", "queueservices", "fileservices")
    },
}


class Values:
    def __init__(self, units: dict[str, Unit]) -> None:
        self.units = units
        self.wiring = Wiring(None, units)  # only to follow reads to the resources they come from
        self.tracer: Tracer = self.wiring.tracer
        self.report = Report()

    def literals(self, form: Form, loops: dict[str, tuple[str, list[Form]]]) -> list[tuple[Any, str]] | None:
        """Every literal ``form`` can be, each with where it comes from; None when one is not static."""
        kind = form[0]
        if kind == "lit":
            return [(form[1], "")]
        if kind == "op" and form[1] == "?:":
            first, second = self.literals(form[3], loops), self.literals(form[4], loops)
            return None if first is None or second is None else first + second
        if kind == "param" and form[1] in self.units:
            param = self.units[form[1]].file.params.get(form[2])
            allowed = param.decorators.get("allowed") if param is not None else None
            if allowed and isinstance(allowed[0], list):
                return [(v, f"@allowed of {form[2]}") for v in allowed[0]]
            if param is not None and param.has_default:
                return self.literals(self.tracer.trace(self.units[form[1]], param.default), loops)
            return None
        if kind == "member" and form[1][0] == "loop" and form[1][1] in loops:
            label, items = loops[form[1][1]]
            found: list[tuple[Any, str]] = []
            for i, item in enumerate(items):
                current, path = item, f"{label}[{i}]"
                for step, key in form[2]:
                    if step != "prop" or current[0] != "object":
                        return None
                    members = dict(current[1])
                    if key not in members:
                        return None
                    current, path = members[key], f"{path}.{key}"
                inner = self.literals(current, loops)
                if inner is None:
                    return None
                found += [(v, where or path) for v, where in inner]
            return found
        return None

    def loops(self, unit: Unit, res: Resource) -> dict[str, tuple[str, list[Form]]]:
        if res.loop is None:
            return {}
        iterable = self.tracer.trace(unit, res.loop.iterable)
        if iterable[0] != "array":
            return {}
        return {res.loop.item: (res.loop.iterable.text, list(iterable[1]))}

    def run(self) -> Report:
        for unit in self.units.values():
            for res in unit.file.resources:
                if res.existing or not isinstance(res.body, dict):
                    continue
                for rule in RULES:
                    if res.type.lower() == rule.type.lower():
                        self.check_rule(unit, res, rule)
                if res.type.lower() == "microsoft.insights/diagnosticsettings":
                    self.check_categories(unit, res)
        return self.report

    def check_rule(self, unit: Unit, res: Resource, rule: ValueRule) -> None:
        item: Any = res.body
        for key in rule.path:
            if not isinstance(item, dict) or key not in item:
                return
            item = item[key]
        path = ".".join(rule.path)
        loop_vars = (
            frozenset({res.loop.item} | ({res.loop.index} if res.loop.index else set()))
            if res.loop
            else frozenset()
        )
        form = self.tracer.trace(unit, item, loop_vars)
        values = self.literals(form, self.loops(unit, res))
        if values is None:
            self.report.skipped.append(
                Finding(unit.rel, res.line, res.symbol, path, f"{show(form)}: not static, rule not checked")
            )
            return
        self.report.properties += len(values)
        for v, where in values:
            problem = rule.check(v)
            if problem is not None:
                origin = f" ({where})" if where else ""
                self.report.errors.append(
                    Finding(
                        unit.rel,
                        res.line,
                        res.symbol,
                        path,
                        f"{_quote(v)}{origin} {problem} (source: {rule.source})",
                    )
                )

    def check_categories(self, unit: Unit, res: Resource) -> None:
        scope = res.body.get("scope")
        target = self.wiring.target(self.tracer.trace(unit, scope)) if scope is not None else None
        if target is None:
            return
        scope_type = target.res.type.lower()
        known = CATEGORIES.get(scope_type)
        if known is None:
            self.report.skipped.append(
                Finding(
                    unit.rel,
                    res.line,
                    res.symbol,
                    "properties",
                    f"no verified categories for {target.res.type}",
                )
            )
            return
        properties = res.body.get("properties", {})
        for list_name in ("metrics", "logs"):
            entries = properties.get(list_name, []) if isinstance(properties, dict) else []
            for i, entry in enumerate(entries if isinstance(entries, list) else []):
                if not isinstance(entry, dict):
                    continue
                for key in ("category", "categoryGroup"):
                    if key not in entry:
                        continue
                    path = f"properties.{list_name}[{i}].{key}"
                    v = entry[key]
                    problem: str | None
                    if list_name == "logs" and not (known.logs or known.groups):
                        problem = (
                            f"{target.res.type} has no resource logs (they are settings of its services)"
                        )
                    elif list_name == "metrics":
                        problem = (
                            None
                            if v in known.metrics
                            else f"{_quote(v)} is not a metric category of {target.res.type}"
                        )
                    else:
                        allowed = known.groups if key == "categoryGroup" else known.logs
                        problem = (
                            None if v in allowed else f"{_quote(v)} is not a log {key} of {target.res.type}"
                        )
                    if problem is not None:
                        self.report.errors.append(
                            Finding(
                                unit.rel, res.line, res.symbol, path, f"{problem} (source: {known.source})"
                            )
                        )


def check_values(units: dict[str, Unit]) -> Report:
    return Values(units).run()
