"""A small reader of Bicep files for the infra tests, built on the real Bicep grammar (tree-sitter-bicep).

No Bicep compiler can be installed here, so the tests read the templates themselves: ``syntax_errors``
reports every ERROR/MISSING node of the parse, and ``load`` turns a file into plain Python values
(literals become ``str``/``int``/``bool``/``None``/``dict``/``list``; anything computed stays an ``Expr``
holding its source text; strings with ``${...}`` become ``Interp``). ``Interp.render`` substitutes the
identifiers a test knows (loop variables, parameters), which is enough to expand the resource loops of
``servicebus.bicep`` for the endpoints in ``main.parameters.json``. A resource declared inside another
becomes its own ``Resource`` (symbol ``outer::inner``, type ``outer type/inner type``); loops, conditions
and decorators of resources and modules are kept beside their bodies.
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
    return tree_errors(parse(source))


def tree_errors(root: Node) -> list[str]:
    """``syntax_errors`` of an already parsed file."""
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

    walk(root)
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
    line: int = 0


@dataclass
class Resource:
    """A ``resource`` declaration; a nested one has ``symbol`` ``outer::inner`` and its full type."""

    symbol: str
    type: str
    api_version: str
    existing: bool
    body: dict[str, Any]
    loop: Loop | None = None
    condition: Expr | None = None
    decorators: dict[str, list[Any]] = field(default_factory=dict)
    enclosing: str | None = None  # the symbol of the resource this one is declared inside
    line: int = 0

    @property
    def label(self) -> str:
        return f"{self.type}.{self.symbol}"


@dataclass
class Module:
    symbol: str
    path: str
    body: dict[str, Any]
    loop: Loop | None = None
    condition: Expr | None = None
    decorators: dict[str, list[Any]] = field(default_factory=dict)
    line: int = 0


@dataclass
class BicepFile:
    path: Path
    target_scope: str | None = None
    params: dict[str, Param] = field(default_factory=dict)
    variables: dict[str, Any] = field(default_factory=dict)
    resources: list[Resource] = field(default_factory=list)
    modules: list[Module] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    output_types: dict[str, str] = field(default_factory=dict)

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
            if prop.type != "object_property" or _named(prop)[0].type == "resource_declaration":
                continue  # a nested resource is a declaration of its own (see load), not a property
            key_node, value_node = _named(prop)[0], _named(prop)[-1]
            key = _string(key_node) if key_node.type == "string" else _text(key_node)
            result[key if isinstance(key, str) else key.text] = value(value_node)
        return result
    if kind == "array":
        return [value(c) if isinstance(c, Node) else c for c in array_items(node)]
    if kind == "for_statement":
        return _loop(node)
    if kind == "if_statement":
        condition, body = _named(node)
        return Conditional(Expr(_text(condition)), value(body))
    return Expr(_text(node))


def array_items(node: Node) -> list[Node | Expr]:
    """The items of an array node, with the grammar's split of ``x[i]`` repaired.

    tree-sitter-bicep reads ``x[i]`` on a line of a multi-line array as two items, ``x`` and ``[i]``;
    Bicep reads one index expression. An item that starts with ``[`` right where the previous one ends
    (no space between) is joined to it and returned as an ``Expr`` of the joined text.
    """
    items: list[Node | Expr] = []
    start = end = -1
    source = node.text or b""
    for child in _named(node):
        leftmost = child
        while leftmost.type in ("member_expression", "subscript_expression") and leftmost.named_children:
            leftmost = leftmost.named_children[0]
        if items and child.start_byte == end and leftmost.type == "array":
            end = child.end_byte
            items[-1] = Expr(source[start - node.start_byte : end - node.start_byte].decode())
            continue
        items.append(child)
        start, end = child.start_byte, child.end_byte
    return items


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


def _unwrap(body: Any) -> tuple[Any, Loop | None, Expr | None]:
    """Split ``[for ...: if (...) {...}]`` into its object, loop and condition."""
    loop: Loop | None = None
    condition: Expr | None = None
    if isinstance(body, Loop):
        loop, body = body, body.body
    if isinstance(body, Conditional):
        condition, body = body.condition, body.body
    return body, loop, condition


def _body_object(node: Node) -> Node | None:
    """The object node of a declaration's value (inside ``[for ...]`` and ``if (...)``)."""
    if node.type == "object":
        return node
    if node.type == "for_statement":
        body = node.child_by_field_name("body")
        return _body_object(body) if body is not None else None
    if node.type == "if_statement":
        return _body_object(_named(node)[-1])
    return None


def _resources(node: Node, enclosing: Resource | None, decorators: dict[str, list[Any]]) -> list[Resource]:
    """The resource declared by ``node`` and every resource nested inside its body."""
    children = _named(node)
    type_ref = value(children[1])
    assert isinstance(type_ref, str), f"computed resource type: {_text(node)[:60]}"
    type_, _, api = type_ref.partition("@")
    symbol = _text(children[0])
    if enclosing is not None:
        # A nested type is relative to the enclosing one ('blobServices') unless written in full.
        if not type_.lower().startswith(enclosing.type.lower() + "/"):
            type_ = f"{enclosing.type}/{type_}"
        api = api or enclosing.api_version
        symbol = f"{enclosing.symbol}::{symbol}"
    body, loop, condition = _unwrap(value(children[-1]))
    resource = Resource(
        symbol=symbol,
        type=type_,
        api_version=api,
        existing=any(c.type == "existing" for c in node.children),
        body=body,
        loop=loop,
        condition=condition,
        decorators=decorators,
        enclosing=enclosing.symbol if enclosing is not None else None,
        line=node.start_point.row + 1,
    )
    found = [resource]
    obj = _body_object(children[-1])
    if obj is not None:
        pending: dict[str, list[Any]] = {}
        for prop in _named(obj):
            if prop.type == "decorators":
                pending = _decorators(prop)
                continue
            inner = _named(prop)[0] if prop.type == "object_property" else None
            if inner is not None and inner.type == "resource_declaration":
                found.extend(_resources(inner, resource, pending))
            pending = {}
    return found


def load_source(path: Path, source: bytes, root: Node | None = None) -> BicepFile:
    """Read Bicep ``source`` (as if it were ``path``, parsed as ``root``) into a ``BicepFile``.

    Assumes a clean parse (see ``syntax_errors``).
    """
    root = root if root is not None else parse(source)
    out = BicepFile(path=path)
    pending: dict[str, list[Any]] = {}
    for node in _named(root):
        kind = node.type
        if kind == "decorators":
            pending = _decorators(node)
            continue
        children = _named(node)
        line = node.start_point.row + 1
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
                line=line,
            )
        elif kind == "variable_declaration":
            out.variables[_text(children[0])] = value(children[-1])
        elif kind == "resource_declaration":
            out.resources.extend(_resources(node, None, pending))
        elif kind == "module_declaration":
            mod_path = value(children[1])
            assert isinstance(mod_path, str)
            body, loop, condition = _unwrap(value(children[-1]))
            out.modules.append(
                Module(
                    symbol=_text(children[0]),
                    path=mod_path,
                    body=body,
                    loop=loop,
                    condition=condition,
                    decorators=pending,
                    line=line,
                )
            )
        elif kind == "output_declaration":
            out.outputs[_text(children[0])] = value(children[-1])
            out.output_types[_text(children[0])] = _text(children[1])
        pending = {}
    return out


def load(path: Path) -> BicepFile:
    """Read one Bicep file into a ``BicepFile`` (call ``syntax_errors`` first: this assumes a clean parse)."""
    return load_source(path, path.read_bytes())


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
