"""What the Bicep compiler would catch and a grammar cannot: references to names that do not exist.

Every identifier used as a value must be a parameter, variable, resource or module of the same file, or a
loop variable of an enclosing ``for``; every function called must be a Bicep function or decorator. So a
typo such as ``hostStorag.id`` or ``subscriptionResourceID(...)`` fails here although it parses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tree_sitter import Node

from tests.infra.bicep import INFRA, bicep_files, parse

# fmt: off
BICEP_FUNCTIONS = {
    "resourceGroup", "subscription", "tenant", "managementGroup", "deployment", "environment", "deployer",
    "resourceId", "subscriptionResourceId", "tenantResourceId", "extensionResourceId", "reference", "list",
    "pickZones", "providers", "base64", "base64ToString", "concat", "contains", "dataUri", "empty",
    "endsWith", "first", "format", "guid", "indexOf", "join", "last", "lastIndexOf", "length", "newGuid",
    "padLeft", "replace", "skip", "split", "startsWith", "string", "substring", "take", "toLower",
    "toUpper", "trim", "uniqueString", "uri", "uriComponent", "uriComponentToString", "array", "filter",
    "flatten", "intersection", "items", "map", "reduce", "sort", "toObject", "union", "range", "min", "max",
    "json", "bool", "int", "coalesce", "objectKeys", "shallowMerge", "any", "loadTextContent",
    "loadJsonContent", "loadFileAsBase64",
}
DECORATORS = {
    "description", "allowed", "minLength", "maxLength", "minValue", "maxValue", "secure", "metadata",
    "batchSize", "sealed", "export",
}
# fmt: on
DECLARATIONS = {"parameter_declaration", "variable_declaration", "resource_declaration", "module_declaration"}


def _text(node: Node) -> str:
    return node.text.decode() if node.text else ""


def unresolved(source: bytes) -> list[str]:
    """Every identifier or function name in ``source`` that resolves to nothing."""
    root = parse(source)
    declared = {_text(node.named_children[0]) for node in root.named_children if node.type in DECLARATIONS}
    problems: list[str] = []

    def where(node: Node) -> str:
        return f"{node.start_point.row + 1}:{node.start_point.column + 1}"

    def walk(node: Node, loop_vars: frozenset[str]) -> None:
        if node.type == "for_statement":
            initializer = node.child_by_field_name("initializer")
            params = [c for c in node.named_children if c.type == "for_loop_parameters"]
            new = {_text(initializer)} if initializer is not None else set()
            for p in params:
                new |= {_text(c) for c in p.named_children}
            loop_vars = loop_vars | new
        for index, child in enumerate(node.children):
            if child.type == "identifier":
                parent_type = node.type
                field = node.field_name_for_child(index)
                if parent_type in DECLARATIONS | {"output_declaration"} and index == 1:
                    pass  # the declared name
                elif parent_type == "object_property" and index == 0:
                    pass  # a property key
                elif parent_type == "for_statement" and field == "initializer":
                    pass  # a loop variable being declared
                elif parent_type == "call_expression" and field == "function":
                    if _text(child) not in BICEP_FUNCTIONS | DECORATORS:
                        problems.append(f"{where(child)} unknown function {_text(child)}()")
                elif _text(child) not in declared | loop_vars:
                    problems.append(f"{where(child)} unknown name {_text(child)}")
            walk(child, loop_vars)

    walk(root, frozenset())
    return problems


@pytest.mark.parametrize("path", bicep_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_name_and_function_used_exists(path: Path) -> None:
    assert unresolved(path.read_bytes()) == []


@pytest.mark.parametrize(
    ("typo", "fixed"),
    [
        ("scope: hostStorage\n", "scope: hostStorag\n"),
        ("subscriptionResourceId(", "subscriptionResourceID("),
        ("principalId: principalId\n", "principalId: principalID\n"),
    ],
)
def test_a_typo_in_a_reference_is_caught(typo: str, fixed: str) -> None:
    # Given rbac.bicep with one reference misspelt (it still parses)
    source = (INFRA / "modules" / "rbac.bicep").read_text()
    assert typo in source
    broken = source.replace(typo, fixed, 1).encode()
    # Then the reference check reports it
    assert unresolved(broken) != []


def test_a_loop_variable_is_only_known_inside_its_loop() -> None:
    source = b"param xs array\nvar a = [for x in xs: x]\nvar b = x\n"
    assert unresolved(source) == ["3:9 unknown name x"]
