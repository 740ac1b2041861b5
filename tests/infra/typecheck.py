"""A type check of infra/ against Azure's own resource types: what `az bicep build` / ARM would reject.

No Bicep compiler can run here, so this reads the templates with the real Bicep grammar
(tests/infra/bicep.py) and checks them against the type definitions the compiler itself uses
(tests/infra/armtypes.py, vendored from Azure/bicep-types-az).

Covered, for every ``resource`` and ``existing`` declaration of every file (nested ``outer::inner``
declarations, ``parent:`` children, ``[for ...]`` loops and ``if (...)`` conditions included):

- the type exists and the API version exists for it (index.json), and its type data is vendored;
- every property set exists at that level (a typo or a wrong nesting level fails), in the exact case;
- no read-only property is set; every required property of a literal object is present;
- literal values: type (string/int/bool/object/array), closed sets (literal unions, discriminators, and
  the "Allowed Values: ..." lists the type data states in a description), min/max length and value,
  patterns; extensible enums (known literals + any string) accept only their known literals;
- values that are not literals but whose type is known: parameters (declared type, @allowed,
  @minLength...), variables (checked as their value), interpolated strings (always strings), the two
  branches of ``c ? a : b``, function results (``guid()`` is a string, ``length()`` an int, ...), module
  outputs (their declared type) and properties read from resources (their type in the type data);
- ``parent:`` names a resource of the parent type; a child's ``name`` has the right number of segments;
  ``scope:`` only on extension and ``existing`` resources; ``dependsOn`` names resources or modules;
- every read ``x.properties.a.b`` / ``x[i].name`` / ``x::y.id`` of a resource names a real, readable
  property; every ``m.outputs.o`` names an output of module ``m``; every ``v['key']`` of a JSON/object
  variable names a key it has;
- module calls pass only parameters the module declares, every required one, with matching types;
  outputs, parameter defaults, @allowed lists and main.parameters.json match their declared types.

Skipped, and listed in the report with the reason: values whose type cannot be known statically (loop
variables, members of object parameters, ``any()``, results of functions whose type depends on data) and
checks a non-literal cannot satisfy (a pattern, a length, or a closed set that a string parameter without
@allowed feeds).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tree_sitter import Node

from tests.infra.armtypes import READ_ONLY, REQUIRED, SCOPE_EXTENSION, WRITE_ONLY, Ref, TypeData, inline
from tests.infra.bicep import Conditional, Expr, Interp, Loop, Module, Param, Resource, array_items, value
from tests.infra.report import Finding, Report
from tests.infra.units import (
    Unit,
    bound_names,
    decompose,
    expr_node,
    load_units,
    module_target,
    named,
    resource_symbol,
    text,
    walk,
)

# ---- static types of Bicep expressions --------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A value known at compile time (a literal, or a JSON file read with loadJsonContent)."""

    value: Any


@dataclass(frozen=True)
class Prim:
    """A value of a known Bicep type whose value is not known; ``choices`` when it is one of a few."""

    kind: str  # string | int | bool | object | array
    why: str
    choices: tuple[Any, ...] | None = None
    limits: Mapping[str, int] = field(default_factory=dict)  # minLength/maxLength/minValue/maxValue


@dataclass(frozen=True)
class Arm:
    """A value read from a resource: its type is a node of the type data."""

    ref: Ref
    why: str


@dataclass(frozen=True)
class Unknown:
    why: str


SType = Known | Prim | Arm | Unknown

# What Bicep functions return (only where it does not depend on the arguments).
# fmt: off
_RETURNS: dict[str, str] = {
    **dict.fromkeys([
        "guid", "uniqueString", "toLower", "toUpper", "substring", "replace", "format", "string", "trim",
        "subscriptionResourceId", "resourceId", "tenantResourceId", "extensionResourceId", "base64",
        "base64ToString", "uri", "uriComponent", "uriComponentToString", "join", "padLeft", "newGuid",
        "utcNow", "dataUri", "loadTextContent", "loadFileAsBase64",
    ], "string"),
    **dict.fromkeys(["int", "length", "indexOf", "lastIndexOf", "min", "max"], "int"),
    **dict.fromkeys(["bool", "empty", "contains", "startsWith", "endsWith"], "bool"),
    **dict.fromkeys([
        "array", "split", "range", "flatten", "filter", "map", "items", "sort", "intersection", "pickZones",
    ], "array"),
    **dict.fromkeys([
        "union", "shallowMerge", "toObject", "resourceGroup", "subscription", "tenant", "deployment",
        "environment", "managementGroup", "deployer",
    ], "object"),
}
# fmt: on
_BUILTIN_OBJECTS = {"resourceGroup", "subscription", "tenant", "deployment", "environment", "deployer"}
_OBJECT_MEMBERS = {"tags", "properties", "suffixes", "authentication", "templateLink"}
_COMPARISON = {"==", "!=", "<", "<=", ">", ">=", "=~", "!~", "&&", "||"}
_ARITHMETIC = {"+", "-", "*", "/", "%"}
# Keys Bicep itself adds to a resource body (not part of the resource's type).
_BICEP_KEYS = {"parent", "scope", "dependsOn"}
_ALLOWED_IN_DESCRIPTION = re.compile(r"Allowed Values: ((?:'[^']*'(?:,\s*|\s+or\s+)?)+)(or an empty string)?")


def _kind_of_python(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, str):
        return "string"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, list):
        return "array"
    return "null"


def _one_line(message: str) -> str:
    """A message with the whitespace of multi-line source text collapsed."""
    return " ".join(message.split())


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def suggestion(name: str, candidates: list[str]) -> str:
    """`` (did you mean X?)`` for the closest candidate (case differences first), else ``''``."""
    for c in candidates:
        if c.lower() == name.lower():
            return f" (did you mean {c}? property names are case-sensitive here)"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


# ---- the checker ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    """Where a value sits (for messages) and which loop variables are in scope."""

    unit: Unit
    line: int
    subject: str
    path: str = ""
    loop_vars: Mapping[str, SType] = field(default_factory=dict)
    closed: frozenset[str] | None = None  # a closed set a member's description states

    def at(self, key: str | int) -> Ctx:
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.path else key)
        return replace(self, path=self.path + step, closed=None)


class Checker:
    """Type-checks every Bicep file under ``root`` (a copy of infra/ in the mutation test)."""

    def __init__(self, root: Path, types: TypeData, units: dict[str, Unit]) -> None:
        self.root = root
        self.types = types
        self.units = units
        self.report = Report(files=len(units))
        self._json: dict[Path, Any] = {}
        self._vars_in_progress: set[tuple[str, str]] = set()

    # -- messages --

    def error(self, ctx: Ctx, message: str) -> None:
        self.report.errors.append(Finding(ctx.unit.rel, ctx.line, ctx.subject, ctx.path, _one_line(message)))

    def skip(self, ctx: Ctx, message: str) -> None:
        self.report.skipped.append(Finding(ctx.unit.rel, ctx.line, ctx.subject, ctx.path, _one_line(message)))

    # -- entry point --

    def run(self) -> Report:
        for unit in self.units.values():
            for res in unit.file.resources:
                self.check_resource(unit, res)
            for mod in unit.file.modules:
                self.check_module(unit, mod)
            for name, param in unit.file.params.items():
                self.check_param(unit, name, param)
            for name, out in unit.file.outputs.items():
                ctx = Ctx(unit, self._line_of(unit, "output_declaration", name), f"output {name}")
                self.check_value(out, self.declared_type(unit.file.output_types[name], {}), ctx)
            self.check_reads(unit)
        main = self.units.get("main.bicep")
        if main is not None and (self.root / "main.parameters.json").is_file():
            self.check_parameter_file(main, self.root / "main.parameters.json")
        return self.report

    @staticmethod
    def _line_of(unit: Unit, kind: str, name: str) -> int:
        for node in named(unit.root):
            if node.type == kind and text(named(node)[0]) == name:
                return node.start_point.row + 1
        return 0

    # -- resources --

    def check_resource(self, unit: Unit, res: Resource) -> None:
        self.report.resources += 1
        ctx = Ctx(
            unit, res.line, res.symbol, loop_vars=self.loop_scope(res.loop, Ctx(unit, res.line, res.symbol))
        )
        versions = self.types.versions(res.type)
        if versions is None:
            self.error(ctx, f"resource type {res.type} does not exist")
            return
        if res.api_version not in versions:
            newest = ", ".join(versions[-4:])
            self.error(ctx, f"API version {res.api_version} does not exist for {res.type} (newest: {newest})")
            return
        body = self.types.body(res.type, res.api_version)
        if body is None:
            self.error(
                ctx,
                f"{res.type}@{res.api_version} exists but its type data is not vendored in "
                "tests/infra/bicep-types (add it, see its README)",
            )
            return
        if not isinstance(res.body, dict):
            self.skip(ctx, f"body is an expression ({res.body!r}), not an object")
            return
        self.check_parent(ctx, res)
        extension = bool(self.types.writable_scopes(res.type, res.api_version) & SCOPE_EXTENSION)
        if "scope" in res.body and not (extension or res.existing):
            self.error(
                ctx.at("scope"), f"{res.type} is not an extension resource: only existing ones take scope:"
            )
        for i, dep in enumerate(
            res.body.get("dependsOn", []) if isinstance(res.body.get("dependsOn"), list) else []
        ):
            target = re.sub(r"\[.*\]$", "", dep.text) if isinstance(dep, Expr) else None
            if target not in unit.resources and target not in unit.modules:
                shown = dep.text if isinstance(dep, Expr) else json.dumps(dep)
                self.error(ctx.at("dependsOn").at(i), f"{shown} is not a resource or module of this file")
        if res.existing:
            for key in sorted(set(res.body) - {"name", "parent", "scope"}):
                self.error(ctx.at(key), "an existing resource takes only name, parent and scope")
            name_type = self.member(body, "name")
            if "name" not in res.body:
                self.error(ctx.at("name"), "required property is missing")
            elif name_type is not None:
                self.check_value(res.body["name"], name_type[0], ctx.at("name"))
            return
        if self.types.kind(body) == "DiscriminatedObjectType":
            self.check_discriminated(res.body, body, ctx, top_level=True)
        else:
            self.check_object(res.body, body, ctx, top_level=True)

    def check_parent(self, ctx: Ctx, res: Resource) -> None:
        unit = ctx.unit
        parent_expr = res.body.get("parent")
        segments = res.type.split("/")
        if res.enclosing is not None:
            parent = unit.resources.get(res.enclosing)
        elif isinstance(parent_expr, Expr):
            parent = unit.resources.get(re.sub(r"\[.*\]$", "", parent_expr.text))
            if parent is None:
                self.error(ctx.at("parent"), f"{parent_expr.text} is not a resource of this file")
                return
        else:
            parent = None
        name = res.body.get("name")
        if parent is not None:
            expected = "/".join(segments[:-1])
            if parent.type.lower() != expected.lower():
                self.error(
                    ctx.at("parent"), f"the parent of a {res.type} must be a {expected}, not a {parent.type}"
                )
            if isinstance(name, str) and "/" in name:
                self.error(ctx.at("name"), "a child declared with a parent takes only its own name segment")
        elif len(segments) > 2 and isinstance(name, str) and name.count("/") != len(segments) - 2:
            self.error(
                ctx.at("name"), f"a {res.type} without parent: needs a name of {len(segments) - 1} segments"
            )

    def loop_scope(self, loop: Loop | None, ctx: Ctx) -> dict[str, SType]:
        """The loop variables of ``[for item in xs]`` / ``[for (item, i) in xs]`` and their types."""
        if loop is None:
            return dict(ctx.loop_vars)
        scope = dict(ctx.loop_vars)
        items = self.infer(expr_node(loop.iterable.text), ctx)
        raw = ctx.unit.file.variables.get(loop.iterable.text.strip())
        if isinstance(raw, list) and raw and all(isinstance(v, dict) for v in raw):
            # A literal array of objects whose members may be expressions (the alert list): each item is
            # kept, so that ``item.member`` is checked as every item's member (apply_steps).
            element: SType = Prim("object", f"item of {loop.iterable.text}", tuple(raw))
        elif isinstance(items, Known) and isinstance(items.value, list) and items.value:
            element = self.join([Known(v) for v in items.value], f"item of {loop.iterable.text}")
        elif isinstance(items, Prim) and items.why.startswith("range("):
            element = Prim("int", "range() item")
        else:
            element = Unknown(f"loop variable {loop.item} (an item of {loop.iterable.text})")
        scope[loop.item] = element
        if loop.index:
            scope[loop.index] = Prim("int", f"loop index {loop.index}")
        return scope

    # -- values against a type --

    def check_object(
        self,
        data: dict[str, Any],
        ref: Ref,
        ctx: Ctx,
        top_level: bool = False,
        members: dict[str, tuple[Ref, int, str]] | None = None,
        additional: Ref | None = None,
    ) -> None:
        if members is None:
            members = self.types.members(ref)
            additional = self.types.additional(ref)
        for key, item in data.items():
            if top_level and key in _BICEP_KEYS:
                continue
            here = ctx.at(key)
            if key in members:
                member_type, flags, description = members[key]
                if flags & READ_ONLY:
                    self.error(here, "read-only property: ARM sets it, a template cannot")
                    continue
                self.check_value(
                    item, member_type, replace(here, closed=self.closed_by_description(description))
                )
            elif additional is not None:
                self.check_value(item, additional, here)
            else:
                known = sorted(m for m, (_, f, _) in members.items() if not f & READ_ONLY)
                self.error(here, f"unknown property{suggestion(key, known)}")
        for name, (_, flags, _) in members.items():
            if flags & REQUIRED and not flags & READ_ONLY and name not in data:
                self.error(ctx.at(name), "required property is missing")

    @staticmethod
    def closed_by_description(description: str) -> frozenset[str] | None:
        match = _ALLOWED_IN_DESCRIPTION.search(description)
        if not match:
            return None
        values = set(re.findall(r"'([^']*)'", match.group(1)))
        if match.group(2):
            values.add("")
        return frozenset(values)

    def check_value(self, item: Any, ref: Ref, ctx: Ctx) -> None:
        """Check one value (a parsed literal, loop, interpolation or expression) against ``ref``."""
        kind = self.types.kind(ref)
        if isinstance(item, Loop):
            if kind == "ArrayType":
                inner = replace(ctx, loop_vars=self.loop_scope(item, ctx))
                self.check_value(item.body, self.types.item(ref), inner.at(0))
            elif kind != "AnyType":
                self.error(ctx, f"a for-expression (an array) where {self.types.describe(ref)} belongs")
            return
        if isinstance(item, Conditional):
            self.check_value(item.body, ref, ctx)
            return
        if isinstance(item, Expr):
            self.check_expression(expr_node(item.text), ref, ctx)
            return
        if isinstance(item, Interp):
            self.compare(Prim("string", f"interpolated string '{item.text}'"), ref, ctx, item.text)
            return
        if isinstance(item, dict):
            if kind == "ObjectType":
                self.report.properties += 1
                self.check_object(item, ref, ctx)
            elif kind == "DiscriminatedObjectType":
                self.report.properties += 1
                self.check_discriminated(item, ref, ctx)
            elif kind == "UnionType":
                self.check_union_object(item, ref, ctx)
            elif kind != "AnyType":
                self.error(ctx, f"an object where {self.types.describe(ref)} belongs")
            return
        if isinstance(item, list):
            if kind == "ArrayType":
                self.report.properties += 1
                self.check_length(len(item), self.types.node(ref), ctx, "items")
                for i, element in enumerate(item):
                    self.check_value(element, self.types.item(ref), ctx.at(i))
            elif kind != "AnyType":
                self.error(ctx, f"an array where {self.types.describe(ref)} belongs")
            return
        self.compare(Known(item), ref, ctx, json.dumps(item))

    def check_expression(self, node: Node, ref: Ref, ctx: Ctx) -> None:
        """An expression: both branches of a conditional, a variable as its value, else its inferred type."""
        if node.type == "parenthesized_expression":
            self.check_expression(named(node)[0], ref, ctx)
            return
        if node.type == "ternary_expression":
            for field_name in ("consequence", "alternative"):
                branch = node.child_by_field_name(field_name)
                if branch is not None:
                    self.check_value(value(branch), ref, ctx)
            return
        if node.type == "identifier":
            name = text(node)
            unit = ctx.unit
            key = (unit.rel, name)
            if (
                name not in ctx.loop_vars
                and name in unit.file.variables
                and key not in self._vars_in_progress
            ):
                self._vars_in_progress.add(key)
                try:
                    self.check_value(unit.file.variables[name], ref, ctx)
                finally:
                    self._vars_in_progress.discard(key)
                return
        if node.type in ("object", "array", "string", "number", "boolean", "null"):
            self.check_value(value(node), ref, ctx)
            return
        self.compare(self.infer(node, ctx), ref, ctx, text(node))

    def check_discriminated(self, data: dict[str, Any], ref: Ref, ctx: Ctx, top_level: bool = False) -> None:
        node = self.types.node(ref)
        discriminator = str(node["discriminator"])
        variants = self.types.variants(ref)
        base = self.types.base_members(ref)
        chosen = data.get(discriminator)
        if discriminator not in data:
            self.error(
                ctx.at(discriminator), f"required discriminator is missing (one of {sorted(variants)})"
            )
            return
        if not isinstance(chosen, str):
            self.skip(
                ctx.at(discriminator),
                "discriminator is an expression: only the shared properties are checked",
            )
            shared = {k: v for k, v in data.items() if k in base}
            self.check_object(shared, ref, ctx, top_level, members=base, additional=None)
            return
        if chosen not in variants:
            self.error(ctx.at(discriminator), f"'{chosen}' is not one of {sorted(variants)}")
            return
        variant = variants[chosen]
        members = {**base, **self.types.members(variant)}
        self.check_object(
            data, variant, ctx, top_level, members=members, additional=self.types.additional(variant)
        )

    def check_union_object(self, data: dict[str, Any], ref: Ref, ctx: Ctx) -> None:
        objects = [
            e
            for e in self.types.elements(ref)
            if self.types.kind(e) in ("ObjectType", "DiscriminatedObjectType")
        ]
        if not objects:
            self.error(ctx, f"an object where {self.types.describe(ref)} belongs")
        elif len(objects) == 1:
            self.check_value(data, objects[0], ctx)
        else:
            self.skip(ctx, "a union of several object types: members not checked")

    def check_length(self, length: int, node: Mapping[str, Any], ctx: Ctx, unit: str) -> None:
        low, high = node.get("minLength"), node.get("maxLength")
        if low is not None and length < int(low):
            self.error(ctx, f"{length} {unit}, at least {low} needed")
        if high is not None and length > int(high):
            self.error(ctx, f"{length} {unit}, at most {high} allowed")

    # The one comparison of a static type with an expected type.
    def compare(self, st: SType, ref: Ref, ctx: Ctx, text: str) -> None:
        if isinstance(st, Prim) and st.kind == "each" and st.choices is not None:
            for i, member in enumerate(st.choices):
                shown = json.dumps(member.value) if isinstance(member, Known) else "?"
                self.compare(member, ref, ctx, f"{shown} ({text}, item {i})")
            return
        node = self.types.node(ref)
        kind = node["$type"]
        if kind in ("AnyType", "ResourceFunctionType"):
            self.report.properties += 1
            return
        if isinstance(st, Unknown):
            self.skip(ctx, f"{text}: {st.why}")
            return
        if isinstance(st, Known) and st.value is None:
            self.report.properties += 1  # null: the property is left out
            return
        if isinstance(st, Arm):
            self.compare_arm(st, ref, ctx, text)
            return
        got = _kind_of_python(st.value) if isinstance(st, Known) else st.kind
        if kind == "UnionType":
            self.compare_union(st, ref, ctx, text)
            return
        want = {
            "StringType": "string",
            "StringLiteralType": "string",
            "IntegerType": "int",
            "IntegerLiteralType": "int",
            "BooleanType": "bool",
            "BooleanLiteralType": "bool",
            "ObjectType": "object",
            "DiscriminatedObjectType": "object",
            "ArrayType": "array",
        }.get(kind)
        if want is None:
            self.skip(ctx, f"{text}: type {kind} is not modelled")
            return
        if got != want:
            self.error(ctx, f"{text} is {_a(got)}, but {_a(want)} belongs here ({self.types.describe(ref)})")
            return
        self.report.properties += 1
        values = (
            [st.value] if isinstance(st, Known) else (list(st.choices) if st.choices is not None else None)
        )
        if values is None:
            if isinstance(st, Prim):
                self.check_limits_of(st, ref, node, ctx, text)
            return
        for v in values:
            self.check_literal(v, node, ctx, text)

    def check_literal(self, v: Any, node: Mapping[str, Any], ctx: Ctx, text: str) -> None:
        kind = node["$type"]
        if kind in ("StringLiteralType", "IntegerLiteralType", "BooleanLiteralType"):
            if v != node["value"]:
                self.error(ctx, f"{json.dumps(v)} must be {json.dumps(node['value'])}")
            return
        if kind == "StringType":
            if ctx.closed is not None and v not in ctx.closed:
                self.error(
                    ctx, f"{json.dumps(v)} is not one of {sorted(ctx.closed)} (the type's description)"
                )
            self.check_length(len(v), node, ctx, "characters")
            pattern = node.get("pattern")
            if pattern:
                try:
                    if re.search(pattern, v) is None:
                        self.error(ctx, f"{json.dumps(v)} does not match {pattern}")
                except re.error:
                    self.skip(ctx, f"{text}: pattern {pattern} is not a Python regular expression")
        elif kind == "IntegerType":
            low, high = node.get("minValue"), node.get("maxValue")
            if low is not None and v < int(low):
                self.error(ctx, f"{v} is below the minimum {low}")
            if high is not None and v > int(high):
                self.error(ctx, f"{v} is above the maximum {high}")
        elif kind == "ArrayType":
            self.check_length(len(v), node, ctx, "items")

    def check_limits_of(self, st: Prim, ref: Ref, node: Mapping[str, Any], ctx: Ctx, text: str) -> None:
        """A value of a known type but unknown value: check what its declaration promises, skip the rest."""
        unchecked: list[str] = []
        if ctx.closed is not None:
            unchecked.append(f"one of {sorted(ctx.closed)}")
        if node["$type"] == "DiscriminatedObjectType" or (
            node["$type"] == "ObjectType" and self.structured(ref)
        ):
            unchecked.append("its members")
        if (
            node["$type"] == "ArrayType"
            and self.types.kind(self.types.deref(ref, node["itemType"])) != "AnyType"
        ):
            unchecked.append("its items")
        if node.get("pattern"):
            unchecked.append(f"pattern {node['pattern']}")
        for key in ("minLength", "maxLength", "minValue", "maxValue"):
            if node.get(key) is None:
                continue
            needed, promised = int(node[key]), st.limits.get(key)
            if promised is None:
                unchecked.append(f"{key} {needed}")
            elif promised < needed if key.startswith("min") else promised > needed:
                self.error(ctx, f"{st.why} allows {key} {promised}, the property needs {needed}")
        if unchecked:
            self.skip(ctx, f"{text} ({st.why}): not verifiable statically: {', '.join(unchecked)}")

    def structured(self, ref: Ref) -> bool:
        """Whether an object type says anything about its members (a Bicep ``object`` parameter does not)."""
        additional = self.types.additional(ref)
        return bool(self.types.members(ref)) or (
            additional is not None and self.types.kind(additional) != "AnyType"
        )

    def compare_union(self, st: SType, ref: Ref, ctx: Ctx, text: str) -> None:
        elements = self.types.elements(ref)
        literal_nodes = [self.types.node(e) for e in elements if self.types.kind(e).endswith("LiteralType")]
        literals = [n["value"] for n in literal_nodes]
        others = [e for e in elements if not self.types.kind(e).endswith("LiteralType")]
        open_string = any(self.types.kind(e) == "StringType" for e in others)
        assert not isinstance(st, (Unknown, Arm))
        got = _kind_of_python(st.value) if isinstance(st, Known) else st.kind
        kinds = {_kind_of_python(v) for v in literals} | {
            {
                "StringType": "string",
                "IntegerType": "int",
                "BooleanType": "bool",
                "ObjectType": "object",
                "DiscriminatedObjectType": "object",
                "ArrayType": "array",
            }.get(self.types.kind(e), "any")
            for e in others
        }
        if got not in kinds and "any" not in kinds:
            self.error(ctx, f"{text} is {_a(got)}, but {self.types.describe(ref)} belongs here")
            return
        values = (
            [st.value] if isinstance(st, Known) else (list(st.choices) if st.choices is not None else None)
        )
        if values is None:
            assert isinstance(st, Prim)
            if literals and got == _kind_of_python(literals[0]):
                closed = "closed set" if not open_string else "set of known values"
                self.skip(ctx, f"{text} ({st.why}): {closed} {literals} not verifiable without @allowed")
            else:
                self.report.properties += 1
            return
        self.report.properties += 1
        for v in values:
            if _kind_of_python(v) != "string" or not literals:
                continue
            if v not in literals:
                if open_string:
                    self.error(
                        ctx,
                        f"{json.dumps(v)} is not a known value {literals} (the type also admits other "
                        "strings; this check requires a documented value)",
                    )
                else:
                    self.error(ctx, f"{json.dumps(v)} is not one of {literals}{suggestion(v, literals)}")

    def compare_arm(self, st: Arm, ref: Ref, ctx: Ctx, text: str) -> None:
        got = self.arm_kind(st.ref)
        want = self.arm_kind(ref)
        if got is None or want is None:
            self.skip(ctx, f"{text}: {st.why} has an open type")
            return
        if got != want:
            self.error(ctx, f"{text} ({st.why}) is {_a(got)}, but {_a(want)} belongs here")
            return
        self.report.properties += 1

    def arm_kind(self, ref: Ref) -> str | None:
        kind = self.types.kind(ref)
        if kind == "UnionType":
            kinds = {self.arm_kind(e) for e in self.types.elements(ref)}
            return kinds.pop() if len(kinds) == 1 else None
        return {
            "StringType": "string",
            "StringLiteralType": "string",
            "IntegerType": "int",
            "BooleanType": "bool",
            "ObjectType": "object",
            "DiscriminatedObjectType": "object",
            "ArrayType": "array",
        }.get(kind)

    # -- modules, parameters, outputs --

    def module_unit(self, unit: Unit, mod: Module) -> Unit | None:
        return module_target(self.units, unit, mod)

    def check_module(self, unit: Unit, mod: Module) -> None:
        self.report.modules += 1
        ctx = Ctx(
            unit,
            mod.line,
            f"module {mod.symbol}",
            loop_vars=self.loop_scope(mod.loop, Ctx(unit, mod.line, mod.symbol)),
        )
        target = self.module_unit(unit, mod)
        if target is None:
            self.error(ctx, f"module file {mod.path} does not exist")
            return
        if not isinstance(mod.body, dict):
            self.skip(ctx, "module body is an expression")
            return
        for key in set(mod.body) - {"name", "params", "scope", "dependsOn"}:
            self.error(ctx.at(key), "unknown module property")
        params = mod.body.get("params", {})
        if not isinstance(params, dict):
            self.skip(ctx.at("params"), "params is an expression")
            return
        declared = target.file.params
        for name, passed in params.items():
            here = ctx.at("params").at(name)
            if name not in declared:
                self.error(here, f"{target.rel} has no parameter {name}{suggestion(name, sorted(declared))}")
                continue
            self.check_value(passed, self.param_type(declared[name]), here)
        for name, param in declared.items():
            if not param.has_default and name not in params:
                self.error(ctx.at("params").at(name), f"required parameter of {target.rel} is missing")

    def param_type(self, param: Param) -> Ref:
        return self.declared_type(param.type, param.decorators)

    def declared_type(self, type_name: str, decorators: Mapping[str, list[Any]]) -> Ref:
        """A Bicep parameter/output declaration as a type node (so ``check_value`` serves it too)."""
        limits = {
            k: decorators[k][0] for k in ("minLength", "maxLength", "minValue", "maxValue") if k in decorators
        }
        allowed = decorators.get("allowed")
        if allowed and isinstance(allowed[0], list):
            literal = {
                "string": "StringLiteralType",
                "int": "IntegerLiteralType",
                "bool": "BooleanLiteralType",
            }
            if type_name in literal and all(not isinstance(v, (Expr, Interp)) for v in allowed[0]):
                return inline(
                    {
                        "$type": "UnionType",
                        "elements": [{"$type": literal[type_name], "value": v} for v in allowed[0]],
                    }
                )
        nodes: dict[str, dict[str, Any]] = {
            "string": {"$type": "StringType"},
            "int": {"$type": "IntegerType"},
            "bool": {"$type": "BooleanType"},
            "object": {"$type": "ObjectType", "properties": {}, "additionalProperties": {"$type": "AnyType"}},
            "array": {"$type": "ArrayType", "itemType": {"$type": "AnyType"}},
        }
        return inline({**nodes.get(type_name, {"$type": "AnyType"}), **limits})

    def check_param(self, unit: Unit, name: str, param: Param) -> None:
        ctx = Ctx(unit, param.line, f"param {name}")
        allowed = param.decorators.get("allowed")
        if allowed and isinstance(allowed[0], list):
            plain = self.declared_type(
                param.type, {k: v for k, v in param.decorators.items() if k != "allowed"}
            )
            for i, v in enumerate(allowed[0]):
                self.check_value(v, plain, ctx.at("@allowed").at(i))
        if param.has_default:
            self.check_value(param.default, self.param_type(param), ctx.at("default"))

    def check_parameter_file(self, main: Unit, path: Path) -> None:
        ctx = Ctx(replace(main, rel="main.parameters.json"), 0, "")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            self.error(ctx, f"not JSON: {exc}")
            return
        for name, entry in data.get("parameters", {}).items():
            here = ctx.at(name)
            if name not in main.file.params:
                self.error(
                    here, f"main.bicep has no parameter {name}{suggestion(name, sorted(main.file.params))}"
                )
                continue
            if not isinstance(entry, dict) or "value" not in entry:
                self.skip(here, "no literal value (reference)")
                continue
            given = entry["value"]
            if isinstance(given, str) and re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*(=[^}]*)?\}", given):
                self.skip(here, f"{given}: substituted by azd from its environment")
                continue
            self.check_value(given, self.param_type(main.file.params[name]), here)

    # -- reads of resources, module outputs and JSON/object variables --

    def check_reads(self, unit: Unit) -> None:
        """Every access chain in the file whose base is a resource, a module or a known variable."""
        for node in walk(unit.root):
            if node.type == "array":
                # x[i] in a multi-line array, which the grammar splits in two (bicep.array_items)
                for item in array_items(node):
                    if isinstance(item, Expr):
                        bound = bound_names(node)
                        ctx = Ctx(
                            unit,
                            node.start_point.row + 1,
                            item.text,
                            loop_vars=dict.fromkeys(bound, Unknown("bound")),
                        )
                        errors_in_array: list[str] = []
                        self.chain(expr_node(item.text), ctx, errors_in_array)
                        for message in errors_in_array:
                            self.error(replace(ctx, subject=""), message)
                continue
            if node.type not in ("member_expression", "subscript_expression", "resource_expression"):
                continue
            parent = node.parent
            if parent is not None and parent.type in (
                "member_expression",
                "subscript_expression",
                "resource_expression",
            ):
                obj = parent.child_by_field_name("object")
                if obj is not None and obj.id == node.id:
                    continue  # not the outermost link of the chain
            bound = bound_names(node)
            ctx = Ctx(
                unit, node.start_point.row + 1, text(node), loop_vars=dict.fromkeys(bound, Unknown("bound"))
            )
            errors: list[str] = []
            self.chain(node, ctx, errors)
            for message in errors:
                self.error(replace(ctx, subject=""), message)

    def chain(self, node: Node, ctx: Ctx, errors: list[str] | None) -> SType:
        base, steps = decompose(node)
        unit = ctx.unit
        if base.type == "resource_expression":
            symbol = resource_symbol(base)
            return self.read_resource(symbol, steps, ctx, errors)
        if base.type == "identifier":
            name = text(base)
            if name in ctx.loop_vars:
                return self.apply_steps(ctx.loop_vars[name], steps, ctx, name, errors)
            if name in unit.resources:
                return self.read_resource(name, steps, ctx, errors)
            if name in unit.modules:
                return self.read_module(unit.modules[name], steps, ctx, errors)
            if name in unit.file.params:
                return self.apply_steps(self.param_static(unit.file.params[name]), steps, ctx, name, errors)
            if name in unit.file.variables:
                return self.apply_steps(self.var_static(unit, name, ctx), steps, ctx, name, errors)
            return Unknown(f"unknown name {name}")
        if base.type == "call_expression":
            return self.apply_steps(self.infer(base, ctx), steps, ctx, text(base), errors)
        return self.apply_steps(self.infer(base, ctx), steps, ctx, text(base), errors)

    def read_resource(
        self, symbol: str, steps: list[tuple[str, Any]], ctx: Ctx, errors: list[str] | None
    ) -> SType:
        res = ctx.unit.resources.get(symbol)
        if res is None:
            return Unknown(f"unknown resource {symbol}")
        if errors is not None:
            self.report.reads += 1
        if res.loop is not None:
            if not steps:
                return Prim("array", f"resource collection {symbol}")
            if steps[0][0] != "index":
                if errors is not None:
                    errors.append(
                        f"{symbol} is a resource loop: index it ({symbol}[i]) before reading .{steps[0][1]}"
                    )
                return Unknown("collection read")
            steps = steps[1:]
        if not steps:
            return Prim("object", f"resource {symbol}")
        body = self.types.body(res.type, res.api_version)
        if body is None:
            return Unknown(f"no type data for {res.type}@{res.api_version}")
        return self.walk_type(body, steps, ctx, symbol, errors)

    def walk_type(
        self, ref: Ref, steps: list[tuple[str, Any]], ctx: Ctx, label: str, errors: list[str] | None
    ) -> SType:
        for step, arg in steps:
            kind = self.types.kind(ref)
            if kind == "AnyType":
                return Unknown(f"{label} has type any")
            if step == "index":
                if kind == "ArrayType":
                    ref, label = self.types.item(ref), f"{label}[]"
                    continue
                key = self.infer(arg, ctx)
                if not (isinstance(key, Known) and isinstance(key.value, str)):
                    return Unknown(f"{label}[{text(arg)}]")
                arg = key.value
            found = self.member(ref, arg)
            if found is None:
                if errors is not None:
                    readable = sorted(self.readable_members(ref))
                    errors.append(f"{label} has no property {arg}{suggestion(arg, readable)}")
                return Unknown(f"unknown property {label}.{arg}")
            ref, flags = found
            if flags & WRITE_ONLY and errors is not None:
                errors.append(f"{label}.{arg} is write-only: ARM never returns it")
            label = f"{label}.{arg}"
        return Arm(ref, label)

    def member(self, ref: Ref, name: str) -> tuple[Ref, int] | None:
        kind = self.types.kind(ref)
        if kind == "ObjectType":
            members = self.types.members(ref)
            if name in members:
                return members[name][0], members[name][1]
            additional = self.types.additional(ref)
            return (additional, 0) if additional is not None else None
        if kind == "DiscriminatedObjectType":
            base = self.types.base_members(ref)
            if name in base:
                return base[name][0], base[name][1]
            for variant in self.types.variants(ref).values():
                found = self.member(variant, name)
                if found is not None:
                    return found
            return None
        if kind == "UnionType":
            for element in self.types.elements(ref):
                if self.types.kind(element) in ("ObjectType", "DiscriminatedObjectType"):
                    found = self.member(element, name)
                    if found is not None:
                        return found
        return None

    def readable_members(self, ref: Ref) -> list[str]:
        kind = self.types.kind(ref)
        if kind == "ObjectType":
            return [n for n, (_, f, _) in self.types.members(ref).items() if not f & WRITE_ONLY]
        if kind == "DiscriminatedObjectType":
            names = list(self.types.base_members(ref))
            for variant in self.types.variants(ref).values():
                names += self.readable_members(variant)
            return names
        return []

    def read_module(
        self, mod: Module, steps: list[tuple[str, Any]], ctx: Ctx, errors: list[str] | None
    ) -> SType:
        target = self.module_unit(ctx.unit, mod)
        if target is None:
            return Unknown(f"module {mod.symbol} has no file")
        if errors is not None:
            self.report.reads += 1
        if mod.loop is not None:
            if not steps or steps[0][0] != "index":
                if steps and errors is not None:
                    errors.append(f"{mod.symbol} is a module loop: index it before reading .{steps[0][1]}")
                return Unknown("module collection")
            steps = steps[1:]
        if not steps:
            return Prim("object", f"module {mod.symbol}")
        first = steps[0]
        if first == ("prop", "name"):
            return Prim("string", f"{mod.symbol}.name")
        if first != ("prop", "outputs") or len(steps) < 2 or steps[1][0] != "prop":
            if errors is not None:
                errors.append(f"a module exposes .name and .outputs.<name>, not {_steps_text(steps)}")
            return Unknown("module read")
        output = steps[1][1]
        if output not in target.file.outputs:
            if errors is not None:
                have = sorted(target.file.outputs)
                errors.append(
                    f"module {mod.symbol} ({target.rel}) has no output {output}{suggestion(output, have)}"
                )
            return Unknown("unknown output")
        declared = target.file.output_types.get(output, "")
        result: SType = (
            Prim(declared, f"output {mod.symbol}.{output}")
            if declared in ("string", "int", "bool", "object", "array")
            else Unknown(f"output {mod.symbol}.{output} of type {declared}")
        )
        return self.apply_steps(result, steps[2:], ctx, f"{mod.symbol}.outputs.{output}", errors)

    def apply_steps(
        self, st: SType, steps: list[tuple[str, Any]], ctx: Ctx, label: str, errors: list[str] | None
    ) -> SType:
        """Member and index access on a non-resource value (a JSON document, a literal, a builtin object)."""
        for step, arg in steps:
            if isinstance(st, Arm):
                return self.walk_type(st.ref, [(step, arg)], ctx, st.why, errors)
            if isinstance(st, Prim) and st.kind == "object" and st.choices and step == "prop":
                # An item of a literal array of objects (loop_scope): the member of every item.
                objects = [c for c in st.choices if isinstance(c, dict)]
                missing = [i for i, c in enumerate(objects) if arg not in c]
                if missing or len(objects) != len(st.choices):
                    if errors is not None and missing:
                        keys = sorted({k for c in objects for k in c if isinstance(k, str)})
                        errors.append(
                            f"{label}: item {missing[0]} of it has no key {arg!r}{suggestion(arg, keys)}"
                        )
                    return Unknown(f"member {arg} of {label}: not in every item")
                plain = replace(ctx, loop_vars={})
                members = [self.static_of_value(c[arg], plain, f"{st.why}.{arg}") for c in objects]
                joined = self.join(members, f"{st.why}.{arg}")
                if isinstance(joined, Unknown) and all(isinstance(m, Known) for m in members):
                    # Items of different kinds (one a string where the others are ints): compare each.
                    joined = Prim("each", f"{st.why}.{arg}", tuple(members))
                st, label = joined, f"{label}.{arg}"
                continue
            if isinstance(st, Known):
                key: Any = arg if step == "prop" else None
                if step == "index":
                    index = self.infer(arg, ctx)
                    if not isinstance(index, Known):
                        return Unknown(f"{label}[{text(arg)}]")
                    key = index.value
                container = st.value
                if isinstance(container, dict) and isinstance(key, str):
                    if key not in container:
                        if errors is not None:
                            self.report.reads += 1
                            keys = [k for k in container if isinstance(k, str)]
                            errors.append(f"{label} has no key {key!r}{suggestion(key, keys)}")
                        return Unknown("missing key")
                    if errors is not None:
                        self.report.reads += 1
                    st, label = Known(container[key]), f"{label}[{key!r}]"
                    continue
                if isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container):
                    st, label = Known(container[key]), f"{label}[{key}]"
                    continue
                return Unknown(f"{label}: cannot index {_kind_of_python(container)} with {key!r}")
            if isinstance(st, Prim) and st.kind == "object" and st.why.endswith("()"):
                # Members of resourceGroup(), subscription(), environment(), ...: strings but for a few.
                return Prim("object" if arg in _OBJECT_MEMBERS else "string", f"{st.why}.{arg}")
            shown = arg if step == "prop" else f"[{text(arg)}]"
            return Unknown(f"member {shown} of {label} ({getattr(st, 'why', '')})")
        return st

    # -- inference --

    def param_static(self, param: Param) -> SType:
        kinds = {"string", "int", "bool", "object", "array"}
        if param.type not in kinds:
            return Unknown(f"parameter {param.name} of type {param.type}")
        allowed = param.decorators.get("allowed")
        choices = tuple(allowed[0]) if allowed and isinstance(allowed[0], list) else None
        limits: dict[str, int] = {
            k: int(param.decorators[k][0])
            for k in ("minLength", "maxLength", "minValue", "maxValue")
            if k in param.decorators
        }
        return Prim(param.type, f"parameter {param.name}", choices, limits)

    def var_static(self, unit: Unit, name: str, ctx: Ctx) -> SType:
        key = (unit.rel, name)
        if key in self._vars_in_progress:
            return Unknown(f"variable {name} refers to itself")
        self._vars_in_progress.add(key)
        try:
            return self.static_of_value(
                unit.file.variables[name], replace(ctx, loop_vars={}), f"variable {name}"
            )
        finally:
            self._vars_in_progress.discard(key)

    def static_of_value(self, item: Any, ctx: Ctx, why: str) -> SType:
        if isinstance(item, Expr):
            return self.infer(expr_node(item.text), ctx)
        if isinstance(item, Interp):
            return Prim("string", why)
        if isinstance(item, Loop):
            return Prim("array", why)
        if isinstance(item, Conditional):
            return Unknown(why)
        if _is_literal(item):
            return Known(item)
        return Prim(_kind_of_python(item), why)

    def infer(self, node: Node, ctx: Ctx) -> SType:
        kind = node.type
        if kind in ("string", "number", "boolean", "null", "object", "array"):
            return self.static_of_value(value(node), ctx, f"{kind} literal")
        if kind == "parenthesized_expression":
            return self.infer(named(node)[0], ctx)
        if kind == "unary_expression":
            return Prim("bool" if text(node).lstrip().startswith("!") else "int", text(node))
        if kind == "binary_expression":
            operator = next((text(c) for c in node.children if not c.is_named), "")
            if operator in _COMPARISON:
                return Prim("bool", text(node))
            if operator in _ARITHMETIC:
                return Prim("int", text(node))
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if operator == "??" and left is not None and right is not None:
                return self.join([self.infer(left, ctx), self.infer(right, ctx)], text(node))
            return Unknown(f"operator {operator}")
        if kind == "ternary_expression":
            branches = [node.child_by_field_name("consequence"), node.child_by_field_name("alternative")]
            return self.join([self.infer(b, ctx) for b in branches if b is not None], text(node))
        if kind in ("identifier", "member_expression", "subscript_expression", "resource_expression"):
            return self.chain(node, ctx, None)
        if kind == "call_expression":
            return self.infer_call(node, ctx)
        return Unknown(f"{kind} {text(node)[:40]}")

    def infer_call(self, node: Node, ctx: Ctx) -> SType:
        function = node.child_by_field_name("function")
        name = text(function) if function is not None else ""
        arguments = node.child_by_field_name("arguments")
        args = named(arguments) if arguments is not None else []
        if name == "loadJsonContent" and len(args) == 1:
            path = self.infer(args[0], ctx)
            if isinstance(path, Known) and isinstance(path.value, str):
                return self.load_json(ctx, path.value)
        if name in ("take", "skip", "concat") and args:
            first = self.infer(args[0], ctx)
            kind = _kind_of_python(first.value) if isinstance(first, Known) else getattr(first, "kind", None)
            if kind in ("string", "array"):
                return Prim(kind, f"{name}()")
        if name in ("first", "last") and args:
            first = self.infer(args[0], ctx)
            if (isinstance(first, Known) and isinstance(first.value, str)) or getattr(
                first, "kind", ""
            ) == "string":
                return Prim("string", f"{name}()")
        if name == "coalesce":
            return self.join([self.infer(a, ctx) for a in args], "coalesce()")
        if name in _RETURNS:
            return Prim(_RETURNS[name], f"{name}()")
        return Unknown(f"{name}() returns what its arguments make it")

    def load_json(self, ctx: Ctx, relative: str) -> SType:
        path = Path(os.path.normpath(ctx.unit.path.parent / relative))
        if path not in self._json:
            try:
                self._json[path] = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                self.error(ctx, f"loadJsonContent('{relative}'): {exc}")
                self._json[path] = None
        loaded = self._json[path]
        return Known(loaded) if loaded is not None else Unknown(f"unreadable {relative}")

    def join(self, types: list[SType], why: str) -> SType:
        """The type of a value that is one of ``types`` (the branches of a conditional)."""
        kinds = set()
        choices: list[Any] | None = []
        for st in types:
            if isinstance(st, Known):
                kinds.add(_kind_of_python(st.value))
                if choices is not None:
                    choices.append(st.value)
            elif isinstance(st, Prim):
                kinds.add(st.kind)
                choices = None if st.choices is None or choices is None else choices + list(st.choices)
            elif isinstance(st, Arm):
                kinds.add(self.arm_kind(st.ref) or "?")
                choices = None
            else:
                return Unknown(f"{why}: {st.why}")
        kinds.discard("null")
        if len(kinds) != 1 or "?" in kinds:
            return Unknown(f"{why}: branches of different or open types")
        kind = kinds.pop()
        if choices is not None and kind in ("string", "int", "bool"):
            return Prim(kind, why, tuple(c for c in choices if c is not None))
        return Prim(kind, why)


# ---- helpers ---------------------------------------------------------------------------------------


def _steps_text(steps: list[tuple[str, Any]]) -> str:
    return "".join(f".{a}" if s == "prop" else f"[{text(a)}]" for s, a in steps)


def _is_literal(item: Any) -> bool:
    if isinstance(item, dict):
        return all(_is_literal(v) for v in item.values())
    if isinstance(item, list):
        return all(_is_literal(v) for v in item)
    return isinstance(item, (str, int, bool)) or item is None


# ---- entry point ------------------------------------------------------------------------------------


def type_check(root: Path, types: TypeData) -> Report:
    """Type-check every Bicep file under ``root``."""
    parse_report = Report()
    units = load_units(root, parse_report)
    report = Checker(root, types, units).run()
    report.errors = parse_report.errors + report.errors
    return report
