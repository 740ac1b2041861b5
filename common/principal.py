"""Who is acting: the principal App Service authentication vouches for, and whether it may operate.

In Azure, App Service authentication (Entra ID) signs the operator in and passes the principal to the app
in ``x-ms-client-principal`` (base64 JSON with the token's claims, roles included),
``x-ms-client-principal-name`` and ``x-ms-client-principal-id``; it removes those headers from what a
client sends, so the app can trust them (``docs/adr/0013-console-auth.md``). The management routes are
anonymous for the Functions host, so the code decides:

* a principal without the app role ``Settle.Operator`` is refused (403; actions also write an
  ``AccessDenied`` audit row);
* no principal at all is refused (401) wherever a principal is required: in Azure always, locally never
  (``SETTLE_OPERATOR_AUTH``: ``required`` / ``optional``; default ``required`` when ``WEBSITE_INSTANCE_ID``
  is set, which App Service sets on every instance; ``optional`` is refused there, closing the API, since
  it would open it to anonymous callers);
* the headers are believed only where something vouches for them: ``required`` says App Service
  authentication is in front (the Bicep sets it only with an app registration), and locally
  (``optional``) nothing is protected anyway. In Azure without ``required`` (the Bicep's ``disabled``
  when no ``operatorAppClientId`` was given, or a deployment that never said) nothing strips the headers a
  caller sends, so every management request is refused (401) whatever headers it carries: fail closed;
* otherwise the action is recorded as done by the principal's name, else ``by`` from the body, else
  ``api``.

It lives below both APIs that ask who: the management API, and hand-off settlement, whose audits name the
principal only where :func:`headers_vouched` says the headers can be believed.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import azure.functions as func

from common.errors import SettleError
from common.settings import env

OPERATOR_ROLE = "Settle.Operator"
AUTH_SETTING = "SETTLE_OPERATOR_AUTH"
DEFAULT_ACTOR = "api"
_ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
# Far beyond what a front end passes in one header (App Service's request headers are limited to tens of
# KB): a bound on the work a forged header can cause, not a limit a real principal meets.
_MAX_PRINCIPAL = 1_048_576


class Unauthenticated(SettleError, status=401, slug="unauthenticated", title="Sign in first"):
    pass


class AccessDenied(
    SettleError, status=403, slug="access-denied", title="The signed-in principal may not operate Settle"
):
    pass


@dataclass(frozen=True)
class Principal:
    """The principal App Service authenticated (``roles``: its app roles)."""

    name: str | None
    id: str | None
    roles: frozenset[str]
    readable: bool = True

    @property
    def is_operator(self) -> bool:
        return OPERATOR_ROLE in self.roles


@dataclass(frozen=True)
class Actor:
    """Who an operator action is recorded as: the principal when there is one."""

    by: str
    principal: Principal | None

    @property
    def principal_name(self) -> str | None:
        return self.principal.name if self.principal else None

    @property
    def principal_id(self) -> str | None:
        return self.principal.id if self.principal else None


def _header(req: func.HttpRequest, name: str, limit: int | None = 256) -> str | None:
    value = (req.headers.get(name) or "").strip()
    return (value if limit is None else value[:limit]) or None


def principal_of(req: func.HttpRequest) -> Principal | None:
    """The principal in the App Service headers, or None when there is none.

    A principal header that cannot be read counts as a principal without roles (refused, never trusted).
    """
    # Whole: a cut base64 document is unreadable (a user with 200 group claims sends ~18 KB); what the
    # host let through is read, only a document beyond any header limit is refused unread.
    encoded = _header(req, "x-ms-client-principal", None)
    if encoded is not None and len(encoded) > _MAX_PRINCIPAL:
        return Principal(
            name=_header(req, "x-ms-client-principal-name"), id=None, roles=frozenset(), readable=False
        )
    name = _header(req, "x-ms-client-principal-name")
    ident = _header(req, "x-ms-client-principal-id")
    if encoded is None and name is None and ident is None:
        return None
    if encoded is None:
        return Principal(name=name, id=ident, roles=frozenset(), readable=False)
    try:
        padded = encoded + "=" * (-len(encoded) % 4)
        document: Any = json.loads(base64.b64decode(padded, validate=False).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return Principal(name=name, id=ident, roles=frozenset(), readable=False)
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        return Principal(name=name, id=ident, roles=frozenset(), readable=False)
    role_type = document.get("role_typ")
    name_type = document.get("name_typ")
    roles: set[str] = set()
    for claim in document["claims"]:
        if not isinstance(claim, dict):
            continue
        typ, val = claim.get("typ"), claim.get("val")
        if not isinstance(val, str):
            continue
        if typ == role_type or typ in _ROLE_CLAIMS:
            roles.add(val)
        if name is None and name_type and typ == name_type:
            name = val[:256]
    return Principal(name=name, id=ident, roles=frozenset(roles))


def _mode() -> str:
    """``required`` (App Service authentication vouches for the headers), ``optional`` (local runs), or
    ``closed`` (in Azure with nothing that vouches for them)."""
    setting = (env(AUTH_SETTING) or "").strip().lower()
    on_app_service = env("WEBSITE_INSTANCE_ID") is not None
    if setting == "required" or (setting == "optional" and not on_app_service):
        return setting
    # ``optional`` means "no sign-in": fine on a developer's machine, an anonymous management API on App
    # Service. There it is refused like any other value that is not ``required`` (closed, with the reason).
    return "closed" if on_app_service else "optional"


def headers_vouched() -> bool:
    """Whether App Service authentication vouches for the ``x-ms-client-principal*`` headers (it strips
    caller-sent ones): only with ``required``. Elsewhere they are whatever the caller sent."""
    return _mode() == "required"


def principal_required() -> bool:
    return _mode() != "optional"


def actor_of(req: func.HttpRequest, by: str | None = None) -> Actor:
    """Who is asking; 401 when a principal is required and none arrived, or when nothing vouches for the
    principal headers (in Azure without App Service authentication). Roles are checked by the caller
    (:func:`require_operator`), because a refused *action* is audited first."""
    if _mode() == "closed":
        optional = (env(AUTH_SETTING) or "").strip().lower() == "optional"
        raise Unauthenticated(
            (
                f"The management API is closed: {AUTH_SETTING}=optional (no sign-in) is for local runs "
                "and is refused on App Service, where it would open the API to anonymous callers; "
                if optional
                else "The management API is closed: "
            )
            + "App Service authentication is not configured for this app "
            f"(deploy with operatorAppClientId; it sets {AUTH_SETTING}=required), so no signed-in principal "
            "can be told from a forged one."
        )
    principal = principal_of(req)
    if principal is None and principal_required():
        raise Unauthenticated(
            "No signed-in principal reached Settle: the management API needs App Service authentication "
            "(sign in at /.auth/login/aad)."
        )
    if principal is not None:
        return Actor(by=principal.name or principal.id or DEFAULT_ACTOR, principal=principal)
    return Actor(by=(by or "").strip()[:256] or DEFAULT_ACTOR, principal=None)


def allowed(actor: Actor) -> bool:
    """A request without a principal (locally) may operate; a principal needs the app role."""
    return actor.principal is None or actor.principal.is_operator


def denial(actor: Actor) -> AccessDenied:
    who = actor.principal_name or actor.principal_id or "the signed-in principal"
    return AccessDenied(f"{who} does not have the app role {OPERATOR_ROLE}.")


def require_operator(req: func.HttpRequest) -> Actor:
    """For reads: the actor, or 401 / 403 (reads are not audited)."""
    actor = actor_of(req)
    if not allowed(actor):
        raise denial(actor)
    return actor
