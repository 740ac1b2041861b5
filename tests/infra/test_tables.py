"""The tables the Bicep creates are exactly the tables the code uses."""

from __future__ import annotations

import ast
import json

from tests.infra.bicep import Interp, load_infra
from tests.infra.codescan import sources


def code_tables() -> dict[str, str]:
    """Logical table names: module-level ``*_TABLE = "name"`` constants and ``.table("name")`` literals."""
    found: dict[str, str] = {}
    for path in sources():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith("_TABLE")
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                found[node.value.value] = f"{path.name}:{node.targets[0].id}"
        for call in ast.walk(tree):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "table"
                and call.args
                and isinstance(call.args[0], ast.Constant)
                and isinstance(call.args[0].value, str)
            ):
                found[call.args[0].value] = f"{path.name}:{call.lineno}"
    return found


def test_bicep_table_list_equals_the_tables_in_code() -> None:
    bicep_tables = load_infra("main.bicep").variables["settleTables"]
    assert sorted(bicep_tables) == sorted(code_tables()), code_tables()


def test_tables_are_named_with_the_prefix_the_app_reads() -> None:
    main = load_infra("main.bicep")
    storage_call = next(m for m in main.modules if m.path == "modules/storage.bicep")
    loop = storage_call.body["params"]["tableNames"]
    assert loop.iterable.text == "settleTables"
    assert isinstance(loop.body, Interp)
    rendered = [
        loop.body.render({"tablePrefix": "settle", loop.item: t}) for t in main.variables["settleTables"]
    ]
    assert all(name.isalnum() and 3 <= len(name) <= 63 and name[0].isalpha() for name in rendered), rendered
    # The same prefix goes to the app as SETTLE_TABLE_PREFIX, and the parameter file sets it.
    app_call = next(m for m in main.modules if m.path == "modules/functionapp.bicep")
    assert app_call.body["params"]["tablePrefix"].text == "tablePrefix"
    assert load_infra("modules/functionapp.bicep").variables["appSettings"]["SETTLE_TABLE_PREFIX"].text == (
        "tablePrefix"
    )
    params = json.loads((load_infra("main.bicep").path.parent / "main.parameters.json").read_text())
    assert params["parameters"]["tablePrefix"]["value"] == main.params["tablePrefix"].default == "settle"
