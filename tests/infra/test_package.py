"""The code package (infra/package.py) holds exactly what .funcignore keeps, and that is exactly the app.

.funcignore is the one list (deploy.sh, Core Tools and azd read it). The package is built from a copy of
the tracked files plus the junk a developer machine has, so the result does not depend on this checkout.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.infra.bicep import INFRA, REPO

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test


def package_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settle_package", INFRA / "package.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (REPO / name).is_file()]


JUNK = [
    ".venv/lib/site.py",
    ".venv-checkov/bin/checkov",
    ".azure/prod/.env",
    ".azurite/__azurite_db_table__.json",
    "local.settings.json",
    "__azurite_db_blob__.json",
    "state/__pycache__/store.cpython-313.pyc",
    "handoff/old.pyc",
    "node_modules/azurite/index.js",
    ".coverage",
    "settle.zip",
    ".pytest_cache/v/cache/nodeids",
    "client/settle_client/__init__.py",
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name in tracked():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    for name in JUNK:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("junk")
    return root


def test_the_package_is_the_app_and_nothing_else(project: Path) -> None:
    files = package_module().package_files(project)
    # The app: the entry point, host.json, requirements.txt and every file of the packages it imports
    # (top-level packages other than the development ones); the benchmark's helpers live in bench/.
    app_packages = {
        p.parent.name
        for p in project.glob("*/__init__.py")
        if p.parent.name not in {"tests", "bench", "devtools"}
    }
    expected = {"function_app.py", "host.json", "requirements.txt"} | {
        name for name in tracked() if name.split("/")[0] in app_packages
    }
    assert app_packages == {"common", "state", "handoff", "management", "console"}
    assert set(files) == expected


def test_the_package_builds_and_imports_nothing_from_development_code(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "settle.zip"
    package = package_module()
    names = package.build(out, project)
    files = package.package_files(project)
    assert sorted(zipfile.ZipFile(out).namelist()) == sorted(names)
    # The developer's own pycs ("junk" above) are never shipped: only those compiled from the kept files.
    assert sorted(n for n in names if not n.endswith(".pyc")) == files
    assert sorted(n for n in names if n.endswith(".pyc")) == sorted(
        package.bytecode_name(f) for f in files if f.endswith(".py")
    )
    for name in files:
        if name.endswith(".py"):
            source = (project / name).read_text()
            assert "import devtools" not in source and "from tests" not in source, name


@pytest.mark.parametrize(
    ("rules", "path", "is_dir", "excluded"),
    [
        ("tests\n", "tests", True, True),
        ("tests\n", "state/tests", True, True),  # no slash: any depth
        ("/tests\n", "state/tests", True, False),  # leading slash: the root only
        ("state/bench_support.py\n", "state/bench_support.py", False, True),
        ("state/bench_support.py\n", "x/state/bench_support.py", False, False),  # a middle slash anchors
        ("*.pyc\n", "a/b/c.pyc", False, True),
        (".git*\n", ".github", True, True),
        (".git*\n", ".gitignore", False, True),
        (".venv*\n", ".venv-checkov", True, True),
        ("build/\n", "build", False, False),  # trailing slash: directories only
        ("build/\n", "build", True, True),
        ("*.json\n!host.json\n", "host.json", False, False),  # the last match wins
        ("*.json\n!host.json\n", "local.json", False, True),
        ("docs/**/*.md\n", "docs/a/b/c.md", False, True),
        ("docs/**/*.md\n", "docs/c.md", False, True),
        ("__azurite_db*__.json\n", "__azurite_db_table__.json", False, True),
        ("# comment\n\n", "anything", False, False),
        ("[ab].txt\n", "a.txt", False, True),
        ("[ab].txt\n", "c.txt", False, False),
    ],
)
def test_funcignore_follows_gitignore_rules(rules: str, path: str, is_dir: bool, excluded: bool) -> None:
    package = package_module()
    assert package.ignored(package.parse_rules(rules), path, is_dir) is excluded


def test_an_excluded_directory_cannot_be_re_included_below(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "keep.md").write_text("x")
    (tmp_path / "app.py").write_text("x")
    (tmp_path / ".funcignore").write_text("docs\n!docs/keep.md\n.funcignore\n")
    assert package_module().package_files(tmp_path) == ["app.py"]


def test_the_app_runs_its_python_so_the_shipped_bytecode_is_the_one_it_reads() -> None:
    from tests.support.infra_reads import ci_python

    runtime = package_module().RUNTIME
    assert f"{runtime[0]}.{runtime[1]}" == ci_python()  # = the function app's runtime version (test_policy)


def test_a_deployed_package_imports_from_its_bytecode_even_after_a_copy_that_resets_times(
    project: Path, tmp_path: Path
) -> None:
    """What a new instance does with the package: the remote build copied it without keeping modification
    times (Oryx: ``rsync -rcE``) and the files are read-only, so nothing can be compiled and cached. Every
    module the app imports at start must come from the shipped pyc: here each source is replaced by one that
    cannot be imported, so one module compiled from source fails the import."""
    out = tmp_path / "settle.zip"
    package_module().build(out, project)
    deployed = tmp_path / "wwwroot"
    zipfile.ZipFile(out).extractall(deployed)
    sources = sorted(deployed.rglob("*.py"))
    assert sources
    for source in sources:
        source.write_text('raise ImportError("compiled from source: " + __name__)\n')
        os.utime(source, (2_000_000_000, 2_000_000_000))  # newer than any pyc, as after the copy
    for pyc in deployed.rglob("*.pyc"):
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags == 0b01, pyc  # PEP 552: hash-based, source not checked
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # read-only, as deployed
    env.pop("PYTHONPYCACHEPREFIX", None)  # the pycs are where the package put them (make test-unit sets one)
    probe = (
        "import sys, function_app; "
        "app_modules = [m for m in sys.modules if m.split('.')[0] in ('common', 'state', 'handoff', "
        "'management', 'console')]; "
        "print(function_app.__file__, len(app_modules), len(function_app.app.get_functions()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=deployed, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    where, modules, functions = done.stdout.split()
    assert Path(where).parent == deployed
    assert int(modules) > 10 and int(functions) > 10
