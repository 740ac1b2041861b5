"""The client as a package for an index: ``python -m build client`` makes a wheel and an sdist whose metadata
says what an index and pip need (one version, licence, Python, classifiers, URLs, the ``settle`` command),
with ``py.typed`` so type checkers read its annotations; the wheel installs and its command runs.
"""

from __future__ import annotations

import email
import email.message
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from settle_client import __version__
from settle_client._version import VERSION

pytestmark = pytest.mark.heavy  # runs other programs: seconds a test

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", str(ROOT / "client"), "--outdir", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def wheel_of(dist: Path) -> Path:
    [wheel] = dist.glob("settle_client-*-py3-none-any.whl")
    return wheel


def metadata(dist: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel_of(dist)) as wheel:
        return email.message_from_bytes(wheel.read(f"settle_client-{VERSION}.dist-info/METADATA"))


def test_the_version_is_written_once_and_the_wheel_and_sdist_carry_it(dist: Path) -> None:
    assert __version__ == VERSION
    assert "version =" not in (ROOT / "client" / "pyproject.toml").read_text().split("[project.urls]")[0]
    assert metadata(dist)["Version"] == VERSION
    assert wheel_of(dist).name == f"settle_client-{VERSION}-py3-none-any.whl"
    assert (dist / f"settle_client-{VERSION}.tar.gz").exists()


def test_the_wheel_metadata_is_complete(dist: Path) -> None:
    meta = metadata(dist)
    assert meta["Name"] == "settle-client"
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Summary"] and meta["Description-Content-Type"] == "text/markdown"
    assert "pip install" in str(meta.get_payload())  # the README is the long description
    classifiers = meta.get_all("Classifier") or []
    for wanted in ("Typing :: Typed", "Programming Language :: Python :: 3.11", "Environment :: Console"):
        assert wanted in classifiers, wanted
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())
    requires = meta.get_all("Requires-Dist") or []
    assert any(r.startswith("httpx") for r in requires) and any(r.startswith("pydantic") for r in requires)


def test_the_wheel_has_py_typed_the_licence_and_the_settle_command(dist: Path) -> None:
    with zipfile.ZipFile(wheel_of(dist)) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(f"settle_client-{VERSION}.dist-info/entry_points.txt").decode()
    assert "settle_client/py.typed" in names
    assert f"settle_client-{VERSION}.dist-info/licenses/LICENSE" in names
    assert "[console_scripts]" in entry_points and "settle = settle_client.cli:main" in entry_points


def test_the_sdist_builds_the_same_package(dist: Path) -> None:
    with tarfile.open(dist / f"settle_client-{VERSION}.tar.gz") as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "settle_client/py.typed",
        "settle_client/cli.py",
    } <= names


def test_the_wheel_installs_with_pip_and_its_command_runs(dist: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel_of(dist)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    assert (target / "bin" / "settle").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, settle_client.cli as c; print(c.__file__); sys.exit(c.main(['--version']))",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    where, version = ran.stdout.splitlines()
    assert where.startswith(str(target)) and version == f"settle {VERSION} (settle-client)"
