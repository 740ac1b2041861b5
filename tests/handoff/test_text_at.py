"""handoff.storage.json_text.text_at: one string member of a JSON text (an audit's Data, a stored body), or
None."""

from __future__ import annotations

import pytest

from handoff.storage.json_text import text_at


@pytest.mark.parametrize(
    ("document", "path", "expected"),
    [
        ('{"resolution":"delivered"}', ("resolution",), "delivered"),
        ('{"ErrorContent":{"ErrorText":"boom"}}', ("ErrorContent", "ErrorText"), "boom"),
        ('{"ErrorContent":null}', ("ErrorContent", "ErrorText"), None),
        ('{"ErrorContent":"flat"}', ("ErrorContent", "ErrorText"), None),
        ('{"resolution":3}', ("resolution",), None),
        ('["resolution"]', ("resolution",), None),
        ("not json", ("resolution",), None),
        ("", ("resolution",), None),
        (None, ("resolution",), None),
    ],
)
def test_only_a_string_at_the_whole_path_is_read(
    document: str | None, path: tuple[str, ...], expected: str | None
) -> None:
    assert text_at(document, *path) == expected
