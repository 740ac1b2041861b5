"""What the Bicep compiler would catch and a grammar cannot: references to names that do not exist.

Every identifier used as a value must be a parameter, variable, resource or module of the same file, or a
loop variable of an enclosing ``for`` (or a lambda parameter); every function called must be a Bicep
function or decorator. So a typo such as ``hostStorag.id`` or ``subscriptionResourceID(...)`` is reported
although it parses.
"""

from __future__ import annotations

from tree_sitter import Node

from tests.infra.bicep import parse

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
                elif parent_type == "resource_expression" and field == "resource":
                    pass  # outer::inner names a nested resource of outer
                elif parent_type == "call_expression" and field == "function":
                    if _text(child) not in BICEP_FUNCTIONS | DECORATORS:
                        problems.append(f"{where(child)} unknown function {_text(child)}()")
                elif _text(child) not in declared | loop_vars:
                    problems.append(f"{where(child)} unknown name {_text(child)}")
            walk(child, loop_vars)

    walk(root, frozenset())
    return problems
