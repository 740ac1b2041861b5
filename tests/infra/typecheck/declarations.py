"""The type check's walk over infra/: every resource (type, API version, parent, scope, dependsOn, body),
module call (its parameters), parameter (default, @allowed), output and read of every file, and the
parameter file; ``type_check`` is the entry point."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from tests.infra.armtypes import SCOPE_EXTENSION, Ref, TypeData, inline
from tests.infra.bicep import Expr, Interp, Module, Param, Resource, array_items
from tests.infra.report import Report
from tests.infra.typecheck.findings import Ctx, Findings, suggestion
from tests.infra.typecheck.inference import Inference
from tests.infra.typecheck.static_types import Unknown
from tests.infra.typecheck.value_check import ValueCheck
from tests.infra.units import Unit, bound_names, expr_node, load_units, named, text, walk


class Checker:
    """Type-checks every Bicep file under ``root`` (a copy of infra/ in the mutation test)."""

    def __init__(self, root: Path, types: TypeData, units: dict[str, Unit]) -> None:
        self.root = root
        self.types = types
        self.units = units
        self.report = Report(files=len(units))
        findings = Findings(self.report)
        self.error = findings.error
        self.skip = findings.skip
        self.inference = Inference(types, units, findings)
        self.values = ValueCheck(types, self.inference, findings)

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
                self.values.check_value(out, self.declared_type(unit.file.output_types[name], {}), ctx)
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

    def check_resource(self, unit: Unit, res: Resource) -> None:
        self.report.resources += 1
        ctx = Ctx(
            unit,
            res.line,
            res.symbol,
            loop_vars=self.inference.loop_scope(res.loop, Ctx(unit, res.line, res.symbol)),
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
            name_type = self.inference.member(body, "name")
            if "name" not in res.body:
                self.error(ctx.at("name"), "required property is missing")
            elif name_type is not None:
                self.values.check_value(res.body["name"], name_type[0], ctx.at("name"))
            return
        if self.types.kind(body) == "DiscriminatedObjectType":
            self.values.check_discriminated(res.body, body, ctx, top_level=True)
        else:
            self.values.check_object(res.body, body, ctx, top_level=True)

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

    def check_module(self, unit: Unit, mod: Module) -> None:
        self.report.modules += 1
        ctx = Ctx(
            unit,
            mod.line,
            f"module {mod.symbol}",
            loop_vars=self.inference.loop_scope(mod.loop, Ctx(unit, mod.line, mod.symbol)),
        )
        target = self.inference.module_unit(unit, mod)
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
            self.values.check_value(passed, self.param_type(declared[name]), here)
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
                self.values.check_value(v, plain, ctx.at("@allowed").at(i))
        if param.has_default:
            self.values.check_value(param.default, self.param_type(param), ctx.at("default"))

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
            self.values.check_value(given, self.param_type(main.file.params[name]), here)

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
                        self.inference.chain(expr_node(item.text), ctx, errors_in_array)
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
            self.inference.chain(node, ctx, errors)
            for message in errors:
                self.error(replace(ctx, subject=""), message)


def type_check(root: Path, types: TypeData) -> Report:
    """Type-check every Bicep file under ``root``."""
    parse_report = Report()
    units = load_units(root, parse_report)
    report = Checker(root, types, units).run()
    report.errors = parse_report.errors + report.errors
    return report
