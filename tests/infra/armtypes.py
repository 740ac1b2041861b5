"""Azure's resource type definitions as the Bicep compiler reads them (Azure/bicep-types-az, vendored).

``tests/infra/bicep-types/`` holds ``index.json`` (resource type -> the API versions that exist) and one
``<provider>/<apiVersion>/types.json`` per provider and API version that ``infra/`` uses (provenance in its
README). A ``types.json`` is a JSON array of type nodes; a node refers to another with ``{"$ref": "#/N"}``.

A type is addressed by a ``Ref``: a node of one vendored file, or an inline node (the checker describes a
Bicep parameter's declared type with the same node shapes, so one comparison serves both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TYPES_DIR = Path(__file__).resolve().parent / "bicep-types"

# Property flags of an ObjectType member (bicep-types format).
REQUIRED = 1
READ_ONLY = 2
WRITE_ONLY = 4
# ResourceType scope bits: where a resource can be deployed. Extension resources (role assignments,
# locks, diagnostic settings) attach to another resource with `scope:`.
SCOPE_EXTENSION = 16


@dataclass(frozen=True)
class Ref:
    """A type node: ``index`` into vendored file ``file``, or ``inline`` (a node built by the checker)."""

    file: str = ""
    index: int = -1
    inline: Any = None


def inline(node: dict[str, Any]) -> Ref:
    """A ``Ref`` to a node that is not in any vendored file."""
    return Ref(inline=_Frozen(node))


class _Frozen:
    """Hashable holder of an inline node (so ``Ref`` stays a frozen, hashable value)."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node

    def __repr__(self) -> str:
        return f"inline({self.node.get('$type')})"


ANY = inline({"$type": "AnyType"})


class TypeData:
    """The vendored type definitions: which types and API versions exist, and their type graphs."""

    def __init__(self, root: Path = TYPES_DIR) -> None:
        self.root = root
        raw_index: dict[str, list[str]] = json.loads((root / "index.json").read_text())
        # ARM resource type names are case-insensitive; the index has a few spellings of one type.
        self._versions: dict[str, set[str]] = {}
        self._names: dict[str, str] = {}
        for name, versions in raw_index.items():
            self._versions.setdefault(name.lower(), set()).update(versions)
            self._names.setdefault(name.lower(), name)
        self._files: dict[str, list[dict[str, Any]]] = {}
        self._bodies: dict[tuple[str, str], Ref] = {}
        self._scopes: dict[tuple[str, str], int] = {}
        for path in sorted(root.glob("*/*/types.json")):
            key = path.relative_to(root).as_posix()
            nodes: list[dict[str, Any]] = json.loads(path.read_text())
            self._files[key] = nodes
            for node in nodes:
                if node["$type"] == "ResourceType":
                    type_name, _, api = node["name"].partition("@")
                    ident = (type_name.lower(), api)
                    self._bodies[ident] = self.deref(Ref(key), node["body"])
                    self._scopes[ident] = int(node.get("writableScopes", 0))

    # ---- resource types ------------------------------------------------------------------------------

    def versions(self, type_name: str) -> list[str] | None:
        """Every API version of ``type_name`` (None: no such resource type)."""
        found = self._versions.get(type_name.lower())
        return sorted(found) if found is not None else None

    def type_names(self) -> list[str]:
        """Every resource type of the index."""
        return sorted(self._names.values())

    def body(self, type_name: str, api: str) -> Ref | None:
        """The body type of ``type_name@api`` (None: not vendored)."""
        return self._bodies.get((type_name.lower(), api))

    def writable_scopes(self, type_name: str, api: str) -> int:
        return self._scopes.get((type_name.lower(), api), 0)

    def vendored(self) -> list[str]:
        """The vendored ``<provider>/<apiVersion>/types.json`` files."""
        return sorted(self._files)

    # ---- type nodes ----------------------------------------------------------------------------------

    def node(self, ref: Ref) -> dict[str, Any]:
        if ref.inline is not None:
            node: dict[str, Any] = ref.inline.node
            return node
        return self._files[ref.file][ref.index]

    def deref(self, origin: Ref, pointer: Any) -> Ref:
        """The type that ``pointer`` (a ``{"$ref": "#/N"}`` or an inline node) names, seen from ``origin``."""
        if isinstance(pointer, Ref):
            return pointer
        if isinstance(pointer, dict) and "$ref" in pointer:
            return Ref(origin.file, int(str(pointer["$ref"]).rsplit("/", 1)[-1]))
        assert isinstance(pointer, dict) and "$type" in pointer, pointer
        return inline(pointer)

    def kind(self, ref: Ref) -> str:
        return str(self.node(ref)["$type"])

    def members(self, ref: Ref) -> dict[str, tuple[Ref, int, str]]:
        """An ObjectType's properties: name -> (type, flags, description)."""
        node = self.node(ref)
        return {
            name: (self.deref(ref, spec["type"]), int(spec.get("flags", 0)), str(spec.get("description", "")))
            for name, spec in node.get("properties", {}).items()
        }

    def additional(self, ref: Ref) -> Ref | None:
        """An ObjectType's ``additionalProperties`` type (free-form keys), if any."""
        node = self.node(ref)
        return self.deref(ref, node["additionalProperties"]) if "additionalProperties" in node else None

    def elements(self, ref: Ref) -> list[Ref]:
        """A UnionType's members."""
        return [self.deref(ref, e) for e in self.node(ref).get("elements", [])]

    def item(self, ref: Ref) -> Ref:
        """An ArrayType's item type."""
        return self.deref(ref, self.node(ref)["itemType"])

    def base_members(self, ref: Ref) -> dict[str, tuple[Ref, int, str]]:
        """A DiscriminatedObjectType's properties shared by every variant."""
        node = self.node(ref)
        return {
            name: (self.deref(ref, spec["type"]), int(spec.get("flags", 0)), str(spec.get("description", "")))
            for name, spec in node.get("baseProperties", {}).items()
        }

    def variants(self, ref: Ref) -> dict[str, Ref]:
        """A DiscriminatedObjectType's variants: discriminator value -> ObjectType."""
        return {value: self.deref(ref, pointer) for value, pointer in self.node(ref)["elements"].items()}

    def describe(self, ref: Ref) -> str:
        """A short human name of a type (for messages)."""
        node = self.node(ref)
        kind = node["$type"]
        if kind == "StringLiteralType":
            return repr(node["value"])
        if kind == "UnionType":
            return " | ".join(self.describe(e) for e in self.elements(ref))
        if kind == "ArrayType":
            return f"array of {self.describe(self.item(ref))}"
        if kind in ("ObjectType", "DiscriminatedObjectType"):
            return f"object {node.get('name', '')}".strip()
        names = {"StringType": "string", "IntegerType": "int", "BooleanType": "bool", "AnyType": "any"}
        return names.get(str(kind), str(kind))


@cache
def type_data(root: Path = TYPES_DIR) -> TypeData:
    """The vendored type data, read once per process (the mutation test reuses it for every mutant)."""
    return TypeData(root)
