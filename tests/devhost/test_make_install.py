"""``make install`` with a Python that is not 3.13 refuses before it creates anything.

Run against a copy of the Makefile and ``devtools/find-python.sh`` in a temporary folder, so the real
``.venv`` is never touched; the wrong Python is a stand-in that reports 3.11 (it runs nothing else).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INPUTS = (
    "requirements.txt",
    "requirements-dev.txt",
    "client/pyproject.toml",
    "package.json",
    "package-lock.json",
)


def a_checkout(tmp_path: Path) -> Path:
    """The Makefile, find-python.sh and the files the install rule depends on (empty: never read)."""
    folder = tmp_path / "checkout"
    (folder / "devtools").mkdir(parents=True)
    (folder / "client").mkdir()
    shutil.copy(ROOT / "Makefile", folder / "Makefile")
    shutil.copy(ROOT / "devtools" / "find-python.sh", folder / "devtools" / "find-python.sh")
    for name in INPUTS:
        (folder / name).touch()
    return folder


def a_python_311(tmp_path: Path) -> Path:
    """A ``python3.11`` that answers as Python 3.11 does and records anything else it is asked to run."""
    fake = tmp_path / "bin" / "python3.11"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{tmp_path}/python-calls.txt"\n'
        'case "$*" in\n'
        '  --version) echo "Python 3.11.2"; exit 0 ;;\n'
        "  *version_info*) exit 1 ;;\n"
        "esac\n"
        f'exec "{sys.executable}" -c "import sys; sys.exit(\'asked to do more than say its version\')"\n'
    )
    fake.chmod(0o755)
    return fake


def make_install(folder: Path, python: Path) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "PYTHON"}}
    return subprocess.run(
        ["make", "install", f"PYTHON={python}"],
        cwd=folder, env=environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_wrong_python_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    # Given a checkout and PYTHON pointing at a Python 3.11
    folder = a_checkout(tmp_path)
    python = a_python_311(tmp_path)

    # When make install runs
    result = make_install(folder, python)

    # Then it refuses, saying which Python it was given and how to point PYTHON at a 3.13
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"PYTHON={python} is Python 3.11.2, not 3.13" in said, said
    assert "PYTHON=/path/to/python3.13" in said
    assert "pip" not in said and "Traceback" not in said
    # And nothing was created: no virtualenv, no stamp, nothing installed
    assert not (folder / ".venv").exists()
    assert "venv" not in (tmp_path / "python-calls.txt").read_text()


def test_an_existing_virtualenv_is_left_alone_when_python_is_wrong(tmp_path: Path) -> None:
    # Given a checkout whose .venv exists (a 3.13 one, made earlier)
    folder = a_checkout(tmp_path)
    venv = folder / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "keep").write_text("made earlier")

    # When make install runs with a wrong PYTHON
    result = make_install(folder, a_python_311(tmp_path))

    # Then it refuses and the virtualenv is still there
    assert result.returncode != 0
    assert (venv / "keep").read_text() == "made earlier"


def test_find_python_checks_a_given_python() -> None:
    script = ROOT / "devtools" / "find-python.sh"
    ok = subprocess.run([str(script), "--check", sys.executable], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([str(script), "--check", "/nonexistent/python3"], capture_output=True, text=True)
    assert missing.returncode != 0
    assert "/nonexistent/python3" in missing.stderr and "PYTHON=/path/to/python3.13" in missing.stderr


def test_what_building_the_client_leaves_is_ignored_by_git() -> None:
    # `python -m build client` writes client/build/ and client/dist/; neither belongs in a commit
    for path in ("client/dist/settle_client-0.1.0-py3-none-any.whl", "client/build/lib/x.py"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert ignored.returncode == 0, f"{path} is not ignored (.gitignore)"
