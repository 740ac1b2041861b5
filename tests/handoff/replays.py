"""Identical requests racing on two instances, and what their answers must say.

Used by ``tests/handoff/test_replay_state.py`` (settlements) and ``tests/operator/test_replay_state.py``
(the operator's actions, through the same claim); the fixtures are ``delivered_then_raised`` and
``other_instance`` (``tests/handoff/conftest.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handoff import service

from .broker import Broker

CALLERS = 10
RESULT = {"ledgerEntry": 7781}


@dataclass(frozen=True)
class Answer:
    """What one request was answered: its claim ``state``, and whether it answered a retry."""

    state: str
    confirmed: bool
    replayed: bool

    @classmethod
    def of_http(cls, result: Any) -> Answer:
        assert result.status == 202, result.body
        return cls(result.json["state"], result.json["confirmed"], result.json["replayed"])

    @classmethod
    def of(cls, accepted: Any) -> Answer:
        return cls(accepted.state, accepted.confirmed, accepted.replayed)


def over_two_instances(here: Callable[[], Answer], there: Callable[[], Answer]) -> list[Callable[[], Answer]]:
    """``CALLERS`` identical requests, every other one on the other instance."""
    return [here if i % 2 == 0 else there for i in range(CALLERS)]


def at_once(requests: list[Callable[[], Answer]]) -> list[Answer]:
    """Every request at the same instant, each on its own thread."""
    barrier = threading.Barrier(len(requests))
    answers: list[Answer] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def one(request: Callable[[], Answer]) -> None:
        barrier.wait(10)
        try:
            answer = request()
        except BaseException as exc:  # reported on the test's thread
            with guard:
                errors.append(exc)
            return
        with guard:
            answers.append(answer)

    threads = [threading.Thread(target=one, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(answers) == len(requests)
    return answers


def split(answers: list[Answer], stored: str) -> str:
    """How the answers fall, against the stored state: "1 delivered/replayed, 9 sending/replayed; ..."."""
    counts: dict[tuple[str, bool], int] = {}
    for a in answers:
        counts[(a.state, a.replayed)] = counts.get((a.state, a.replayed), 0) + 1
    shown = ", ".join(f"{n} {s}/{'replayed' if r else 'first'}" for (s, r), n in sorted(counts.items()))
    return f"{shown}; storage holds {stored}"


def check_replays_answer_storage(
    answers: list[Answer], broker: Broker, endpoint_id: str, event_id: str, addressed: str
) -> None:
    """Every replay answers the claim as storage holds it once the race is over; one message was sent."""
    claim = service.store().get_claim(endpoint_id, event_id, addressed)
    assert claim is not None
    stored = claim.state.name
    assert stored == "delivered"  # the resolver projected the one copy
    replays = [a for a in answers if a.replayed]
    assert {(a.state, a.confirmed) for a in replays} == {(stored, True)}, split(answers, stored)
    firsts = [a for a in answers if not a.replayed]
    assert len(firsts) <= 1, split(answers, stored)
    # The one caller whose own send raised answers what storage held when it answered: the outcome not
    # known (its own write won), or what storage holds (a replay's move came first).
    assert {a.state for a in firsts} <= {"sending", stored}, split(answers, stored)
    assert len(broker.for_event(event_id)) == 1
