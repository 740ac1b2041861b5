"""What the type check knows of a Bicep expression's value without deploying it: the value itself, a Bicep
type (and the few values it may take), a node of Azure's type data, or nothing (and why)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.infra.armtypes import Ref


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


def kind_of_python(v: Any) -> str:
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


def is_literal(item: Any) -> bool:
    if isinstance(item, dict):
        return all(is_literal(v) for v in item.values())
    if isinstance(item, list):
        return all(is_literal(v) for v in item)
    return isinstance(item, (str, int, bool)) or item is None
