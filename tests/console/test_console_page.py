"""The console's page as its function serves it (no browser, no storage): the same page at
``/api/console`` and ``/api/console/``, its assets resolving from either."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

import azure.functions as func
import pytest


@pytest.fixture
def serve(functions: dict[str, Any]) -> Any:
    """Call one of the console's functions as the worker would, for ``url``."""

    def call(name: str, url: str, **params: str) -> func.HttpResponse:
        request = func.HttpRequest("GET", url, body=b"", route_params=params)
        answer: func.HttpResponse = functions[name].get_user_function()(request)
        return answer

    return call


@pytest.mark.parametrize("page", ["http://localhost/api/console", "http://localhost/api/console/"])
def test_the_page_s_assets_resolve_with_and_without_a_trailing_slash(serve: Any, page: str) -> None:
    # Given the page at either address
    answer = serve("console", page)
    assert answer.status_code == 200
    html = answer.get_body().decode()
    # Then every asset it names resolves to the asset route, and that route serves it
    assets = re.findall(r'(?:src|href)="([^"#:]+)"', html)
    assert len(assets) == 3, assets
    for asset in assets:
        resolved = urljoin(page, asset)
        assert resolved.startswith("http://localhost/api/console/"), (page, asset, resolved)
        file = resolved.removeprefix("http://localhost/api/console/")
        assert "/" not in file, resolved
        assert serve("console_asset", resolved, file=file).status_code == 200
