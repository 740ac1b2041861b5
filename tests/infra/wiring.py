"""Wiring: values that have the right shape but come from the wrong resource.

A client id, a principal id and a tenant id are all GUID strings; an instrumentation key and a connection
string are both strings; the table endpoints of two accounts differ only in the account name. The type
check cannot tell them apart, ARM accepts them, and the app fails on its first request. So each is traced
(tests/infra/trace.py: through variables, module parameters and outputs) back to the resource read that
produces it, and checked against what it must be:

- every role assignment's ``principalId`` is a managed identity's ``properties.principalId`` (its object
  id), or a principal-id parameter of main.bicep (``developerPrincipalId``), never its ``clientId``;
- every ``*__clientId`` app setting, ``AZURE_CLIENT_ID`` and the ``ClientId=`` of
  ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` is the ``properties.clientId`` of the identity assigned
  to the app (``identity.userAssignedIdentities``);
- ``APPLICATIONINSIGHTS_CONNECTION_STRING`` is a component's ``properties.ConnectionString`` (not its
  ``InstrumentationKey``);
- ``*__tableServiceUri`` is the table endpoint of the account that holds the tables the Bicep creates,
  ``*__blobServiceUri`` the blob endpoint of a storage account;
- two storage accounts never get one name (``hostStorageName`` and ``dataStorageName`` traced to the
  same expression);
- the app's identity holds Storage Table Data Contributor on the account that holds the tables, Storage
  Blob Data Owner on the account of the host's blob endpoint and Monitoring Metrics Publisher on the
  component of the connection string: role assignments whose scope is an ``existing`` resource are
  followed to the resource the deployment creates, by the name they are given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.infra.bicep import BicepFile, Expr, Interp, Loop, Resource
from tests.infra.report import Finding, Report
from tests.infra.roles import check_roles
from tests.infra.trace import Form, Tracer
from tests.infra.units import Unit

IDENTITY = "microsoft.managedidentity/userassignedidentities"
STORAGE = "microsoft.storage/storageaccounts"
TABLES = "microsoft.storage/storageaccounts/tableservices/tables"
COMPONENT = "microsoft.insights/components"
ROLE_ASSIGNMENT = "microsoft.authorization/roleassignments"
SITE = "microsoft.web/sites"


def props(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple(("prop", n) for n in names)


@dataclass(frozen=True)
class Target:
    """A resource the deployment declares, and the member steps read from it."""

    unit: Unit
    res: Resource
    steps: tuple[Any, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.unit.rel, self.res.symbol)


def show(form: Form) -> str:
    """A normal form as a reader would write it."""
    kind = form[0]
    if kind == "lit":
        return repr(form[1])
    if kind == "param":
        return f"parameter {form[2]} of {form[1]}"
    if kind == "read":
        steps = "".join(f".{a}" if s == "prop" else "[..]" for s, a in form[3])
        return f"{form[2]}{steps} ({form[1]})"
    if kind == "member":
        steps = "".join(f".{a}" if s == "prop" else "[..]" for s, a in form[2])
        return f"{show(form[1])}{steps}"
    if kind == "call":
        return f"{form[1]}({', '.join(show(a) for a in form[2:])})"
    if kind == "concat":
        return " + ".join(show(p) for p in form[1:])
    return str(form)[:160]


def app_settings(site: Resource, unit: Unit) -> dict[str, Any]:
    """The app settings of a site: ``[for s in items(<var>): {name: s.key, value: s.value}]`` or a list."""
    config = site.body.get("properties", {}).get("siteConfig", {}) if isinstance(site.body, dict) else {}
    listed = config.get("appSettings") if isinstance(config, dict) else None
    lists = _setting_lists(site)
    if lists:  # concat(<items loop variable>, <numbered settings>...): the first is the named settings
        first = unit.file.variables.get(lists[0])
        listed = first if isinstance(first, Loop) else listed
    if isinstance(listed, Loop):
        match = re.fullmatch(r"items\((\w+)\)", listed.iterable.text.strip())
        variable = unit.file.variables.get(match.group(1)) if match else None
        return dict(variable) if isinstance(variable, dict) else {}
    if isinstance(listed, list):
        return {
            str(s["name"]): s.get("value")
            for s in listed
            if isinstance(s, dict) and isinstance(s.get("name"), str)
        }
    return {}


def _setting_lists(site: Resource) -> list[str]:
    """The variables a site's ``appSettings`` is made of: ``<var>``, or ``concat(<var>, <var>, ...)``."""
    config = site.body.get("properties", {}).get("siteConfig", {}) if isinstance(site.body, dict) else {}
    listed = config.get("appSettings") if isinstance(config, dict) else None
    if not isinstance(listed, Expr):
        return []
    match = re.fullmatch(r"concat\(([\w\s,]*)\)", listed.text.strip())
    return [n.strip() for n in match.group(1).split(",") if n.strip()] if match else []


def numbered_app_settings(site: Resource, file: BicepFile) -> dict[str, Loop]:
    """Numbered settings a site sets (pattern with ``{i}`` -> the loop that sets it): a variable
    ``[for (x, j) in list: {name: 'NAME_${j + 1}...', value: ...}]`` in ``concat(...)``, i.e. for
    i = 1..length(list). Only ``j + 1`` of the loop's own index makes a pattern (numbering from 1)."""
    found: dict[str, Loop] = {}
    for name in _setting_lists(site):
        loop = file.variables.get(name)
        if not (isinstance(loop, Loop) and loop.index and isinstance(loop.body, dict)):
            continue
        setting = loop.body.get("name")
        if not isinstance(setting, Interp):
            continue
        numbers = [p for p in setting.parts if not isinstance(p, str)]
        if len(numbers) != 1 or re.sub(r"\s", "", getattr(numbers[0], "text", "")) != f"{loop.index}+1":
            continue
        found["".join(p if isinstance(p, str) else "{i}" for p in setting.parts)] = loop
    return found


class Wiring:
    def __init__(self, root: Path | None, units: dict[str, Unit]) -> None:
        self.root = root
        self.units = units
        self.tracer = Tracer(units)
        self.report = Report()

    def target(self, form: Form) -> Target | None:
        """The declared resource a read comes from; an ``existing`` one is followed by its name."""
        if form[0] != "read" or form[1] not in self.units:
            return None
        unit = self.units[form[1]]
        res = unit.resources.get(form[2])
        if res is None:
            return None
        steps = tuple(form[3])
        if res.loop is not None and steps and steps[0][0] == "index":
            steps = steps[1:]
        if res.existing and isinstance(res.body, dict) and "name" in res.body:
            name = self.tracer.trace(unit, res.body["name"], self._loop_vars(res))
            if res.loop is not None and name == ("loop", res.loop.item):
                # [for name in names: {name: name}]: item i is named by item i of the list, which is
                # followed to a looped declaration's name (read at its own loop index)
                listed = self.tracer.trace(unit, res.loop.iterable)
                name = listed[2] if listed[0] == "for" else listed
                if name[0] == "read" and name[3] and name[3][0][0] == "index" and name[3][0][1][0] == "loop":
                    name = ("read", name[1], name[2], tuple(name[3][1:]))
            if name[0] == "read" and tuple(name[3]) == props("name"):
                found = self.target(name)
                if found is not None:
                    return Target(found.unit, found.res, steps)
        return Target(unit, res, steps)

    def error(self, unit: Unit, res: Resource, path: str, message: str) -> None:
        self.report.errors.append(Finding(unit.rel, res.line, res.symbol, path, message))

    def declared(self, type_: str) -> list[tuple[Unit, Resource]]:
        return [
            (u, r)
            for u in self.units.values()
            for r in u.file.resources
            if r.type.lower() == type_ and not r.existing
        ]

    def run(self) -> Report:
        identity_principals = self.check_principals()
        for unit, site in self.declared(SITE):
            self.check_site(unit, site, identity_principals)
        self.check_distinct_accounts()
        return self.report

    def check_distinct_accounts(self) -> None:
        """Two storage accounts given one name are one account declared twice (names are global)."""
        seen: dict[Form, tuple[Unit, Resource]] = {}
        for unit, res in self.declared(STORAGE):
            if res.loop is not None or not isinstance(res.body, dict) or "name" not in res.body:
                continue
            name = self.tracer.trace(unit, res.body["name"])
            if name in seen:
                first = seen[name][1]
                self.error(
                    unit,
                    res,
                    "name",
                    f"the same name as {first.symbol} ({show(name)}): storage account names are global, so "
                    "both declare one account",
                )
            else:
                seen[name] = (unit, res)

    # -- role assignments --

    def check_principals(self) -> dict[tuple[str, str], tuple[str, str]]:
        """Check every principalId; returns role assignment (file, symbol) -> the identity granted to."""
        granted: dict[tuple[str, str], tuple[str, str]] = {}
        for unit, res in self.declared(ROLE_ASSIGNMENT):
            properties = res.body.get("properties", {}) if isinstance(res.body, dict) else {}
            if "principalId" not in properties:
                continue  # the type check reports the missing property
            form = self.tracer.trace(unit, properties["principalId"], self._loop_vars(res))
            found = self.target(form)
            if (
                found is not None
                and found.res.type.lower() == IDENTITY
                and found.steps == props("properties", "principalId")
            ):
                granted[(unit.rel, res.symbol)] = found.key
            elif not (form[0] == "param" and form[1] == "main.bicep" and form[2].endswith("PrincipalId")):
                self.error(
                    unit,
                    res,
                    "properties.principalId",
                    "must be the principalId (object id) of a managed identity, or a principal-id parameter "
                    f"of main.bicep; is {show(form)}",
                )
        return granted

    @staticmethod
    def _loop_vars(res: Resource) -> frozenset[str]:
        if res.loop is None:
            return frozenset()
        return frozenset({res.loop.item} | ({res.loop.index} if res.loop.index else set()))

    # -- the app's settings --

    def assigned_identities(self, unit: Unit, site: Resource) -> set[tuple[str, str]]:
        keys = (site.body.get("identity", {}) or {}).get("userAssignedIdentities", {}) or {}
        found: set[tuple[str, str]] = set()
        for key in keys:
            match = re.fullmatch(r"\$\{(.*)\}", key) if isinstance(key, str) else None
            if match is None:
                continue
            target = self.target(self.tracer.trace(unit, Expr(match.group(1))))
            if target is not None and target.res.type.lower() == IDENTITY and target.steps == props("id"):
                found.add(target.key)
        return found

    def check_site(self, unit: Unit, site: Resource, granted: dict[tuple[str, str], tuple[str, str]]) -> None:
        identities = self.assigned_identities(unit, site)
        settings = app_settings(site, unit)
        names = ", ".join(sorted(s for _, s in identities)) or "none"
        needs: list[tuple[str, str, Target]] = []  # (role, why, resource) the identity must hold

        def fail(name: str, message: str) -> None:
            self.error(unit, site, f"appSettings.{name}", message)

        def client_id(name: str, form: Form) -> None:
            found = self.target(form)
            if not (
                found is not None
                and found.res.type.lower() == IDENTITY
                and found.steps == props("properties", "clientId")
                and found.key in identities
            ):
                fail(
                    name,
                    f"must be the clientId of the identity assigned to the app ({names}); is {show(form)}",
                )

        # Un-numbered table endpoints name account 0: one declared once (not per i), holding the tables.
        tables_accounts = {k for k in self.table_accounts() if self.units[k[0]].resources[k[1]].loop is None}
        for name, item in settings.items():
            form = self.tracer.trace(unit, item)
            if name.endswith("__clientId") or name == "AZURE_CLIENT_ID":
                client_id(name, form)
            elif name == "APPLICATIONINSIGHTS_AUTHENTICATION_STRING" and form[0] == "concat":
                parts = list(form[1:])
                for i, part in enumerate(parts[:-1]):
                    if part[0] == "lit" and str(part[1]).endswith("ClientId="):
                        client_id(name, parts[i + 1])
            elif name == "APPLICATIONINSIGHTS_CONNECTION_STRING":
                found = self.target(form)
                if not (
                    found is not None
                    and found.res.type.lower() == COMPONENT
                    and found.steps == props("properties", "ConnectionString")
                ):
                    fail(
                        name,
                        f"must be the ConnectionString of an Application Insights component; is {show(form)}",
                    )
                else:
                    needs.append(("Monitoring Metrics Publisher", name, found))
            elif name.endswith("__tableServiceUri"):
                found = self.target(form)
                holders = ", ".join(s for _, s in sorted(tables_accounts)) or "no account"
                if not (
                    found is not None
                    and found.steps == props("properties", "primaryEndpoints", "table")
                    and found.key in tables_accounts
                ):
                    fail(
                        name,
                        f"must be the table endpoint of {holders}, the account that holds the tables; "
                        f"is {show(form)}",
                    )
                else:
                    needs.append(("Storage Table Data Contributor", name, found))
            elif name.endswith("__blobServiceUri"):
                found = self.target(form)
                if not (
                    found is not None
                    and found.res.type.lower() == STORAGE
                    and found.steps == props("properties", "primaryEndpoints", "blob")
                ):
                    fail(
                        name, f"must be a storage account's properties.primaryEndpoints.blob; is {show(form)}"
                    )
                else:
                    needs.append(("Storage Blob Data Owner", name, found))
        self.check_numbered(unit, site, settings, needs, client_id)
        self.check_grants(identities, granted, needs)

    def check_numbered(
        self,
        unit: Unit,
        site: Resource,
        settings: dict[str, Any],
        needs: list[tuple[str, str, Target]],
        client_id: Any,
    ) -> None:
        """Numbered settings (``NAME_{i}...`` for i = 1..N-1, one per extra account): the value of each i
        is read from resource i of a looped declaration, never from the one the un-numbered setting names
        (account 0), and holds what the un-numbered form must hold (a table endpoint of an account that
        holds the tables, where the identity is Table Data Contributor; a client id of the app's identity)."""
        for pattern, loop in numbered_app_settings(site, unit.file).items():
            name = pattern.replace("{i}", "i")

            def fail(message: str, pattern: str = pattern) -> None:
                self.error(unit, site, f"appSettings.{pattern}", message)

            inner = frozenset({loop.item} | ({loop.index} if loop.index else set()))
            value = loop.body.get("value") if isinstance(loop.body, dict) else None
            form = self.tracer.trace(unit, value, inner)
            if form == ("loop", loop.item):  # the item of the list the settings are made from
                listed = self.tracer.trace(unit, loop.iterable)
                form = listed[2] if listed[0] == "for" else ("member", listed, (("index", ("loop", "i")),))
            if pattern.endswith("__clientId"):
                client_id(name, form)
                continue
            if not pattern.endswith("__tableServiceUri"):
                continue
            found = self.target(form)
            first = self.target(self.tracer.trace(unit, settings.get(pattern.replace("_{i}", "", 1))))
            holders = self.table_accounts()
            if not (
                found is not None
                and found.steps == props("properties", "primaryEndpoints", "table")
                and found.key in holders
            ):
                fail(
                    "must be, for each i, the table endpoint of account i, an account that holds the "
                    f"tables; is {show(form)}"
                )
            elif (
                found.res.loop is None
                or (first is not None and first.key == found.key)
                or not (
                    form[0] == "read" and form[3] and form[3][0][0] == "index" and form[3][0][1][0] == "loop"
                )
            ):
                fail(
                    f"must be read from account i of a looped declaration (one account per i), not from "
                    f"{found.res.symbol}, which every i would share (the accounts' rows would all go to one "
                    f"account); is {show(form)}"
                )
            else:
                needs.append(("Storage Table Data Contributor", pattern, found))

    def table_accounts(self) -> set[tuple[str, str]]:
        """The storage accounts that hold the tables the deployment creates."""
        found: set[tuple[str, str]] = set()
        for unit, res in self.declared(TABLES):
            current: Resource | None = res
            while current is not None and current.type.lower() != STORAGE:
                parent = current.body.get("parent") if isinstance(current.body, dict) else None
                symbol = current.enclosing or (
                    re.sub(r"\[.*\]$", "", parent.text) if isinstance(parent, Expr) else None
                )
                current = unit.resources.get(symbol) if symbol else None
            if current is not None:
                target = self.target(("read", unit.rel, current.symbol, ()))
                if target is not None:
                    found.add(target.key)
        return found

    def check_grants(
        self,
        identities: set[tuple[str, str]],
        granted: dict[tuple[str, str], tuple[str, str]],
        needs: list[tuple[str, str, Target]],
    ) -> None:
        if self.root is None:
            return
        _, grants = check_roles(self.root, self.units)
        held: set[tuple[str, tuple[str, str]]] = set()
        for grant in grants:
            if granted.get((grant.file, grant.symbol)) not in identities:
                continue
            unit = self.units[grant.file]
            res = unit.resources[grant.symbol]
            scope = res.body.get("scope") if isinstance(res.body, dict) else None
            if scope is None:
                continue
            target = self.target(self.tracer.trace(unit, scope, self._loop_vars(res)))
            if target is not None:
                held.add((grant.role, target.key))
        for role, why, target in needs:
            if (role, target.key) not in held:
                scopes = sorted(f"{r} on {s}" for r, (_, s) in held) or ["none"]
                self.error(
                    target.unit,
                    target.res,
                    "",
                    f"the app's identity holds no {role} on {target.res.symbol} (which {why} points to); "
                    f"it holds: {'; '.join(scopes)}",
                )


def check_wiring(root: Path, units: dict[str, Unit]) -> Report:
    return Wiring(root, units).run()
