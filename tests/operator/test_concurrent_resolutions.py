"""Several on-call operators (or one client retrying on a timeout) resolve the same unconfirmed settlement
at once: every identical resolution is answered as done, one audit and one effect, the repeats naming the
audit they repeat; a different resolution afterwards is a 409 that says what it was resolved to.

The unconfirmed claim is made as in ``test_stuck_settlements``: topics without duplicate detection, a send
whose outcome is unknown, the reconciler past its confirmation wait.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from handoff import service
from tests.support.handoff_flows import Flow, complete, event_of
from tests.support.operator_calls import resolve_claim, stuck

from .conftest import principal_headers

OPERATORS = 5


def at_once(n: int, send: Any) -> list[Any]:
    """``send()`` from ``n`` threads released together by a barrier; the answers."""
    barrier = threading.Barrier(n)
    answers: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait(10)
        answer = send()
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == n
    return answers


def resolutions(call: Any, flow: Flow) -> list[dict[str, Any]]:
    return [a for a in event_of(call, flow)["audits"] if a["auditType"] == "ResolveSettlement"]


@pytest.mark.parametrize("resolution", ["released", "delivered"])
def test_identical_resolutions_at_once_are_all_done_with_one_audit(call, resolve, flow, broker, resolution):
    # Given an unconfirmed settlement (for "delivered" the copy did reach the endpoint)
    control = stuck(call, resolve, flow, broker, behaviour="deliver-then-raise")
    delivered_before = len(broker.delivered)
    headers = principal_headers("olivia@contoso.com", "Settle.Operator")
    body = {"messageId": "park-1", "resolution": resolution, "reason": "checked the ERP"}
    # When five identical resolutions arrive at once
    answers = at_once(OPERATORS, lambda: resolve_claim(call, flow, body, headers))
    # Then all are done, four of them as repeats of the one that did it
    assert [a.status for a in answers] == [200] * OPERATORS, [a.body for a in answers]
    assert {a.json["state"] for a in answers} == {resolution}
    assert sorted(a.json["replayed"] for a in answers) == [False] + [True] * (OPERATORS - 1)
    assert {a.json["controlMessageId"] for a in answers} == {control}
    # with exactly one audit, which every answer names
    [audit] = resolutions(call, flow)
    assert {(a.json["audit"] or {}).get("auditTimestamp") for a in answers} == {audit["auditTimestamp"]}
    # and one effect: released, the claim is gone; delivered, it is delivered; nothing more was sent
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    if resolution == "released":
        assert claim is None
    else:
        assert claim is not None and claim.state.name == "delivered"
    assert len(broker.delivered) == delivered_before


@pytest.mark.parametrize(("first", "then"), [("released", "delivered"), ("delivered", "released")])
def test_a_different_resolution_afterwards_says_what_it_was_resolved_to(
    call, resolve, flow, broker, first, then
):
    control = stuck(call, resolve, flow, broker, behaviour="deliver-then-raise")
    body = {"messageId": "park-1", "controlMessageId": control, "reason": "checked", "by": "olivia"}
    assert resolve_claim(call, flow, body | {"resolution": first}).status == 200
    # The same resolution again is still done, and names the original audit
    again = resolve_claim(call, flow, body | {"resolution": first, "by": "oscar"})
    assert again.status == 200 and again.json["replayed"] is True, again.body
    assert again.json["audit"]["auditorName"] == "olivia"
    # A different one is refused, saying what it was resolved to and by whom
    other = resolve_claim(call, flow, body | {"resolution": then, "by": "oscar"})
    assert other.status == 409, other.body
    assert f"resolved {first}" in other.json["detail"] and "olivia" in other.json["detail"]
    assert len(resolutions(call, flow)) == 1


def test_a_release_retried_after_the_hand_off_was_settled_again_is_answered_as_done(
    call, resolve, flow, broker
):
    # Given a released settlement, and the hand-off settled again (a new claim of the same message)
    control = stuck(call, resolve, flow, broker)
    body = {"messageId": "park-1", "controlMessageId": control, "resolution": "released", "reason": "lost"}
    first = resolve_claim(call, flow, body | {"by": "olivia"})
    assert first.status == 200 and first.json["replayed"] is False
    settled = complete(call, flow, settledBy="erp-agent", result={"again": True})
    assert settled.status == 202 and settled.json["controlMessageId"] != control
    # When the operator's client retries the release (it timed out on the first answer)
    again = resolve_claim(call, flow, body | {"by": "olivia"})
    # Then it is the same release, answered as done; the new settlement is untouched
    assert again.status == 200, again.body
    assert (
        again.json["replayed"] is True
        and again.json["audit"]["auditTimestamp"] == first.json["audit"]["auditTimestamp"]
    )
    claim = service.store().get_claim(flow.endpoint, flow.event_id, "park-1")
    assert claim is not None and claim.control_message_id == settled.json["controlMessageId"]
