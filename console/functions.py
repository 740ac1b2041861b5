"""Serves the console's four files. Anonymous for the Functions host (see ``docs/adr/0013-console-auth.md``):
the page itself holds no data; every call it makes goes to the management API, which checks who asks."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from urllib.parse import urlsplit

import azure.functions as func

from common import openapi
from common.errors import NotFound
from common.http import problem_response

bp = func.Blueprint()

# The only files served, by name: nothing else of the package is reachable (no path from the URL is
# ever joined to a directory).
_FILES = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "oncall.js": "text/javascript",
    "app.css": "text/css",
}
_HEADERS = {
    # Our own files only: no inline script, no third-party origin, no framing.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _file(name: str, *, transform: Callable[[bytes], bytes] | None = None) -> func.HttpResponse:
    mimetype = _FILES.get(name)
    if mimetype is None:
        return problem_response(NotFound(f"The console has no file {name!r}.", field="file"))
    body = resources.files("console").joinpath("static", name).read_bytes()
    if transform is not None:
        body = transform(body)
    return func.HttpResponse(body, status_code=200, mimetype=mimetype, charset="utf-8", headers=_HEADERS)


def _assets_beside(page: bytes) -> bytes:
    """The page as served at ``/api/console/``: the host routes the trailing slash here too, where the
    page's relative paths (``console/app.js``) would name ``/api/console/console/app.js``, which no route
    serves (the page stayed on "Loading…"). There the assets are beside the page. Relative either way, so
    the page works under any route prefix or proxy path; the CSP's ``base-uri 'none'`` rules out <base>."""
    return page.replace(b'="console/', b'="')


for _path, _id, _summary in (
    ("/api/console", "console", "The operator console (HTML; its data comes from the management API)"),
    ("/api/console/{file}", "console_asset", "The console's scripts and style sheet"),
):
    openapi.register(
        openapi.Operation(
            path=_path,
            method="GET",
            operation_id=_id,
            summary=_summary,
            responses={200: "OK", 404: "No such file"},
            parameters=({"name": "file", "in": "path", "required": True, "schema": {"type": "string"}},)
            if "{file}" in _path
            else (),
            anonymous=True,
            tag="console",
        )
    )


@bp.function_name("console")
@bp.route(route="console", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def console(req: func.HttpRequest) -> func.HttpResponse:
    """The console page (also at ``console/``)."""
    trailing_slash = urlsplit(req.url).path.endswith("/")
    return _file("index.html", transform=_assets_beside if trailing_slash else None)


@bp.function_name("console_asset")
@bp.route(route="console/{file}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def console_asset(req: func.HttpRequest) -> func.HttpResponse:
    """The page's script and style sheet."""
    return _file(req.route_params.get("file") or "")
