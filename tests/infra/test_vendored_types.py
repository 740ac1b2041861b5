"""The vendored type data (tests/infra/bicep-types) is exactly what its README says it is, and stays small.

A changed type file or index is then a reviewed change: the README's digests must be updated with it.
"""

from __future__ import annotations

import hashlib
import re

from tests.infra.armtypes import TYPES_DIR, type_data


def listed_digests() -> dict[str, str]:
    text = (TYPES_DIR / "README.md").read_text()
    return {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.MULTILINE)}


def test_every_vendored_file_has_its_readme_digest() -> None:
    files = {p.relative_to(TYPES_DIR).as_posix() for p in TYPES_DIR.rglob("*") if p.is_file()} - {"README.md"}
    listed = listed_digests()
    assert set(listed) == files
    for name, digest in listed.items():
        assert hashlib.sha256((TYPES_DIR / name).read_bytes()).hexdigest() == digest, name


def test_the_licence_is_the_upstream_mit_licence() -> None:
    licence = (TYPES_DIR / "LICENSE").read_text()
    assert "MIT License" in licence and "Copyright (c) Microsoft Corporation." in licence


def test_the_vendored_data_is_modest() -> None:
    total = sum(p.stat().st_size for p in TYPES_DIR.rglob("*") if p.is_file())
    assert total < 1_500_000, total  # ~1.2 MB of JSON; git stores it compressed (~0.1 MB)


def test_the_index_knows_every_vendored_resource_type() -> None:
    data = type_data()
    for relative in data.vendored():
        provider, api = relative.split("/")[:2]
        names = [n for n in data.type_names() if n.lower().startswith(provider + "/")]
        assert any(api in (data.versions(n) or []) for n in names), relative
