"""Deployment rules a type cannot express: what makes a Flex Consumption + Service Bus deployment fail.

- A Flex Consumption plan (sku FC1) is kind ``functionapp`` (or ``functionapp,linux``) and ``reserved``
  (Linux); ``elastic`` is an Elastic Premium plan (shared/reference/azure-practice.md §1.1 and the Flex
  samples it cites).
- The function app runs on that plan, is kind ``functionapp,linux`` and has its ``functionAppConfig``
  (deployment storage, runtime, scale).
- The deployment storage URL is a storage account's blob endpoint immediately followed by the name of a
  blob container of that same account, and Flex reads it with the identity the app is assigned.
- Service Bus creates the subscriptions of one topic and the rules of one subscription one at a time
  (concurrent creation under one parent is answered with 409 Conflict): siblings are chained with
  ``dependsOn``, and a loop whose iterations share one parent has ``@batchSize(1)``.
- The ``HANDOFF_DUPLICATE_DETECTION`` app setting is ``'true'`` exactly when the endpoint topics are
  created with ``requiresDuplicateDetection``: both come from one expression.
"""

from __future__ import annotations

import re
from typing import Any

from tests.infra.bicep import Expr, Interp, Resource
from tests.infra.report import Finding, Report
from tests.infra.trace import Form, Tracer
from tests.infra.units import Unit

FLEX_PLAN_KINDS = ("functionapp", "functionapp,linux")
SERIALIZED_CHILDREN = ("microsoft.servicebus/namespaces/topics/subscriptions", "/subscriptions/rules")


def _finding(unit: Unit, res: Resource, path: str, message: str) -> Finding:
    return Finding(unit.rel, res.line, res.symbol, path, message)


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def check_rules(units: dict[str, Unit]) -> Report:
    report = Report()
    tracer = Tracer(units)
    plans: dict[tuple[str, str], Resource] = {}
    for unit in units.values():
        for res in unit.file.resources:
            if res.type.lower() == "microsoft.web/serverfarms" and not res.existing:
                sku = _get(res.body, "sku") or {}
                if sku.get("name") == "FC1" or sku.get("tier") == "FlexConsumption":
                    plans[(unit.rel, res.symbol)] = res
                    _check_flex_plan(unit, res, report)
    for unit in units.values():
        for res in unit.file.resources:
            if res.type.lower() == "microsoft.web/sites" and not res.existing:
                _check_flex_site(unit, res, plans, tracer, report)
        _check_serialized_children(unit, report)
    _check_duplicate_detection_setting(units, tracer, report)
    return report


def _check_flex_plan(unit: Unit, plan: Resource, report: Report) -> None:
    kind = plan.body.get("kind")
    if kind not in FLEX_PLAN_KINDS:
        report.errors.append(
            _finding(
                unit,
                plan,
                "kind",
                f"a Flex Consumption (FC1) plan is kind {' or '.join(FLEX_PLAN_KINDS)}, not {kind!r}",
            )
        )
    if _get(plan.body, "properties", "reserved") is not True:
        report.errors.append(
            _finding(unit, plan, "properties.reserved", "a Flex Consumption plan is Linux: reserved: true")
        )
    if _get(plan.body, "sku", "name") != "FC1" or _get(plan.body, "sku", "tier") != "FlexConsumption":
        report.errors.append(
            _finding(unit, plan, "sku", "a Flex Consumption plan is sku FC1, tier FlexConsumption")
        )


def _check_flex_site(
    unit: Unit, site: Resource, plans: dict[tuple[str, str], Resource], tracer: Tracer, report: Report
) -> None:
    def fail(path: str, message: str) -> None:
        report.errors.append(_finding(unit, site, path, message))

    farm = tracer.trace(unit, _get(site.body, "properties", "serverFarmId"))
    if not (farm[0] == "read" and (farm[1], farm[2]) in plans and farm[3] == (("prop", "id"),)):
        fail("properties.serverFarmId", f"must be the id of a Flex Consumption plan, is {farm}")
    if site.body.get("kind") != "functionapp,linux":
        fail(
            "kind",
            f"a Flex Consumption function app is kind 'functionapp,linux', not {site.body.get('kind')!r}",
        )
    config = _get(site.body, "properties", "functionAppConfig")
    if not isinstance(config, dict):
        fail(
            "properties.functionAppConfig",
            "a Flex Consumption app needs functionAppConfig (its only place for runtime and package)",
        )
        return
    for part in ("deployment", "runtime", "scaleAndConcurrency"):
        if part not in config:
            fail(f"properties.functionAppConfig.{part}", "missing")
    storage = _get(config, "deployment", "storage")
    if not isinstance(storage, dict):
        return
    if storage.get("type") != "blobContainer":
        fail("properties.functionAppConfig.deployment.storage.type", "must be 'blobContainer'")
    _check_deployment_url(tracer.units, tracer.trace(unit, storage.get("value")), fail)
    auth = storage.get("authentication") or {}
    if auth.get("type") != "UserAssignedIdentity":
        fail(
            "properties.functionAppConfig.deployment.storage.authentication.type",
            "must be 'UserAssignedIdentity'",
        )
        return
    used = tracer.trace(unit, auth.get("userAssignedIdentityResourceId"))
    assigned = [
        tracer.trace(unit, Interp(tuple(_interp_parts(key)))) if "${" in key else ("lit", key)
        for key in (_get(site.body, "identity", "userAssignedIdentities") or {})
    ]
    if used not in assigned:
        fail(
            "properties.functionAppConfig.deployment.storage.authentication.userAssignedIdentityResourceId",
            "must be an identity assigned to the app (identity.userAssignedIdentities)",
        )


def _interp_parts(key: str) -> list[str | Expr]:
    """``'${identityId}'`` (an object key as bicep.py keeps it) as interpolation parts."""
    parts: list[str | Expr] = []
    for literal, expression in re.findall(r"([^$]*)(?:\$\{([^}]*)\})?", key):
        if literal:
            parts.append(literal)
        if expression:
            parts.append(Expr(expression))
    return parts


def _check_deployment_url(units: dict[str, Unit], url: Form, fail: Any) -> None:
    path = "properties.functionAppConfig.deployment.storage.value"
    blob_endpoint = (("prop", "properties"), ("prop", "primaryEndpoints"), ("prop", "blob"))
    if url[0] != "concat" or len(url) != 3:
        fail(path, f"must be <account blob endpoint><container name> with nothing between, is {url}")
        return
    endpoint, container = url[1], url[2]
    if not (endpoint[0] == "read" and endpoint[3] == blob_endpoint):
        fail(
            path,
            f"must start with a storage account's properties.primaryEndpoints.blob, starts with {endpoint}",
        )
        return
    if not (container[0] == "read" and container[3] == (("prop", "name"),)):
        fail(path, f"must end with a blob container's name, ends with {container}")
        return
    # The container must be one of the account whose endpoint starts the URL: follow its parents.
    unit = units[container[1]]
    chain = [container[2]]
    while True:
        res = unit.resources.get(chain[-1])
        parent = _parent_key(res) if res is not None else None
        if parent is None:
            break
        chain.append(parent[0])
    types = [unit.resources[s].type.lower() for s in chain if s in unit.resources]
    expected = [
        "microsoft.storage/storageaccounts/blobservices/containers",
        "microsoft.storage/storageaccounts/blobservices",
        "microsoft.storage/storageaccounts",
    ]
    if types != expected or (endpoint[1], endpoint[2]) != (container[1], chain[-1]):
        fail(
            path,
            f"the container {container[2]} must be a blob container of {endpoint[2]} (its parents: {chain})",
        )


def _parent_key(res: Resource) -> tuple[str, bool] | None:
    """(parent symbol, whether each loop iteration has its own parent)."""
    if res.enclosing is not None:
        return (res.enclosing, False)
    parent = res.body.get("parent") if isinstance(res.body, dict) else None
    if not isinstance(parent, Expr):
        return None
    match = re.fullmatch(r"(\w+)(?:\[(\w+)\])?", parent.text)
    if not match:
        return None
    symbol, index = match.groups()
    per_iteration = res.loop is not None and index is not None and index in (res.loop.index, res.loop.item)
    return (symbol, per_iteration)


def _check_serialized_children(unit: Unit, report: Report) -> None:
    children = [
        r for r in unit.file.resources if r.type.lower().endswith(SERIALIZED_CHILDREN) and not r.existing
    ]
    groups: dict[tuple[str, bool], list[Resource]] = {}
    for res in children:
        key = _parent_key(res)
        if key is None:
            continue
        if res.loop is not None and not key[1] and res.decorators.get("batchSize") != [1]:
            report.errors.append(
                _finding(
                    unit,
                    res,
                    "",
                    f"every iteration creates a child of {key[0]}: the loop needs @batchSize(1)",
                )
            )
        groups.setdefault(key, []).append(res)
    # What each resource waits for: its dependsOn and its parent (ARM creates a parent first).
    edges = {
        r.symbol: _depends_on(r) | ({key[0]} if (key := _parent_key(r)) else set())
        for r in unit.file.resources
    }
    for (parent, _), siblings in groups.items():
        if len(siblings) < 2:
            continue
        for i, first in enumerate(siblings):
            for second in siblings[i + 1 :]:
                if not (
                    _reaches(edges, first.symbol, second.symbol)
                    or _reaches(edges, second.symbol, first.symbol)
                ):
                    report.errors.append(
                        _finding(
                            unit,
                            second,
                            "dependsOn",
                            f"{first.symbol} and {second.symbol}, children of {parent}, are created in "
                            "parallel (Service Bus answers 409): chain them with dependsOn",
                        )
                    )


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    """Whether ``goal`` is reachable from ``start`` along dependsOn edges."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if goal in edges.get(current, set()):
            return True
        seen.add(current)
        todo += [n for n in edges.get(current, set()) if n not in seen]
    return False


def _depends_on(res: Resource) -> set[str]:
    deps = res.body.get("dependsOn") if isinstance(res.body, dict) else None
    found: set[str] = set()
    for dep in deps if isinstance(deps, list) else []:
        if isinstance(dep, Expr):
            match = re.fullmatch(r"(\w+)(?:\[(\w+)\])?", dep.text)
            if match:
                found.add(match.group(1))
    return found


def _check_duplicate_detection_setting(units: dict[str, Unit], tracer: Tracer, report: Report) -> None:
    settings: list[tuple[Unit, Form]] = []
    for unit in units.values():
        for var in unit.file.variables.values():
            if isinstance(var, dict) and "HANDOFF_DUPLICATE_DETECTION" in var:
                settings.append((unit, tracer.trace(unit, var["HANDOFF_DUPLICATE_DETECTION"])))
    topics: list[tuple[Unit, Resource, Form]] = []
    for unit in units.values():
        for res in unit.file.resources:
            if res.type.lower() == "microsoft.servicebus/namespaces/topics" and not res.existing:
                flag = (
                    res.body.get("properties", {}).get("requiresDuplicateDetection")
                    if isinstance(res.body, dict)
                    else None
                )
                if flag is not False and flag is not None:
                    topics.append((unit, res, tracer.trace(unit, flag)))
    if not settings:
        report.errors.append(
            Finding("", 0, "", "", "no app setting HANDOFF_DUPLICATE_DETECTION (the hand-off code reads it)")
        )
        return
    for unit, form in settings:
        if not (form[:2] == ("op", "?:") and form[3] == ("lit", "true") and form[4] == ("lit", "false")):
            report.errors.append(
                Finding(
                    unit.rel,
                    0,
                    "HANDOFF_DUPLICATE_DETECTION",
                    "",
                    f"must be <flag> ? 'true' : 'false', is {form}",
                )
            )
            continue
        for topic_unit, topic, flag in topics:
            if flag != form[2]:
                report.errors.append(
                    _finding(
                        topic_unit,
                        topic,
                        "properties.requiresDuplicateDetection",
                        f"is {flag}, HANDOFF_DUPLICATE_DETECTION follows {form[2]}: they must be one flag",
                    )
                )
    if not topics:
        report.errors.append(Finding("", 0, "", "", "no endpoint topic sets requiresDuplicateDetection"))
