"""The client's own enums equal what the server says in ``GET /api/v1/state/meta``."""

from __future__ import annotations

from settle_client import EXISTS_STATUSES, HANDLERS, SETTABLE_STATUSES, Scope, Status


def test_the_enums_match_the_seeds():
    assert [(s.value, s.label) for s in Scope] == [
        (1, "App"),
        (2, "Process"),
        (3, "Thread"),
        (4, "Element"),
        (5, "ProcessExecution"),
        (6, "ThreadExecution"),
        (7, "ElementExecution"),
    ]
    assert [(s.value, s.label) for s in Status] == [
        (0, "None"),
        (1, "Processed"),
        (2, "Processing"),
        (3, "Failed"),
        (4, "Skipped"),
        (5, "Superseded"),
        (6, "Expired"),
    ]
    assert Scope.parse("elementexecution") is Scope.ELEMENT_EXECUTION and Scope.parse(4) is Scope.ELEMENT
    assert Status.parse(" processed ") is Status.PROCESSED


def test_the_enums_equal_the_servers_meta(settle):
    meta = settle.meta()
    assert [(s.id, s.name) for s in meta.scopes] == [(s.value, s.label) for s in Scope]
    assert [(s.code, s.name) for s in meta.statuses] == [(s.value, s.label) for s in Status]
    assert meta.handlers == list(HANDLERS)
    assert sorted(meta.exists_statuses) == sorted(s.label for s in EXISTS_STATUSES)
    assert sorted(meta.settable_statuses) == sorted(s.label for s in SETTABLE_STATUSES)


def test_the_meta_contract_parses_and_equals_the_enums():
    """The meta document, word for word, read by the client's model."""
    from settle_client import Meta

    scopes = ",".join(f'{{"id":{s.value},"name":"{s.label}"}}' for s in Scope)
    statuses = ",".join(f'{{"code":{s.value},"name":"{s.label}"}}' for s in Status)
    document = (
        f'{{"scopes":[{scopes}],"statuses":[{statuses}],"handlers":["built-in","null"],'
        '"existsStatuses":["Processed","Skipped"],"settableStatuses":["Processed","Skipped","Failed"]}'
    )
    meta = Meta.model_validate_json(document)
    assert [(s.id, s.name) for s in meta.scopes][3] == (4, "Element")
    assert meta.exists_statuses == ["Processed", "Skipped"] and meta.handlers == list(HANDLERS)
