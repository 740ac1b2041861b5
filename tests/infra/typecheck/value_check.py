"""A value of a template against the type Azure gives it: literal values in full (kinds, closed sets,
lengths, ranges, patterns, required and read-only members), other values by their inferred type, and what
cannot be known statically listed as skipped."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tree_sitter import Node

from tests.infra.armtypes import READ_ONLY, REQUIRED, Ref, TypeData
from tests.infra.bicep import Conditional, Expr, Interp, Loop, value
from tests.infra.typecheck.findings import Ctx, Findings, suggestion
from tests.infra.typecheck.inference import Inference
from tests.infra.typecheck.static_types import Arm, Known, Prim, SType, Unknown, kind_of_python
from tests.infra.units import expr_node, named, text

# Keys Bicep itself adds to a resource body (not part of the resource's type).
_BICEP_KEYS = {"parent", "scope", "dependsOn"}
_ALLOWED_IN_DESCRIPTION = re.compile(r"Allowed Values: ((?:'[^']*'(?:,\s*|\s+or\s+)?)+)(or an empty string)?")


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


class ValueCheck:
    """Checks values against nodes of the type data, reporting to ``findings``."""

    def __init__(self, types: TypeData, inference: Inference, findings: Findings) -> None:
        self.types = types
        self.inference = inference
        self.report = findings.report
        self.error = findings.error
        self.skip = findings.skip

    def check_value(self, item: Any, ref: Ref, ctx: Ctx) -> None:
        """Check one value (a parsed literal, loop, interpolation or expression) against ``ref``."""
        kind = self.types.kind(ref)
        if isinstance(item, Loop):
            if kind == "ArrayType":
                inner = replace(ctx, loop_vars=self.inference.loop_scope(item, ctx))
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
                and key not in self.inference.in_progress
            ):
                self.inference.in_progress.add(key)
                try:
                    self.check_value(unit.file.variables[name], ref, ctx)
                finally:
                    self.inference.in_progress.discard(key)
                return
        if node.type in ("object", "array", "string", "number", "boolean", "null"):
            self.check_value(value(node), ref, ctx)
            return
        self.compare(self.inference.infer(node, ctx), ref, ctx, text(node))

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
        got = kind_of_python(st.value) if isinstance(st, Known) else st.kind
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
        got = kind_of_python(st.value) if isinstance(st, Known) else st.kind
        kinds = {kind_of_python(v) for v in literals} | {
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
            if literals and got == kind_of_python(literals[0]):
                closed = "closed set" if not open_string else "set of known values"
                self.skip(ctx, f"{text} ({st.why}): {closed} {literals} not verifiable without @allowed")
            else:
                self.report.properties += 1
            return
        self.report.properties += 1
        for v in values:
            if kind_of_python(v) != "string" or not literals:
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
        got = self.inference.arm_kind(st.ref)
        want = self.inference.arm_kind(ref)
        if got is None or want is None:
            self.skip(ctx, f"{text}: {st.why} has an open type")
            return
        if got != want:
            self.error(ctx, f"{text} ({st.why}) is {_a(got)}, but {_a(want)} belongs here")
            return
        self.report.properties += 1
