"""Deployment order: no dependency cycle, and the app waits for its identity's role assignments.

What a declaration waits for: every resource or module of its file it names (in its body, condition or
loop, directly or through a variable), its ``parent`` and its ``dependsOn``, as ARM orders them. A cycle
(``a`` waits for ``b`` which waits for ``a``, also across modules of one file) is a deployment Bicep
refuses to build. And the function app must not start before the role assignments to the identity it
runs as exist: its first requests to storage, tables, Service Bus and telemetry would be refused (403)
until they do. Where the app and the role assignments sit in different modules, the module that deploys
the app must wait for each module that grants its identity a role.
"""

from __future__ import annotations

import re
from typing import Any

from tests.infra.bicep import Conditional, Expr, Interp, Loop
from tests.infra.report import Finding, Report
from tests.infra.units import Unit, module_target
from tests.infra.wiring import SITE, Wiring

_IDENTIFIER = re.compile(r"(?<![.\w'])([A-Za-z_]\w*)")


def _texts(item: Any) -> list[str]:
    """The expression texts inside a parsed value (string literals left out)."""
    if isinstance(item, Expr):
        return [re.sub(r"'(?:[^'\\]|\\.)*'", "''", item.text)]
    if isinstance(item, Interp):
        return [t for p in item.parts if isinstance(p, Expr) for t in _texts(p)]
    if isinstance(item, Loop):
        return _texts(item.iterable) + _texts(item.body)
    if isinstance(item, Conditional):
        return _texts(item.condition) + _texts(item.body)
    if isinstance(item, dict):
        return [t for k, v in item.items() for t in ([*_texts_of_key(k), *_texts(v)])]
    if isinstance(item, list):
        return [t for v in item for t in _texts(v)]
    return []


def _texts_of_key(key: Any) -> list[str]:
    return re.findall(r"\$\{([^}]*)\}", key) if isinstance(key, str) else []


def edges(unit: Unit) -> dict[str, set[str]]:
    """Declaration symbol -> the declarations of the same file it waits for."""
    nodes = set(unit.resources) | set(unit.modules)
    cache: dict[str, set[str]] = {}

    def names(texts: list[str], seen: frozenset[str]) -> set[str]:
        found: set[str] = set()
        for text in texts:
            for name in _IDENTIFIER.findall(text):
                if name in nodes:
                    found.add(name)
                elif name in unit.file.variables and name not in seen:
                    if name not in cache:
                        cache[name] = names(_texts(unit.file.variables[name]), seen | {name})
                    found |= cache[name]
        return found

    graph: dict[str, set[str]] = {}
    for res in unit.file.resources:
        parts = _texts(res.body) + _texts(res.condition) + (_texts(res.loop.iterable) if res.loop else [])
        graph[res.symbol] = names(parts, frozenset()) | ({res.enclosing} if res.enclosing else set())
    for mod in unit.file.modules:
        parts = _texts(mod.body) + _texts(mod.condition) + (_texts(mod.loop.iterable) if mod.loop else [])
        graph[mod.symbol] = names(parts, frozenset())
    for symbol in graph:
        graph[symbol].discard(symbol)
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if goal in graph.get(current, set()):
            return True
        todo += graph.get(current, set())
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each dependency cycle once, starting at its alphabetically first declaration."""
    found: set[tuple[str, ...]] = set()
    for start in sorted(graph):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        while stack:
            current, path = stack.pop()
            for nxt in sorted(graph.get(current, set())):
                if nxt == start:
                    first = path.index(min(path))
                    found.add(tuple(path[first:] + path[:first]))
                elif nxt not in path and nxt > start:
                    stack.append((nxt, [*path, nxt]))
    return [list(c) for c in sorted(found)]


def check_dependencies(units: dict[str, Unit]) -> Report:
    report = Report()
    graphs = {rel: edges(unit) for rel, unit in units.items()}
    for rel, graph in graphs.items():
        for cycle in cycles(graph):
            unit = units[rel]
            decl = unit.resources.get(cycle[0]) or unit.modules.get(cycle[0])
            report.errors.append(
                Finding(
                    rel,
                    getattr(decl, "line", 0),
                    cycle[0],
                    "dependsOn",
                    f"dependency cycle: {' -> '.join([*cycle, cycle[0]])} (ARM cannot order it)",
                )
            )
    _check_app_waits_for_its_roles(units, graphs, report)
    return report


def _check_app_waits_for_its_roles(
    units: dict[str, Unit], graphs: dict[str, dict[str, set[str]]], report: Report
) -> None:
    wiring = Wiring(None, units)
    granted = wiring.check_principals()  # role assignment -> identity (its errors belong to wiring)
    for site_unit, site in wiring.declared(SITE):
        identities = wiring.assigned_identities(site_unit, site)
        grants = [key for key, identity in granted.items() if identity in identities]
        for grant_rel, grant_symbol in grants:
            if grant_rel == site_unit.rel:
                if not reaches(graphs[grant_rel], site.symbol, grant_symbol):
                    report.errors.append(
                        Finding(
                            grant_rel,
                            site.line,
                            site.symbol,
                            "dependsOn",
                            f"{site.symbol} does not wait for {grant_symbol}, which grants a role to its "
                            "identity",
                        )
                    )
                continue
            # In different files: a file that deploys both (main.bicep) must order the two module calls.
            for caller in units.values():
                site_mods = [
                    m for m in caller.file.modules if _deploys(units, caller, m.symbol, site_unit.rel)
                ]
                grant_mods = [m for m in caller.file.modules if _deploys(units, caller, m.symbol, grant_rel)]
                for site_mod in site_mods:
                    for grant_mod in grant_mods:
                        if site_mod.symbol != grant_mod.symbol and not reaches(
                            graphs[caller.rel], site_mod.symbol, grant_mod.symbol
                        ):
                            report.errors.append(
                                Finding(
                                    caller.rel,
                                    site_mod.line,
                                    site_mod.symbol,
                                    "dependsOn",
                                    f"{site_mod.symbol} does not wait for {grant_mod.symbol}, which grants "
                                    f"roles to its identity ({grant_symbol}): the app would start before it "
                                    "may use them",
                                )
                            )


def _deploys(units: dict[str, Unit], caller: Unit, symbol: str, rel: str) -> bool:
    """Whether module ``symbol`` of ``caller`` deploys the file ``rel`` (directly)."""
    mod = caller.modules.get(symbol)
    target = module_target(units, caller, mod) if mod is not None else None
    return target is not None and target.rel == rel
