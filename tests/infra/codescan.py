"""Find every app setting the Python code reads, by reading its syntax tree (no import, no I/O).

Reads: ``env("NAME")`` / ``env_flag("NAME")`` (common/settings.py), ``os.environ.get/[...]``,
``os.getenv``; the name may be a literal, a module-level string constant, or an f-string of constants.
Numbered settings (one per storage account, ``SETTLE_TABLES_{i}__tableServiceUri``): the code declares the
pattern once as a module constant holding ``{i}`` and reads ``PATTERN.format(i=...)``; the scan records the
pattern itself (``Scan.numbered``), which the Bicep must set for i = 1..N-1 (tests/infra/settings.py). Any
other computed name (an f-string of a variable) stays unresolved.
Binding expressions: any string that is exactly ``%NAME%`` (``topic_name="%RESOLVER_TOPIC%"``).
Binding connections: ``connection="Prefix"`` in a trigger/binding decorator (an app-setting prefix).
A read whose name cannot be resolved statically is reported as unresolved, so nothing slips through.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.infra.bicep import REPO

_BINDING = re.compile(r"^%([A-Za-z_][A-Za-z0-9_]*)%$")
_READERS = {"env", "env_flag", "getenv"}
NUMBER = "{i}"  # the placeholder of a numbered setting's pattern


@dataclass
class Scan:
    reads: dict[str, set[str]] = field(default_factory=dict)  # setting -> files
    connections: dict[str, set[str]] = field(default_factory=dict)  # connection prefix -> files
    numbered: dict[str, set[str]] = field(default_factory=dict)  # "NAME_{i}..." pattern -> files
    unresolved: list[str] = field(default_factory=list)

    def add(self, bucket: dict[str, set[str]], name: str, where: str) -> None:
        bucket.setdefault(name, set()).add(where)


def sources() -> list[Path]:
    """Every Python file of the code package (infra/package.py: what .funcignore keeps): function_app.py
    and every package that runs in Azure (common, state, handoff, management, console, ...)."""
    spec = importlib.util.spec_from_file_location("settle_package", REPO / "infra" / "package.py")
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, package)  # dataclasses look their module up while it executes
    spec.loader.exec_module(package)
    files = [REPO / rel for rel in package.package_files(REPO) if rel.endswith(".py")]
    return [f for f in files if f.is_file()]


def _constants(tree: ast.Module) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _resolve(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif isinstance(part, ast.FormattedValue) and not part.format_spec:
                inner = _resolve(part.value, constants)
                if inner is None:
                    return None
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    return None


def _numbered(node: ast.expr, constants: dict[str, str]) -> str | None:
    """The pattern of ``PATTERN.format(i=<anything>)``, PATTERN a constant holding ``{i}`` once and no other
    placeholder (so the name is the pattern with a number in place of ``{i}``)."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and not node.args
        and [kw.arg for kw in node.keywords] == ["i"]
    ):
        return None
    pattern = _resolve(node.func.value, constants)
    if pattern is None or pattern.count(NUMBER) != 1 or "{" in pattern.replace(NUMBER, ""):
        return None
    return pattern


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _accessor_params(tree: ast.Module) -> set[int]:
    """ids of the Name nodes that are an accessor's own parameter (inside ``def env(name, ...)``)."""
    ids: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in _READERS:
            params = {a.arg for a in fn.args.args}
            ids |= {id(n) for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in params}
    return ids


def scan_source(text: str, where: str, scan: Scan, shared: dict[str, str] | None = None) -> Scan:
    """Add the settings read by one module's source ``text`` to ``scan``."""
    tree = ast.parse(text)
    constants = {**(shared or {}), **_constants(tree)}
    # The accessors themselves (common/settings.py: env(name) reads os.environ.get(name)) pass a name through.
    passthrough = _accessor_params(tree)

    def read(arg: ast.expr, node: ast.expr) -> None:
        resolved = _resolve(arg, constants)
        pattern = _numbered(arg, constants)
        if resolved is not None:
            scan.add(scan.reads, resolved, where)
        elif pattern is not None:
            scan.add(scan.numbered, pattern, where)
        elif id(arg) not in passthrough:
            scan.unresolved.append(f"{where}:{node.lineno} {ast.unparse(node)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _BINDING.match(node.value)
            if match:
                scan.add(scan.reads, match.group(1), where)
        elif isinstance(node, ast.Call):
            func = node.func
            if node.args and (
                (isinstance(func, ast.Name) and func.id in _READERS)
                or (isinstance(func, ast.Attribute) and func.attr == "getenv")
                or (isinstance(func, ast.Attribute) and func.attr == "get" and _is_environ(func.value))
            ):
                read(node.args[0], node)
            for kw in node.keywords:
                if kw.arg == "connection":
                    conn = _resolve(kw.value, constants)
                    if conn is None:
                        scan.unresolved.append(f"{where}:{node.lineno} connection={ast.unparse(kw.value)}")
                    else:
                        scan.add(scan.connections, conn, where)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            read(node.slice, node)
    return scan


@cache
def scan_code() -> Scan:
    """Scan every source of the app; constants of one module are also known to the others (scanned once
    per process: the code does not change while the checks run)."""
    texts = {path: path.read_text() for path in sources()}
    shared: dict[str, str] = {}
    for text in texts.values():
        shared.update(_constants(ast.parse(text)))
    scan = Scan()
    for path, text in texts.items():
        scan_source(text, path.relative_to(REPO).as_posix(), scan, shared)
    return scan
