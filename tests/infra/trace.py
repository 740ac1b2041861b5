"""Where a value in infra/ comes from: expressions followed through variables, module parameters and outputs.

``Tracer.trace`` turns a value into a normal form in which a module parameter is replaced by what its
(single) caller passes, a variable by its value and a module output by the output's expression, down to
parameters of main.bicep, literals, function calls and reads of resources. Two values with the same
normal form are the same value, so a rule can say "the deployment URL is the host account's blob endpoint
followed by the deployment container's name" or "the app setting and the topic property come from one
parameter", whichever module each one sits in.

Normal forms (tuples): ``("lit", v)``, ``("concat", parts)``, ``("param", file, name)``,
``("read", file, symbol, steps)`` (a resource and the member/index steps read from it), ``("loop", name)``,
``("op", operator, operands...)``, ``("call", name, args...)``, ``("object", items)``, ``("array", items)``,
``("expr", text)`` for anything else.
"""

from __future__ import annotations

from typing import Any

from tree_sitter import Node

from tests.infra.bicep import Conditional, Expr, Interp, Loop, value
from tests.infra.units import Unit, decompose, expr_node, module_target, named, resource_symbol, text

Form = tuple[Any, ...]


class Tracer:
    """Normal forms of values of the units of one checked tree."""

    def __init__(self, units: dict[str, Unit]) -> None:
        self.units = units
        self._active: set[tuple[str, str]] = set()

    def callers(self, unit: Unit) -> list[tuple[Unit, Any]]:
        """(caller unit, module declaration) for every module call of ``unit``."""
        return [
            (other, mod)
            for other in self.units.values()
            for mod in other.file.modules
            if module_target(self.units, other, mod) is unit
        ]

    def trace(self, unit: Unit, item: Any, loop_vars: frozenset[str] = frozenset()) -> Form:
        if isinstance(item, Expr):
            return self.trace_node(unit, expr_node(item.text), loop_vars)
        if isinstance(item, Interp):
            parts = [("lit", p) if isinstance(p, str) else self.trace(unit, p, loop_vars) for p in item.parts]
            return parts[0] if len(parts) == 1 else ("concat", *parts)
        if isinstance(item, Loop):
            inner = loop_vars | {item.item} | ({item.index} if item.index else set())
            return ("for", self.trace(unit, item.iterable, loop_vars), self.trace(unit, item.body, inner))
        if isinstance(item, Conditional):
            return ("if", self.trace(unit, item.condition, loop_vars), self.trace(unit, item.body, loop_vars))
        if isinstance(item, dict):
            return ("object", tuple(sorted((k, self.trace(unit, v, loop_vars)) for k, v in item.items())))
        if isinstance(item, list):
            return ("array", tuple(self.trace(unit, v, loop_vars) for v in item))
        return ("lit", item)

    def trace_node(self, unit: Unit, node: Node, loop_vars: frozenset[str]) -> Form:
        kind = node.type
        if kind in ("string", "number", "boolean", "null", "object", "array"):
            return self.trace(unit, value(node), loop_vars)
        if kind == "parenthesized_expression":
            return self.trace_node(unit, named(node)[0], loop_vars)
        if kind == "identifier":
            return self.name(unit, text(node), loop_vars)
        if kind in ("member_expression", "subscript_expression", "resource_expression"):
            return self.access(unit, node, loop_vars)
        if kind == "ternary_expression":
            parts = [node.child_by_field_name(f) for f in ("condition", "consequence", "alternative")]
            return ("op", "?:", *(self.trace_node(unit, p, loop_vars) for p in parts if p is not None))
        if kind in ("binary_expression", "unary_expression"):
            operator = next((text(c) for c in node.children if not c.is_named), "")
            return ("op", operator, *(self.trace_node(unit, c, loop_vars) for c in named(node)))
        if kind == "call_expression":
            function = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            args = named(arguments) if arguments is not None else []
            name = text(function) if function is not None else ""
            return ("call", name, *(self.trace_node(unit, a, loop_vars) for a in args))
        return ("expr", text(node))

    def name(self, unit: Unit, name: str, loop_vars: frozenset[str]) -> Form:
        if name in loop_vars:
            return ("loop", name)
        key = (unit.rel, name)
        if key in self._active:
            return ("expr", name)
        self._active.add(key)
        try:
            if name in unit.file.variables:
                return self.trace(unit, unit.file.variables[name])
            if name in unit.file.params:
                callers = self.callers(unit)
                if len(callers) == 1:
                    caller, mod = callers[0]
                    passed = mod.body.get("params", {}) if isinstance(mod.body, dict) else {}
                    if name in passed:
                        return self.trace(caller, passed[name])
                param = unit.file.params[name]
                if callers and param.has_default:
                    return self.trace(unit, param.default)
                return ("param", unit.rel, name)
            if name in unit.resources:
                return ("read", unit.rel, name, ())
            return ("expr", name)
        finally:
            self._active.discard(key)

    def access(self, unit: Unit, node: Node, loop_vars: frozenset[str]) -> Form:
        base, steps = decompose(node)
        traced_steps = tuple(
            (step, arg if step == "prop" else self.trace_node(unit, arg, loop_vars)) for step, arg in steps
        )
        if base.type == "resource_expression":
            return ("read", unit.rel, resource_symbol(base), traced_steps)
        if base.type == "identifier":
            name = text(base)
            if name in unit.resources and name not in loop_vars:
                return ("read", unit.rel, name, traced_steps)
            if name in unit.modules and name not in loop_vars:
                mod = unit.modules[name]
                target = module_target(self.units, unit, mod)
                rest = list(steps)
                if mod.loop is not None and rest and rest[0][0] == "index":
                    rest = rest[1:]
                if target is not None and len(rest) >= 2 and rest[0] == ("prop", "outputs"):
                    output = rest[1][1]
                    if output in target.file.outputs:
                        inner = self.trace(target, target.file.outputs[output])
                        return (
                            inner if len(rest) == 2 else ("member", inner, traced_steps[-(len(rest) - 2) :])
                        )
        return ("member", self.trace_node(unit, base, loop_vars), traced_steps)
