"""The README's console screenshots show the console as it is: ``make screenshots`` records a digest of
``console/static/`` beside them (``docs/img/screenshots.json``); a view changed since fails here."""

from __future__ import annotations

import json
import re

from devtools import screenshots


def test_the_readme_s_screenshots_were_taken_from_the_console_as_it_is() -> None:
    # Given what `make screenshots` recorded when it last took them
    recorded = json.loads((screenshots.DOCS_IMG / screenshots.MANIFEST).read_text(encoding="utf-8"))
    # Then the console's files are the ones they were taken from
    assert recorded["console"] == screenshots.console_digest(), (
        "console/static/ changed since the README's screenshots were taken: run `make screenshots` "
        "(devtools/screenshots.py) and commit docs/img/"
    )
    # And every console picture the README shows is one of them
    readme = (screenshots.ROOT / "README.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"docs/img/(console-[\w-]+\.png)", readme))
    assert shown, "the README shows no console screenshot"
    assert shown <= set(recorded["files"]), shown - set(recorded["files"])
    for name in recorded["files"]:
        assert (screenshots.DOCS_IMG / name).stat().st_size > 10_000, f"{name} looks empty"
