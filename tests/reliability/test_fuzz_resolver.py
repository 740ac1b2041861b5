"""Hostile Service Bus messages through the ``resolver``: projected or stored as poison, never a crash.

A message the resolver cannot project must land in the poison table with a reason (ADR: poison is kept for
operators); raising would make the host redeliver it until the broker dead-letters it without one.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.functions.servicebus import ServiceBusMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handoff import service
from tests.reliability.nimbus_model import STATUS
from tests.reliability.tally import TALLY, Tally, sized

pytestmark = pytest.mark.slow

AREA = "resolver fuzz"
PROPS = [
    "MessageType",
    "EventId",
    "To",
    "From",
    "ParentMessageId",
    "OriginatingMessageId",
    "OriginatingFrom",
    "EventTypeId",
    "RetryCount",
    "RetryLimit",
    "DeadLetterReason",
    "DeadLetterErrorDescription",
    "QueueTimeMs",
    "ProcessingTimeMs",
    "HandoffReason",
    "ExternalJobId",
    "ExpectedBy",
    "ThrottleRetryCount",
]
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=10),
    st.sampled_from(
        [*STATUS, "Unknown", "0", "12", "' or 1 eq 1", "a/b#c?", "x" * 1200, "2026-13-45T99:00Z"]
    ),
    # What real senders produce: other scripts' digits, a huge number, DateTime extremes.
    st.sampled_from(["²", "①", "١٢", "\uff11\uff12", "1" * 5_000, " 12 ", "+1", "9" * 30]),
    st.sampled_from(["0001-01-01T00:00:00Z", "9999-12-31T23:00:00-05:00", "1600-12-31T23:59:59Z"]),
)
bodies = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [b"", b"null", b"[]", b'"x"', b"{}", b'{"EventContent": 5}', b'{"ErrorContent": {"ErrorText": 1}}']
    ),
    st.dictionaries(
        st.sampled_from(["EventContent", "ErrorContent", "Other"]),
        st.none() | st.text() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
        max_size=3,
    ).map(lambda d: json.dumps(d).encode()),
)


@st.composite
def messages(draw: st.DrawFn) -> ServiceBusMessage:
    props: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(PROPS), unique=True, max_size=len(PROPS))):
        props[name] = draw(scalar)
    if draw(st.booleans()):  # often a plausible type and event, so the deeper paths run too
        props["MessageType"] = draw(st.sampled_from(sorted(STATUS)))
        props["EventId"] = str(uuid.uuid4())
        props.setdefault("To", "Fuzz-" + uuid.uuid4().hex[:6])
        props.setdefault("From", "Fuzz-" + uuid.uuid4().hex[:6])
    return ServiceBusMessage(
        body=draw(bodies),
        message_id=draw(st.one_of(st.just(str(uuid.uuid4())), st.just(""), st.text(max_size=30))),
        application_properties=props,
        user_properties={},
        session_id=draw(st.one_of(st.none(), st.text(max_size=10))),
        correlation_id=draw(st.one_of(st.none(), st.text(max_size=10))),
        enqueued_time_utc=draw(
            st.one_of(st.none(), st.just(datetime.now(UTC)), st.just(datetime(2026, 1, 1)))
        ),
        delivery_count=draw(st.integers(0, 12)),
    )


def deliver_hostile(resolver: Any, msg: ServiceBusMessage, *, tally: Tally = TALLY) -> None:
    """The checker: the resolver returns (projected or poisoned); raising is a violation."""
    tally.add(AREA, operations=1, fuzz_cases=1)
    try:
        resolver(msg)
    except Exception as exc:
        tally.check(AREA, False, f"resolver raised {exc!r:.300} for {msg.application_properties!r:.300}")


@settings(
    max_examples=sized(1000, 60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(msg=messages())
def test_a_hostile_message_is_projected_or_poisoned_never_a_crash(faulty_tables, functions, msg):
    service.resolver_service().sleep = lambda _s: None
    deliver_hostile(functions["resolver"].get_user_function(), msg)


HOSTILE_HEADERS = {
    "ExpectedBy": st.sampled_from(
        [
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+05:00",
            "1600-12-31T23:59:59Z",
            "9999-12-31T23:00:00-05:00",
            "9999-12-31T23:59:59.9999999Z",
            "2026-13-45T99:00Z",
        ]
    ),
    "ExternalJobId": st.sampled_from(["J" * 2_000, "中" * 600, "a/b#c?" * 200, "\U0001f600" * 400]),
    "RetryCount": st.sampled_from(["²", "١٢", "1" * 5_000]),
}


@st.composite
def parks(draw: st.DrawFn) -> tuple[ServiceBusMessage, ServiceBusMessage]:
    """A plausible PendingHandoffResponse whose headers carry values storage cannot hold as they are, and
    the terminal response that settles it, with a large body in a script that costs more than it looks."""
    endpoint = "Fuzz-" + uuid.uuid4().hex[:6]
    event = str(uuid.uuid4())
    props: dict[str, Any] = {
        "MessageType": "PendingHandoffResponse",
        "EventId": event,
        "To": "Resolver",
        "From": endpoint,
        "HandoffReason": "fuzz",
    }
    for name in draw(st.lists(st.sampled_from(sorted(HOSTILE_HEADERS)), unique=True, min_size=1)):
        props[name] = draw(HOSTILE_HEADERS[name])
    text = draw(st.sampled_from(["a", "é", "中", "\U0001f600"])) * draw(st.sampled_from([10, 180_000]))
    content = {"EventContent": {"EventTypeId": "T", "EventJson": text}, "ErrorContent": None}

    def message(properties: dict[str, Any], body: bytes) -> ServiceBusMessage:
        return ServiceBusMessage(
            body=body,
            message_id=str(uuid.uuid4()),
            application_properties=properties,
            user_properties={},
            session_id="s",
            correlation_id=None,
            enqueued_time_utc=datetime.now(UTC),
            delivery_count=1,
        )

    park = message(props, b'{"EventContent": null, "ErrorContent": null}')
    done = {**props, "MessageType": "ResolutionResponse"}
    done.pop("ExpectedBy", None)
    # as .NET sends it: UTF-8, not escaped
    return park, message(done, json.dumps(content, ensure_ascii=False).encode())


@settings(
    max_examples=sized(60, 15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(flow=parks())
def test_a_park_with_headers_storage_cannot_hold_is_kept_and_settles(faulty_tables, flow):
    from handoff.projection.resolver import Outcome

    resolver = service.resolver_service()
    for msg in flow:
        TALLY.add(AREA, operations=1, fuzz_cases=1)
        outcome = resolver.handle(msg)
        TALLY.check(
            AREA,
            outcome is Outcome.APPLIED,
            f"{dict(msg.application_properties or {})!r:.300} with a {len(msg.get_body())}-byte body was "
            f"{outcome.value}, not projected",
        )
