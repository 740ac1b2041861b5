"""Reading the principal App Service authentication passes, and who an action is recorded as."""

from __future__ import annotations

import base64
import json

import pytest

from common.principal import Unauthenticated, actor_of, allowed, principal_of
from tests.support.operator_calls import request

from .conftest import principal_headers


def encoded(document: object) -> str:
    return base64.b64encode(json.dumps(document).encode()).decode()


def test_roles_come_from_the_claims_the_role_type_names():
    document = {
        "auth_typ": "aad",
        "name_typ": "preferred_username",
        "role_typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role",
        "claims": [
            {"typ": "preferred_username", "val": "olivia@contoso.com"},
            {"typ": "http://schemas.microsoft.com/ws/2008/06/identity/claims/role", "val": "Settle.Operator"},
        ],
    }
    principal = principal_of(request({"x-ms-client-principal": encoded(document)}))
    assert principal is not None and principal.is_operator and principal.name == "olivia@contoso.com"


@pytest.mark.parametrize(
    "garbage", ["%%%not-base64", encoded([1, 2]), encoded({"claims": "x"}), encoded("text")]
)
def test_an_unreadable_principal_is_a_principal_without_roles(garbage):
    principal = principal_of(request({"x-ms-client-principal": garbage, "x-ms-client-principal-name": "eve"}))
    assert principal is not None and not principal.is_operator and not principal.readable
    assert not allowed(actor_of(request({"x-ms-client-principal": garbage})))


def test_a_name_header_alone_is_not_an_operator():
    actor = actor_of(request({"x-ms-client-principal-name": "mallory"}), by="admin")
    assert actor.by == "mallory" and not allowed(actor)


def test_without_a_principal_the_body_names_who_else_api(monkeypatch):
    monkeypatch.delenv("WEBSITE_INSTANCE_ID", raising=False)
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH", raising=False)
    assert actor_of(request({}), by="  alice ").by == "alice"
    assert actor_of(request({})).by == "api"
    assert allowed(actor_of(request({})))


def test_a_principal_is_required_in_azure_and_optional_only_off_app_service(monkeypatch):
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    with pytest.raises(Unauthenticated):
        actor_of(request({}), by="alice")
    monkeypatch.delenv("SETTLE_OPERATOR_AUTH")
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "0123abcd")
    with pytest.raises(Unauthenticated):
        actor_of(request({}))
    # optional (no sign-in) is for local runs: on App Service it would be an anonymous API, so it is refused
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "optional")
    with pytest.raises(Unauthenticated):
        actor_of(request({}))
    monkeypatch.delenv("WEBSITE_INSTANCE_ID")
    assert actor_of(request({})).by == "api"
    operator = actor_of(request(principal_headers("olivia", "Settle.Operator")))
    assert allowed(operator) and operator.by == "olivia"


@pytest.mark.parametrize("setting", [None, "disabled", "garbage"])
def test_in_azure_without_app_service_authentication_forged_headers_open_nothing(monkeypatch, setting):
    # Given an app in Azure whose App Service authentication is not configured (deployed without
    # operatorAppClientId: the Bicep says "disabled"; or a deployment that never said "required"), nothing
    # strips caller-sent x-ms-client-principal headers, so they prove nothing
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "0123abcd")
    if setting is None:
        monkeypatch.delenv("SETTLE_OPERATOR_AUTH", raising=False)
    else:
        monkeypatch.setenv("SETTLE_OPERATOR_AUTH", setting)
    # Then a caller who forges an operator's headers is refused like one who sends none
    with pytest.raises(Unauthenticated):
        actor_of(request(principal_headers("eve", "Settle.Operator")))
    with pytest.raises(Unauthenticated):
        actor_of(request({}), by="eve")


def test_with_app_service_authentication_its_principal_is_trusted(monkeypatch):
    monkeypatch.setenv("WEBSITE_INSTANCE_ID", "0123abcd")
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    operator = actor_of(request(principal_headers("olivia", "Settle.Operator")))
    assert allowed(operator) and operator.by == "olivia"
    assert not allowed(actor_of(request(principal_headers("mallory"))))
