"""The static type of a Bicep expression: literals, parameters, variables (as their value), function results,
conditionals, loop variables, and reads of resources (their type in Azure's type data), module outputs (their
declared type) and JSON documents (``loadJsonContent``). A read that names nothing real is reported."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from tree_sitter import Node

from tests.infra.armtypes import WRITE_ONLY, Ref, TypeData
from tests.infra.bicep import Conditional, Expr, Interp, Loop, Module, Param, value
from tests.infra.typecheck.findings import Ctx, Findings, suggestion
from tests.infra.typecheck.static_types import Arm, Known, Prim, SType, Unknown, is_literal, kind_of_python
from tests.infra.units import Unit, decompose, expr_node, module_target, named, resource_symbol, text

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


class Inference:
    """What an expression of a file under check is, as far as it can be known without deploying."""

    def __init__(self, types: TypeData, units: dict[str, Unit], findings: Findings) -> None:
        self.types = types
        self.units = units
        self.report = findings.report
        self.error = findings.error
        self._json: dict[Path, Any] = {}
        self.in_progress: set[tuple[str, str]] = set()  # variables being expanded (a cycle stops there)

    def module_unit(self, unit: Unit, mod: Module) -> Unit | None:
        return module_target(self.units, unit, mod)

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
                return Unknown(f"{label}: cannot index {kind_of_python(container)} with {key!r}")
            if isinstance(st, Prim) and st.kind == "object" and st.why.endswith("()"):
                # Members of resourceGroup(), subscription(), environment(), ...: strings but for a few.
                return Prim("object" if arg in _OBJECT_MEMBERS else "string", f"{st.why}.{arg}")
            shown = arg if step == "prop" else f"[{text(arg)}]"
            return Unknown(f"member {shown} of {label} ({getattr(st, 'why', '')})")
        return st

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
        if key in self.in_progress:
            return Unknown(f"variable {name} refers to itself")
        self.in_progress.add(key)
        try:
            return self.static_of_value(
                unit.file.variables[name], replace(ctx, loop_vars={}), f"variable {name}"
            )
        finally:
            self.in_progress.discard(key)

    def static_of_value(self, item: Any, ctx: Ctx, why: str) -> SType:
        if isinstance(item, Expr):
            return self.infer(expr_node(item.text), ctx)
        if isinstance(item, Interp):
            return Prim("string", why)
        if isinstance(item, Loop):
            return Prim("array", why)
        if isinstance(item, Conditional):
            return Unknown(why)
        if is_literal(item):
            return Known(item)
        return Prim(kind_of_python(item), why)

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
            kind = kind_of_python(first.value) if isinstance(first, Known) else getattr(first, "kind", None)
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
                kinds.add(kind_of_python(st.value))
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


def _steps_text(steps: list[tuple[str, Any]]) -> str:
    return "".join(f".{a}" if s == "prop" else f"[{text(a)}]" for s, a in steps)
