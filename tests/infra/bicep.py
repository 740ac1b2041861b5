"""A small reader of Bicep files for the infra tests, built on the real Bicep grammar (tree-sitter-bicep).

No Bicep compiler can be installed here, so the tests read the templates themselves: ``syntax_errors``
reports every ERROR/MISSING node of the parse, and ``load`` turns a file into plain Python values
(literals become ``str``/``int``/``bool``/``None``/``dict``/``list``; anything computed stays an ``Expr``
holding its source text; strings with ``${...}`` become ``Interp``). ``Interp.render`` substitutes the
identifiers a test knows (loop variables, parameters), which is enough to expand the resource loops of
``servicebus.bicep`` for the endpoints in ``main.parameters.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import tree_sitter_bicep
from tree_sitter import Language, Node, Parser

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"


@cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bicep.language()))


def parse(source: bytes) -> Node:
    """The root node of ``source`` parsed with the Bicep grammar."""
    return _parser().parse(source).root_node


def syntax_errors(source: bytes) -> list[str]:
    """Every ERROR or MISSING node of the parse, as ``line:column kind text`` (empty: the file parses)."""
    found: list[str] = []

    def walk(node: Node) -> None:
        if node.is_error or node.is_missing:
            kind = "MISSING" if node.is_missing else "ERROR"
            text = node.text.decode(errors="replace")[:60] if node.text else ""
            found.append(
                f"{node.start_point.row + 1}:{node.start_point.column + 1} {kind} {node.type} {text!r}"
            )
        for child in node.children:
            walk(child)

    walk(parse(source))
    return found


def bicep_files() -> list[Path]:
    """Every .bicep file under infra/."""
    return sorted(INFRA.rglob("*.bicep"))


@dataclass(frozen=True)
class Expr:
    """A value computed at deployment time, kept as its Bicep source text."""

    text: str


@dataclass(frozen=True)
class Interp:
    """A string with ``${...}`` interpolations: literal parts and ``Expr`` parts."""

    parts: tuple[str | Expr, ...]

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else "${" + p.text + "}" for p in self.parts)

    def render(self, env: dict[str, str]) -> str:
        """Substitute each interpolation from ``env`` (KeyError if one is not known)."""
        return "".join(p if isinstance(p, str) else env[p.text] for p in self.parts)


@dataclass(frozen=True)
class Loop:
    """``[for item in iterable: body]`` / ``[for (item, index) in iterable: body]``."""

    item: str
    index: str | None
    iterable: Expr
    body: Any


@dataclass(frozen=True)
class Conditional:
    """``if (condition) body``."""

    condition: Expr
    body: Any


@dataclass
class Param:
    name: str
    type: str
    default: Any
    has_default: bool
    decorators: dict[str, list[Any]]


@dataclass
class Resource:
    symbol: str
    type: str
    api_version: str
    existing: bool
    body: dict[str, Any]
    loop: Loop | None = None
    condition: Expr | None = None

    @property
    def label(self) -> str:
        return f"{self.type}.{self.symbol}"


@dataclass
class Module:
    symbol: str
    path: str
    body: dict[str, Any]


@dataclass
class BicepFile:
    path: Path
    target_scope: str | None = None
    params: dict[str, Param] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)
    resources: list[Resource] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def resource(self, symbol: str) -> Resource:
        for r in self.resources:
            if r.symbol == symbol:
                return r
        raise KeyError(f"{self.path.name}: no resource {symbol!r}")

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type.lower() == type_.lower()]


_ESCAPES = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


def _text(node: Node) -> str:
    return node.text.decode() if node.text else ""


def _named(node: Node) -> list[Node]:
    return [c for c in node.named_children if c.type != "comment"]


def _string(node: Node) -> str | Interp:
    parts: list[str | Expr] = []
    for child in node.named_children:
        if child.type == "string_content":
            parts.append(_text(child))
        elif child.type == "escape_sequence":
            parts.append(_ESCAPES.get(_text(child), _text(child)))
        elif child.type == "interpolation":
            parts.append(Expr(_text(_named(child)[0])))
    merged: list[str | Expr] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    if all(isinstance(p, str) for p in merged):
        return "".join(p for p in merged if isinstance(p, str))
    return Interp(tuple(merged))


def value(node: Node) -> Any:
    """The Python value of an expression node (see the module docstring)."""
    kind = node.type
    if kind == "string":
        return _string(node)
    if kind == "number":
        return int(_text(node))
    if kind == "boolean":
        return _text(node) == "true"
    if kind == "null":
        return None
    if kind == "object":
        result: dict[str, Any] = {}
        for prop in _named(node):
            if prop.type != "object_property":
                continue
            key_node, value_node = _named(prop)[0], _named(prop)[-1]
            key = _string(key_node) if key_node.type == "string" else _text(key_node)
            result[key if isinstance(key, str) else key.text] = value(value_node)
        return result
    if kind == "array":
        return [value(c) for c in _named(node)]
    if kind == "for_statement":
        return _loop(node)
    if kind == "if_statement":
        condition, body = _named(node)
        return Conditional(Expr(_text(condition)), value(body))
    return Expr(_text(node))


def _loop(node: Node) -> Loop:
    body = node.child_by_field_name("body")
    assert body is not None, _text(node)
    head = [c for c in _named(node) if c.id != body.id]
    if head[0].type == "for_loop_parameters":
        item = _text(head[0].named_children[0])
        index: str | None = _text(head[0].named_children[1])
    else:
        item, index = _text(head[0]), None
    return Loop(item=item, index=index, iterable=Expr(_text(head[1])), body=value(body))


def _decorators(node: Node) -> dict[str, list[Any]]:
    result: dict[str, list[Any]] = {}
    for decorator in _named(node):
        call = _named(decorator)[0]
        if call.type == "call_expression":
            name = _text(_named(call)[0])
            args = call.child_by_field_name("arguments") or _named(call)[-1]
            result[name] = [value(a) for a in _named(args)]
        else:
            result[_text(call)] = []
    return result


def load(path: Path) -> BicepFile:
    """Read one Bicep file into a ``BicepFile`` (call ``syntax_errors`` first: this assumes a clean parse)."""
    root = parse(path.read_bytes())
    out = BicepFile(path=path)
    pending: dict[str, list[Any]] = {}
    for node in _named(root):
        kind = node.type
        if kind == "decorators":
            pending = _decorators(node)
            continue
        children = _named(node)
        if kind == "target_scope_assignment":
            scope = value(children[0])
            out.target_scope = scope if isinstance(scope, str) else None
        elif kind == "parameter_declaration":
            has_default = len(children) >= 3
            out.params[_text(children[0])] = Param(
                name=_text(children[0]),
                type=_text(children[1]),
                default=value(children[2]) if has_default else None,
                has_default=has_default,
                decorators=pending,
            )
        elif kind == "variable_declaration":
            out.variables[_text(children[0])] = value(children[-1])
        elif kind == "resource_declaration":
            type_ref = value(children[1])
            assert isinstance(type_ref, str), f"{path.name}: computed resource type"
            type_, _, api = type_ref.partition("@")
            body = value(children[-1])
            loop: Loop | None = None
            condition: Expr | None = None
            if isinstance(body, Loop):
                loop, body = body, body.body
            if isinstance(body, Conditional):
                condition, body = body.condition, body.body
            out.resources.append(
                Resource(
                    symbol=_text(children[0]),
                    type=type_,
                    api_version=api,
                    existing=any(c.type == "existing" for c in node.children),
                    body=body,
                    loop=loop,
                    condition=condition,
                )
            )
        elif kind == "module_declaration":
            mod_path = value(children[1])
            assert isinstance(mod_path, str)
            out.modules.append(Module(symbol=_text(children[0]), path=mod_path, body=value(children[-1])))
        elif kind == "output_declaration":
            out.outputs[_text(children[0])] = value(children[-1])
        pending = {}
    return out


@cache
def load_infra(relative: str) -> BicepFile:
    """``load`` of ``infra/<relative>``, cached for the session."""
    return load(INFRA / relative)


def walk_values(data: Any) -> list[Any]:
    """Every value nested in ``data`` (dicts, lists, loops, conditionals), depth first."""
    found = [data]
    if isinstance(data, dict):
        for item in data.values():
            found.extend(walk_values(item))
    elif isinstance(data, list):
        for item in data:
            found.extend(walk_values(item))
    elif isinstance(data, (Loop, Conditional)):
        found.extend(walk_values(data.body))
    return found
