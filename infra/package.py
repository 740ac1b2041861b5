"""Build the function app's code package: every file of the project that .funcignore does not exclude.

.funcignore is the one list of what is not deployed: Functions Core Tools (`func azure functionapp
publish`) and azd (`azd deploy`) read it, and so does this script, which infra/deploy.sh runs before
`az functionapp deployment source config-zip`. Its syntax is gitignore's: ``#`` comments, ``!`` to
re-include, a trailing ``/`` for directories only, a ``/`` at the start or in the middle to anchor a
pattern to the project root, ``*``, ``?``, ``[...]`` and ``**``; an excluded directory excludes all it
holds. The remote build installs requirements.txt, so the package holds sources only.

Standard library only (it runs wherever deploy.sh runs):

    python3 infra/package.py OUT.zip     write the package
    python3 infra/package.py --list      print the files it would hold
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


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


def build(out: Path, project: Path = PROJECT) -> list[str]:
    files = package_files(project)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in files:
            archive.write(project / relative, relative)
    return files


def main(argv: list[str]) -> int:
    if argv[1:] == ["--list"]:
        print("\n".join(package_files()))
        return 0
    if len(argv) != 2:
        print("usage: package.py OUT.zip | --list", file=sys.stderr)
        return 2
    files = build(Path(argv[1]))
    print(f"{argv[1]}: {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
