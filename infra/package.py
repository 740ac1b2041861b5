"""Build the function app's code package: every file of the project that .funcignore does not exclude.

.funcignore is the one list of what is not deployed: Functions Core Tools (`func azure functionapp
publish`) and azd (`azd deploy`) read it, and so does this script, which infra/deploy.sh runs before
`az functionapp deployment source config-zip`. Its syntax is gitignore's: ``#`` comments, ``!`` to
re-include, a trailing ``/`` for directories only, a ``/`` at the start or in the middle to anchor a
pattern to the project root, ``*``, ``?``, ``[...]`` and ``**``; an excluded directory excludes all it
holds. The remote build installs requirements.txt, so the package holds the app's own files and, beside
each module, its bytecode.

Bytecode: the app's Python files are compiled here into ``__pycache__`` as *unchecked-hash* pycs (PEP 552),
for the Python the app runs (``RUNTIME``). A deployed package is read-only, so a module without a valid pyc
is compiled from source in every new instance (about a third of Settle's cold start). Timestamp pycs would
not survive the remote build: Oryx copies the package with ``rsync -rcE``, which does not keep modification
times, so each source would look newer than its pyc. An unchecked-hash pyc is used without looking at the
source at all, which is right for a package whose sources and pycs are built together and never edited in
place. A developer's own ``__pycache__`` is never shipped (.funcignore); the pycs are made fresh from the
files being packaged. Run with another Python, the script ships sources only and says so.

Standard library only (it runs wherever deploy.sh runs):

    python3 infra/package.py OUT.zip     write the package
    python3 infra/package.py --list      print the files it would hold
"""

from __future__ import annotations

import os
import py_compile
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
# The Python the function app runs: functionapp.bicep's runtime version (tests/infra asserts so).
RUNTIME = (3, 13)


@dataclass(frozen=True)
class Rule:
    """One .funcignore line."""

    pattern: re.Pattern[str]
    negated: bool
    directories_only: bool


def _translate(glob: str) -> str:
    """A gitignore glob (already without its leading/trailing ``/``) as a regular expression."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == len(glob):
            out.append("/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 1 :]:
            end = glob.index("]", i + 1)
            body = glob[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_rules(text: str) -> list[Rule]:
    rules: list[Rule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]  # \# and \! stand for a literal first character
        directories_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        prefix = "" if anchored else "(?:.*/)?"
        rules.append(Rule(re.compile(f"^{prefix}{_translate(line)}$"), negated, directories_only))
    return rules


def ignored(rules: list[Rule], relative: str, is_dir: bool) -> bool:
    """Whether ``relative`` (a POSIX path below the project root) is excluded: the last matching rule wins."""
    verdict = False
    for rule in rules:
        if rule.directories_only and not is_dir:
            continue
        if rule.pattern.match(relative):
            verdict = not rule.negated
    return verdict


def package_files(project: Path = PROJECT) -> list[str]:
    """Every file of ``project`` that its .funcignore keeps, as sorted POSIX paths."""
    rules = parse_rules((project / ".funcignore").read_text())
    kept: list[str] = []
    for directory, subdirectories, files in os.walk(project):
        base = Path(directory).relative_to(project)
        # An excluded directory excludes everything below it (as in git): do not descend.
        subdirectories[:] = sorted(
            d for d in subdirectories if not ignored(rules, (base / d).as_posix(), is_dir=True)
        )
        for name in sorted(files):
            relative = (base / name).as_posix()
            if not ignored(rules, relative, is_dir=False):
                kept.append(relative)
    return sorted(kept)


def bytecode_name(relative: str) -> str:
    """Where the interpreter looks for ``relative``'s pyc (``a/__pycache__/b.cpython-313.pyc``)."""
    source = Path(relative)
    tag = sys.implementation.cache_tag
    return (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").as_posix()


def build(out: Path, project: Path = PROJECT, bytecode: bool = True) -> list[str]:
    """Write the package to ``out`` and return the names it holds: the kept files, then (with ``bytecode``
    and when this is the app's Python) one unchecked-hash pyc per kept ``.py`` file."""
    files = package_files(project)
    names = list(files)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in files:
            archive.write(project / relative, relative)
        if bytecode and sys.version_info[:2] == RUNTIME:
            with tempfile.TemporaryDirectory() as scratch:
                for relative in (f for f in files if f.endswith(".py")):
                    target = bytecode_name(relative)
                    compiled = Path(scratch) / target
                    py_compile.compile(
                        str(project / relative),
                        cfile=str(compiled),
                        dfile=relative,
                        doraise=True,
                        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                    )
                    archive.write(compiled, target)
                    names.append(target)
    return names


def main(argv: list[str]) -> int:
    if argv[1:] == ["--list"]:
        print("\n".join(package_files()))
        return 0
    if len(argv) != 2:
        print("usage: package.py OUT.zip | --list", file=sys.stderr)
        return 2
    names = build(Path(argv[1]))
    pycs = sum(1 for name in names if name.endswith(".pyc"))
    if pycs:
        version = f"{RUNTIME[0]}.{RUNTIME[1]}"
        print(f"{argv[1]}: {len(names) - pycs} files and their bytecode ({pycs} pycs for Python {version})")
    else:
        running = ".".join(map(str, sys.version_info[:2]))
        print(
            f"{argv[1]}: {len(names)} files, sources only: this is Python {running} and the app runs "
            f"{RUNTIME[0]}.{RUNTIME[1]}, so each new instance compiles them at its first import"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
