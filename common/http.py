"""The thin HTTP layer: parse and validate, call one service method, map the result or error.

``operation(bp, ...)`` registers an HTTP function on a blueprint and documents it in the OpenAPI
document. The wrapped function receives the ``func.HttpRequest`` and returns a pydantic model (200, or
the status given), ``None`` (204) or a ready ``func.HttpResponse``. Errors become problem+json:
:class:`~common.errors.SettleError` with its own status, pydantic validation errors 400 naming the
field, storage/network faults 503 with ``Retry-After`` (see :func:`dependency_problem`);
anything else is logged and answered 500 without internals. Each call runs within the HTTP deadline
(``common.invocation``: 20 s): storage that does not answer by then is a 503, and one after a write that
storage may have applied says its outcome is unknown. The Azure SDK's exception types are imported
when a fault is mapped, not at indexing.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from typing import Any

import azure.functions as func
from pydantic import BaseModel, ValidationError

from common import invocation, openapi, telemetry
from common.errors import (
    Conflict,
    InvalidInput,
    InvalidJson,
    LengthRequired,
    NestedTooDeep,
    PayloadTooLarge,
    SettleError,
    StorageTableMissing,
    Unavailable,
    is_unreadable_answer,
)

log = logging.getLogger("settle.http")

ROUTE_PREFIX = "api"  # host.json extensions.http.routePrefix
Handler = Callable[[func.HttpRequest], Any]

PROBLEM_CONTENT_TYPE = "application/problem+json"
# Said in a header of its own as well as through mimetype/charset: the worker hands the host the headers
# and the mimetype apart, and a deployed host's answer then named no charset.
JSON_CONTENT_TYPE = "application/json; charset=utf-8"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> func.HttpResponse:
    if isinstance(body, BaseModel):
        text = body.model_dump_json(by_alias=True)
    else:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return func.HttpResponse(
        text,
        status_code=status,
        mimetype="application/json",
        charset="utf-8",
        headers={"Content-Type": JSON_CONTENT_TYPE, **(headers or {})},
    )


def problem_response(error: SettleError) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(error.to_problem(), ensure_ascii=False),
        status_code=error.status,
        mimetype=PROBLEM_CONTENT_TYPE,
        charset="utf-8",
        headers={"Content-Type": f"{PROBLEM_CONTENT_TYPE}; charset=utf-8", **error.headers},
    )


# Tags pydantic puts in an error location for union members and validators, not field names.
_SCHEMA_TAGS = frozenset(
    {
        "str",
        "int",
        "float",
        "bool",
        "bytes",
        "none",
        "list",
        "dict",
        "tuple",
        "set",
        "frozenset",
        "datetime",
        "date",
        "time",
        "timedelta",
        "decimal",
        "uuid",
        "url",
        "json",
        "any",
        "model",
        "dataclass",
        "enum",
        "literal",
        "nullable",
        "union",
        "default",
        "chain",
        "callable",
        "is-instance",
        "lax-or-strict",
        "json-or-python",
        "tagged-union",
        "constrained-str",
        "constrained-int",
        "constrained-float",
        "constrained-bytes",
    }
)


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in item or item in _SCHEMA_TAGS or item.startswith("function-"):
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "body"


def validation_problem(exc: ValidationError, *, prefix: str = "") -> InvalidInput:
    errors = []
    for err in exc.errors(include_url=False):
        path = _field_path(tuple(err["loc"]))
        if prefix:
            path = f"{prefix}.{path}" if path != "body" else prefix
        errors.append({"field": path, "message": err["msg"]})
    first = errors[0] if errors else {"field": prefix or "body", "message": "invalid"}
    detail = f"{first['field']}: {first['message']}"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more)"
    return InvalidInput(detail, field=first["field"], errors=errors)


# How deep a body may nest arrays and objects (the body itself is level 1): the limit of the JSON parser
# pydantic uses (jiter refuses a 202nd level as "recursion limit exceeded"); tests/test_http_bodies.py
# holds it to this number.
MAX_JSON_DEPTH = 201
_TOO_DEEP = "recursion limit exceeded"


def parse_body[M: BaseModel](req: func.HttpRequest, model: type[M]) -> M:
    """Validate the JSON body against ``model`` or raise a 400 naming the field."""
    raw = req.get_body() or b""
    if not raw.strip():
        if "chunked" in (req.headers.get("transfer-encoding") or "").lower():
            raise LengthRequired(
                "The body was sent in chunks (Transfer-Encoding: chunked, no Content-Length): the Azure "
                "Functions host drops such a body before the app sees it. Send the body with a "
                "Content-Length header.",
                field="body",
            )
        raise InvalidJson("The request needs a JSON body.", field="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJson("The body is not UTF-8.", field="body") from exc
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark, as some editors and tools write
    try:
        parsed = model.model_validate_json(text)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" and _TOO_DEEP in e["msg"] for e in exc.errors()):
            raise NestedTooDeep(
                f"The body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels (the body itself "
                f"counts as one), Settle's limit: flatten it, or send the deep part as a string.",
                field="body",
                limit=MAX_JSON_DEPTH,
            ) from exc
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            if unpaired_surrogate(text):
                raise InvalidJson(
                    "The body holds an unpaired UTF-16 surrogate escape (such as \\ud800 without its low "
                    "half): it is no Unicode character, so no text can carry it (I-JSON, RFC 7493, refuses "
                    "it). Send characters, or a surrogate pair.",
                    field="body",
                ) from exc
            raise InvalidJson("The body is not valid JSON.", field="body") from exc
        if any(e["type"] == "model_type" and not e["loc"] for e in exc.errors()):
            raise InvalidInput("The body must be a JSON object.", field="body") from exc
        raise validation_problem(exc) from exc
    refuse_non_finite(text)
    return parsed


def unpaired_surrogate(text: str) -> bool:
    """``text`` is JSON whose strings (or keys) hold an unpaired surrogate, which Python's parser accepts and
    the body's parser refuses. Asked only after a refusal, to say why."""
    try:
        stack: list[Any] = [json.loads(text)]
    except ValueError:
        return False
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if any("\ud800" <= c <= "\udfff" for c in value):
                return True
        elif isinstance(value, dict):
            stack += [*value.keys(), *value.values()]
        elif isinstance(value, list):
            stack += value
    return False


# What a number JSON cannot carry might look like: NaN / Infinity (accepted by Python's and pydantic's
# parsers, not by JSON), or a number too large for a double: 309+ digits, or any exponent (a short one on a
# long mantissa overflows too: 1 and 300 zeros, e9). Only a hint: the second parse decides.
_NON_FINITE_HINT = re.compile(r"NaN|Infinity|\d[eE][+-]?\d|\d{309}")


class _NonFinite:
    pass


def refuse_non_finite(text: str) -> None:
    """A 400 naming the field when the JSON ``text`` holds NaN, ±Infinity or a number beyond a double
    (``1e400``): stored, they are not JSON and read back as null. Costs a second parse only when the text
    looks like it might (see ``_NON_FINITE_HINT``)."""
    if not _NON_FINITE_HINT.search(text):
        return
    marker = _NonFinite()

    def number(raw: str) -> Any:
        value = float(raw)
        return value if math.isfinite(value) else marker

    try:
        data = json.loads(
            text, parse_constant=lambda _: marker, parse_float=number, parse_int=_int_or(marker)
        )
    except (ValueError, RecursionError):
        return  # the model's own parser accepted it; nothing more to say here
    path = _path_to(data, marker, "")
    if path is not None:
        raise InvalidInput(
            f"{path or 'body'}: NaN, Infinity and numbers beyond a double (such as 1e400) are not JSON; "
            "send a finite number (or a string).",
            field=path or "body",
        )


def _int_or(marker: object) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        if len(raw.lstrip("-")) < 309:
            return int(raw)
        return marker if not math.isfinite(float(raw)) else int(raw)

    return parse


def _path_to(data: Any, marker: object, path: str) -> str | None:
    """The field path (``data.amounts[1]``) of the first ``marker`` in ``data``, if any."""
    stack: list[tuple[Any, str]] = [(data, path)]
    while stack:
        value, at = stack.pop()
        if value is marker:
            return at
        if isinstance(value, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(value))))
    return None


def parse_model[M: BaseModel](data: Any, model: type[M], *, field: str) -> M:
    """Validate already-parsed data (query parameters, route parameters) against ``model``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_problem(exc, prefix="" if field == "query" else field) from exc


# Storage error codes that mean "the request was too big for Table Storage" (documented limits).
_TOO_LARGE_CODES = frozenset({"EntityTooLarge", "PropertyValueTooLarge", "RequestBodyTooLarge"})
_MAX_RETRY_AFTER_S = 60


def _retry_after(exc: Exception, default: int) -> int:
    """The dependency's own ``Retry-After`` (seconds) when it sent one, else ``default``."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        value = int(float(str(headers.get("Retry-After") or headers.get("retry-after") or default)))
    except (TypeError, ValueError):
        value = default
    return max(1, min(value, _MAX_RETRY_AFTER_S))


def dependency_problem(exc: Exception) -> SettleError | None:
    """The problem a storage/network fault maps to, or None when it is not one (a bug: 500).

    Throttling (429), server errors (5xx), broken connections, answers that could not be read (an
    undecodable 200 included: :func:`~common.errors.is_unreadable_answer`), and token endpoint failures
    are transient: 503 with ``Retry-After``. Storage refusing Settle's identity (401/403: a role assignment
    missing or not yet propagated) is the deployment's fault, never the caller's: 503 too, and logged as an
    error so an operator sees it. A conflict that survived our own retries is a 409 to retry. A
    request Table Storage refused as too large is a 413 (validation should have caught it first; the
    mapping keeps a gap from ever becoming a 500).
    """
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, StorageTableMissing):
        log.error("storage has no table %r: it was deleted; redeploy (or restart) to recreate it", exc.table)
        return Unavailable(
            f"Storage could not answer: Settle's table {exc.table!r} does not exist (was it deleted?). "
            "Nothing was read or written; an operator must restore it.",
            retry_after=30,
        )
    if isinstance(exc, ServiceRequestError | ServiceResponseError | TimeoutError | ConnectionError):
        return Unavailable("Storage is unreachable; retry with backoff.", retry_after=_retry_after(exc, 1))
    if is_unreadable_answer(exc):
        return Unavailable("Storage's answer could not be read; retry with backoff.", retry_after=1)
    if isinstance(exc, ClientAuthenticationError):
        return Unavailable("Storage refused Settle's credentials; retry later.", retry_after=5)
    if isinstance(exc, ResourceExistsError | ResourceModifiedError):
        return Conflict("The record changed while this request was being applied; retry.")
    if isinstance(exc, HttpResponseError):
        status = exc.status_code
        if status is None or status == 429 or status >= 500 or status == 408:
            what = "throttling" if status == 429 else "unavailable"
            return Unavailable(f"Storage is {what}; retry with backoff.", retry_after=_retry_after(exc, 1))
        if status in (401, 403):
            log.error("storage refused Settle's identity (%s): check its role assignment", status)
            return Unavailable("Storage refused Settle's identity; retry later.", retry_after=30)
        from common.transactions import error_code

        code = error_code(exc)
        if status == 413 or code in _TOO_LARGE_CODES:
            return PayloadTooLarge("The request is larger than Table Storage accepts for one record.")
        if status in (409, 412):
            return Conflict("The record changed while this request was being applied; retry.")
    return None


# How long a caller waits before asking again after storage did not answer within the deadline.
DEADLINE_RETRY_AFTER_S = 5


def within_deadline(problem: Unavailable) -> Unavailable:
    """``problem`` (a storage fault's 503) as the running invocation knows it: when its deadline is spent,
    a 503 saying so; after a write storage may have applied, one saying its outcome is unknown
    (``outcome: "unknown"``: retry with the same ``requestId`` / ``lockToken`` and the answer says what
    was written)."""
    budget = invocation.current()
    if budget is None:
        return problem
    detail, retry_after = problem.detail, problem.retry_after
    if budget.remaining() <= 0:
        detail = f"Storage did not answer within Settle's {budget.seconds:g} s deadline; retry with backoff."
        retry_after = max(retry_after, DEADLINE_RETRY_AFTER_S)
    if not budget.maybe_written:
        return problem if detail is problem.detail else Unavailable(detail, retry_after=retry_after)
    return Unavailable(
        f"{detail} A write this request sent may have been applied: its outcome is unknown. Retry the "
        "same request (same requestId, lockToken): its answer says what was written.",
        retry_after=retry_after,
        outcome="unknown",
    )


def guard(
    handler: Handler, *, ok_status: int = 200, span: str | None = None, route: str | None = None
) -> Callable[[func.HttpRequest], func.HttpResponse]:
    """Wrap ``handler`` so every outcome is an HTTP answer (problem+json for errors).

    With telemetry on, the request's ``traceparent`` is the parent when the worker gave none, and
    ``span`` (e.g. ``settle.state.lock``) wraps the call with the answer's status and outcome; a state
    operation also counts in ``settle.state.operations`` / ``settle.state.duration``.
    """

    def wrapper(req: func.HttpRequest, context: func.Context | None = None) -> func.HttpResponse:
        with (
            invocation.within(invocation.http_deadline()),
            telemetry.invocation(context),
            telemetry.incoming(req.headers),
        ):
            if span is None:
                return _answer(handler, req, ok_status, telemetry.NO_SPAN)
            watch = telemetry.Stopwatch()
            attributes = {"http.request.method": req.method, "http.route": route}
            with telemetry.span(span, attributes) as current:
                response = _answer(handler, req, ok_status, current)
                current.set("http.response.status_code", response.status_code)
                if current.outcome is None:
                    current.set_outcome("ok")
            if span.startswith(_STATE_SPAN):
                telemetry.state_operation(span[len(_STATE_SPAN) :], current.outcome or "ok", watch.seconds)
            return response

    # The worker indexes this function, not the handler: it reads the signature and the type hints and
    # accepts an HTTP function only as ``(req: func.HttpRequest[, context: func.Context]) ->
    # func.HttpResponse``. So no functools.wraps (it would copy the handler's model annotations and set
    # ``__wrapped__``, which inspect.signature follows); the names say which handler it is, ``handler``
    # keeps it reachable. ``context`` brings the host's trace context (a direct call may leave it out).
    wrapper.__name__ = wrapper.__qualname__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    wrapper.__annotations__ = {"req": func.HttpRequest, "context": func.Context, "return": func.HttpResponse}
    wrapper.handler = handler  # type: ignore[attr-defined]
    return wrapper


_STATE_SPAN = "settle.state."


def _answer(
    handler: Handler, req: func.HttpRequest, ok_status: int, current: telemetry.SpanHandle
) -> func.HttpResponse:
    try:
        result = handler(req)
    except SettleError as exc:
        _note(current, exc)
        return problem_response(exc)
    except ValidationError as exc:  # a model built inside the handler from request data
        problem = validation_problem(exc)
        _note(current, problem)
        return problem_response(problem)
    except Exception as exc:
        mapped = dependency_problem(exc)
        if isinstance(mapped, Unavailable):
            mapped = within_deadline(mapped)
        if mapped is not None:
            log.warning("dependency fault in %s: %s", getattr(handler, "__name__", "handler"), exc)
            current.failed(exc, slug=mapped.slug)
            return problem_response(mapped)
        log.exception("unhandled error in %s", getattr(handler, "__name__", "handler"))
        current.failed(exc)
        return problem_response(SettleError("An unexpected error occurred; it was logged."))
    if isinstance(result, func.HttpResponse):
        return result
    if result is None:
        return func.HttpResponse(status_code=204)
    return json_response(result, status=ok_status)


def _note(current: telemetry.SpanHandle, error: SettleError) -> None:
    """A refusal is an outcome (its problem slug), not a failure; a 5xx is a failure."""
    if error.status >= 500:
        current.failed(error, slug=error.slug)
    else:
        current.set_outcome(error.slug)
        current.set("settle.problem.field", error.field)


def operation(
    bp: func.Blueprint,
    *,
    route: str,
    method: str,
    summary: str,
    request: openapi.ModelRef | None = None,
    response: openapi.ModelRef | None = None,
    responses: dict[int, str] | None = None,
    parameters: tuple[dict[str, Any], ...] = (),
    anonymous: bool = False,
    ok_status: int = 200,
    tag: str = "settle",
    span: str | None = None,
    query_route: str | None = None,
) -> Callable[[Handler], Any]:
    """Register an HTTP function (route under ``/api``) and document it in the OpenAPI document.

    ``span``: the name of the span that wraps each call (``common/telemetry.py``), if any. ``request`` /
    ``response`` may be ``"module:Name"``: imported only when the OpenAPI document is built.

    ``query_route``: for a route with ids in its path, the route of its twin ``<name>_by_query``, which
    takes the same ids in the query string. The deployed host decodes ``%2F`` before it matches a route,
    so an id holding ``/`` reaches the path form nowhere but locally; in the query string any id travels.
    The twin runs the same handler (which reads the ids as route values), with the same body, answers,
    auth level, span and models.
    """
    ids = tuple(_ROUTE_PARAMETER.findall(route))
    if query_route is not None and (not ids or "{" in query_route):
        raise ValueError(f"{route!r}: a query twin is for a route with ids, and has none in its own route")

    def register(handler: Handler, name: str, at: str, documented: tuple[dict[str, Any], ...]) -> Any:
        openapi.register(
            openapi.Operation(
                path=f"/{ROUTE_PREFIX}/{at}",
                method=method,
                operation_id=name,
                summary=summary,
                request=request,
                response=response,
                responses={ok_status: "OK", **(responses or {})},
                parameters=documented,
                anonymous=anonymous,
                tag=tag,
            )
        )
        wrapped = guard(handler, ok_status=ok_status, span=span, route=f"/{ROUTE_PREFIX}/{at}")
        auth = func.AuthLevel.ANONYMOUS if anonymous else func.AuthLevel.FUNCTION
        routed = bp.route(route=at, methods=[method], auth_level=auth)(wrapped)
        return bp.function_name(name)(routed)

    def decorate(handler: Handler) -> Any:
        registered = register(handler, handler.__name__, route, parameters)
        if query_route is not None:
            twin = _ids_from_query(handler, ids)
            register(twin, twin.__name__, query_route, _in_query(parameters, ids))
        return registered

    return decorate


def anonymous_get(
    bp: func.Blueprint,
    route: str,
    summary: str,
    *,
    tag: str,
    response: openapi.ModelRef | None = None,
    span: str | None = None,
) -> Callable[[Handler], Any]:
    """Registers a ``GET`` anyone may call (no key): for answers that read nothing private."""
    return operation(
        bp, route=route, method="GET", summary=summary, response=response, anonymous=True, tag=tag, span=span
    )


_ROUTE_PARAMETER = re.compile(r"\{(\w+)\}")


def _ids_from_query(handler: Handler, ids: tuple[str, ...]) -> Handler:
    """``handler`` served with the ids of its path route taken from the query string instead: it sees
    the request its path form would have seen (the ids as route values, as the worker decoded them). An id
    the query lacks is no route value either, so the handler's own check answers 400 naming it."""

    def by_query(req: func.HttpRequest) -> Any:
        carried = {name: req.params[name] for name in ids if req.params.get(name)}
        return handler(
            func.HttpRequest(
                req.method,
                req.url,
                headers=dict(req.headers),
                params=dict(req.params),
                route_params=carried,
                body=req.get_body(),
            )
        )

    by_query.__name__ = by_query.__qualname__ = f"{handler.__name__}_by_query"
    by_query.__doc__ = handler.__doc__
    return by_query


def path_parameter(name: str) -> dict[str, Any]:
    """The OpenAPI description of the route id ``name`` (a string)."""
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _in_query(parameters: tuple[dict[str, Any], ...], ids: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    """The twin's OpenAPI parameters: the path's ids as required query parameters, the rest as they are."""
    described = {p["name"]: p for p in parameters if p.get("in") == "path"}
    moved = tuple(
        {
            **described.get(name, {"schema": {"type": "string"}}),
            "name": name,
            "in": "query",
            "required": True,
            "description": "Any id, percent-encoded (`/` as %2F, `+` as %2B).",
        }
        for name in ids
    )
    return moved + tuple(p for p in parameters if p.get("in") != "path")
