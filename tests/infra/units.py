"""The parsed Bicep files of one tree (infra/ or a copy of it) and the syntax helpers the checks share.

A ``Unit`` is one file: its ``BicepFile`` (tests/infra/bicep.py), syntax tree and symbols. Expressions
kept as text (``Expr``) are parsed on demand with ``expr_node``; access chains such as ``a.b[0].c`` are
taken apart with ``decompose``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tree_sitter import Node, Tree

from tests.infra.bicep import BicepFile, Module, Resource, _parser, load_source, tree_errors
from tests.infra.report import Finding, Report


@dataclass
class Unit:
    """One parsed Bicep file of the checked tree."""

    rel: str
    path: Path
    source: bytes
    file: BicepFile
    root: Node
    tree: Tree
    resources: dict[str, Resource]
    modules: dict[str, Module]


def text(node: Node) -> str:
    """The source text of a syntax node."""
    return node.text.decode() if node.text else ""


def named(node: Node) -> list[Node]:
    """The named children of a node, comments left out."""
    return [c for c in node.named_children if c.type != "comment"]


@cache
def _expr(source: str) -> tuple[Tree, Node]:
    tree = _parser().parse(b"var __expr = " + source.encode())
    declaration = named(tree.root_node)[0]
    return tree, named(declaration)[-1]


def expr_node(source: str) -> Node:
    """The syntax node of one expression's source text (parsed once, kept alive with its tree)."""
    return _expr(source)[1]


def module_target(units: Mapping[str, Unit], caller: Unit, mod: Module) -> Unit | None:
    """The unit a module declaration of ``caller`` deploys (None: no such file under the root)."""
    wanted = os.path.normpath(os.path.join(caller.path.parent, mod.path))
    return next((u for u in units.values() if os.path.normpath(u.path) == wanted), None)


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def decompose(node: Node) -> tuple[Node, list[tuple[str, Any]]]:
    """``a.b[0].c`` -> (``a``, [prop b, index 0, prop c]); ``x::y`` stays the base."""
    steps: list[tuple[str, Any]] = []
    while True:
        if node.type == "member_expression":
            prop = node.child_by_field_name("property")
            steps.append(("prop", text(prop) if prop is not None else ""))
        elif node.type == "subscript_expression":
            steps.append(("index", node.child_by_field_name("index")))
        else:
            break
        obj = node.child_by_field_name("object")
        assert obj is not None
        node = obj
    steps.reverse()
    return node, steps


def resource_symbol(node: Node) -> str:
    """``outer::inner`` as the symbol bicep.py gives a nested resource."""
    parts: list[str] = []
    while node.type == "resource_expression":
        inner = node.child_by_field_name("resource")
        parts.append(text(inner) if inner is not None else "")
        obj = node.child_by_field_name("object")
        assert obj is not None
        node = obj
    parts.append(text(node))
    return "::".join(reversed(parts))


def bound_names(node: Node) -> set[str]:
    """Loop variables and lambda parameters in scope at ``node``."""
    names: set[str] = set()
    current: Node | None = node.parent
    while current is not None:
        if current.type == "for_statement":
            initializer = current.child_by_field_name("initializer")
            if initializer is not None:
                names.add(text(initializer))
            for params in (c for c in current.named_children if c.type == "for_loop_parameters"):
                names |= {text(c) for c in params.named_children}
        elif current.type == "lambda_expression":
            head = named(current)[0]
            names |= {text(c) for c in ([head] if head.type == "identifier" else named(head))}
        current = current.parent
    return names


def load_units(root: Path, report: Report) -> dict[str, Unit]:
    """Parse every .bicep file under ``root``; files that do not parse are reported and left out."""
    units: dict[str, Unit] = {}
    for path in sorted(root.rglob("*.bicep")):
        rel = path.relative_to(root).as_posix()
        source = path.read_bytes()
        tree = _parser().parse(source)
        problems = tree_errors(tree.root_node)
        if problems:
            report.errors += [Finding(rel, 0, "", "", f"syntax: {p}") for p in problems]
            continue
        file = load_source(path, source, tree.root_node)
        resources = {r.symbol: r for r in file.resources}
        modules = {m.symbol: m for m in file.modules}
        units[rel] = Unit(rel, path, source, file, tree.root_node, tree, resources, modules)
    return units
