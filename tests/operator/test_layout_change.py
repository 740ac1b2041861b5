"""Changing a shard layout is one explicit, audited step behind operator auth: ``POST /api/v1/layout/{f}``
(management/layout_functions.py) or ``make reshard`` (management/reshard.py). The earlier layout stays
read; the change takes effect once every instance's copy knows it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from common import layouts, runtime
from management import reshard
from tests.conftest import Caller
from tests.layouts import fast_changes
from tests.state.conftest import State, new_key

from .conftest import principal_headers


@pytest.fixture
def layout_call(
    functions: dict[str, Any], monkeypatch: pytest.MonkeyPatch, fresh_tables: str
) -> Iterator[Caller]:
    """The app's functions (function_app.py registers the layout blueprint), on tables of their own whose
    state layout was recorded at S = 1."""
    fast_changes(monkeypatch)
    monkeypatch.setenv("SETTLE_STATE_SHARDS", "1")
    runtime.reset()
    call = Caller(functions)
    assert State(call).lock(new_key()).json["acquired"]  # the first instance records S = 1
    yield call
    runtime.reset()


def change(call: Caller, family: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return call("layout_change", body, route_params={"family": family}, headers=headers)


def test_an_operator_changes_the_layout_and_the_change_is_audited_and_pending(layout_call: Caller) -> None:
    answer = change(
        layout_call,
        "state",
        {"shards": 16, "reason": "node 42 is hot"},
        principal_headers("ops@x", "Settle.Operator"),
    )
    assert answer.status == 202, answer.body
    body = answer.json
    assert (body["shards"], body["pending"]["shards"]) == (1, 16)
    assert body["changes"] == [
        {
            "by": "ops@x",
            "reason": "node 42 is hot",
            "fromShards": 1,
            "toShards": 16,
            "fromAccounts": 1,
            "toAccounts": 1,
            "activeFrom": body["pending"]["since"],
        }
    ]
    # a second change while one is pending is refused
    again = change(layout_call, "state", {"shards": 8}, principal_headers("ops@x", "Settle.Operator"))
    assert again.status == 409 and again.json["type"] == "urn:settle:problem:conflict", again.body
    shown = layout_call("layout_show", method="GET", headers=principal_headers("ops@x", "Settle.Operator"))
    assert shown.status == 200 and shown.json["layouts"][0]["pending"]["shards"] == 16


def test_only_an_operator_may_change_a_layout(layout_call: Caller, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLE_OPERATOR_AUTH", "required")
    assert change(layout_call, "state", {"shards": 4}).status == 401
    denied = change(layout_call, "state", {"shards": 4}, principal_headers("reader@x"))
    assert denied.status == 403, denied.body
    assert layout_call("layout_show", method="GET").status == 401
    assert layouts.audits(runtime.tables(), "state") == []  # nothing changed


@pytest.mark.parametrize(
    ("family", "body", "field"),
    [
        ("state", {"shards": 0}, "shards"),
        ("state", {"shards": 1000}, "shards"),
        ("state", {"shards": "4"}, "shards"),
        ("state", {}, "shards"),
        ("nope", {"shards": 4}, "family"),
        ("handoff", {"shards": 4, "accounts": 2}, "accounts"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    layout_call: Caller, family: str, body: dict[str, Any], field: str
) -> None:
    answer = change(layout_call, family, body)
    assert answer.status == 400, answer.body
    assert answer.content_type.startswith("application/problem+json") and answer.json["field"] == field


def test_nothing_to_change_is_a_409(layout_call: Caller) -> None:
    answer = change(layout_call, "state", {"shards": 1})
    assert answer.status == 409 and "already" in answer.json["detail"]


def test_make_reshard_is_the_same_audited_step(
    layout_call: Caller, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reshard.main(["--family", "state", "--shards", "4", "--reason", "night scale-up"]) == 0
    [audit] = layouts.audits(runtime.tables(), "state")
    assert audit["Actor"].startswith("cli:") and (audit["FromShards"], audit["ToShards"]) == (1, 4)
    assert "becomes 4 shards" in capsys.readouterr().err
    # and a change of a family nothing was recorded for says so (exit 1, a problem naming the family)
    assert reshard.main(["--family", "handoff", "--shards", "4"]) == 1
    assert '"field": "family"' in capsys.readouterr().err


def test_two_operators_changing_at_once_make_one_change(layout_call: Caller) -> None:
    import threading

    barrier = threading.Barrier(2)
    answers: list[Any] = []

    def operator(shards: int) -> None:
        barrier.wait(10)
        answers.append(change(layout_call, "state", {"shards": shards, "by": f"op-{shards}"}))

    threads = [threading.Thread(target=operator, args=(s,)) for s in (4, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status for a in answers) == [202, 409], [a.body for a in answers]
    [audit] = layouts.audits(runtime.tables(), "state")
    winner = next(a for a in answers if a.status == 202).json
    assert audit["ToShards"] == winner["pending"]["shards"]
