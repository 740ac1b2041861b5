"""The table clients' retry policy (common/table_retry.py), in a pipeline whose transport answers from a
script (no storage): a write marked ``RESEND_UNRECEIVED_ONLY`` is sent again only when storage never
received it (503 ServerBusy, a connection that never carried it), whatever the client's own retry settings;
any other call keeps the SDK's retries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import AzureError, HttpResponseError, ServiceRequestError, ServiceResponseError
from azure.core.pipeline import Pipeline
from azure.core.pipeline.transport import HttpRequest

from common.table_options import RESEND_UNRECEIVED_ONLY
from common.table_retry import UNRECEIVED_BACKOFF_S, UNRECEIVED_RESENDS, SettleRetryPolicy
from tests.support.scripted_storage import Script, Scripted

URL = "http://127.0.0.1:1/devstoreaccount1/$batch"


def sent(
    script: Script, *, method: str = "POST", client: dict[str, Any] | None = None, **call: Any
) -> Scripted:
    transport = Scripted(script)
    pipeline = Pipeline(transport, policies=[SettleRetryPolicy(**(client or {}))])
    response = pipeline.run(HttpRequest(method, URL), **call)
    status = response.http_response.status_code
    if status >= 400:
        raise HttpResponseError(response=response.http_response)
    return transport


BUSY = (503, "ServerBusy")


@pytest.fixture(params=[{}, {"retry_total": 0}], ids=["sdk-retries", "client-retries-off"])
def client(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    yield request.param


def test_a_write_refused_server_busy_is_sent_again_after_a_growing_back_off(client: dict[str, Any]) -> None:
    transport = sent([BUSY, BUSY, (202, None)], client=client, **RESEND_UNRECEIVED_ONLY)
    assert transport.sent == 3
    assert len(transport.slept) == 2
    for n, slept in enumerate(transport.slept):
        assert UNRECEIVED_BACKOFF_S * 2**n * 0.5 <= slept <= UNRECEIVED_BACKOFF_S * 2**n


def test_a_write_still_refused_after_the_last_resend_reaches_the_caller_as_server_busy(
    client: dict[str, Any],
) -> None:
    with pytest.raises(HttpResponseError) as refused:
        sent([BUSY] * 10, client=client, **RESEND_UNRECEIVED_ONLY)
    assert refused.value.status_code == 503


def test_the_last_resend_is_the_fourth_send() -> None:
    transport = Scripted([BUSY] * UNRECEIVED_RESENDS + [(202, None)])
    pipeline = Pipeline(transport, policies=[SettleRetryPolicy(retry_total=0)])
    assert pipeline.run(HttpRequest("POST", URL), **RESEND_UNRECEIVED_ONLY).http_response.status_code == 202
    assert transport.sent == UNRECEIVED_RESENDS + 1


def test_a_write_whose_connection_never_carried_it_is_sent_again(client: dict[str, Any]) -> None:
    transport = sent(
        [ServiceRequestError("refused (test)"), (202, None)], client=client, **RESEND_UNRECEIVED_ONLY
    )
    assert transport.sent == 2


@pytest.mark.parametrize(
    "answer",
    [(500, "OperationTimedOut"), (503, None), (503, "InternalError"), (429, "TooManyRequests")],
    ids=["OperationTimedOut", "503-no-code", "503-other-code", "429"],
)
def test_a_write_that_may_have_been_received_is_never_sent_again(answer: tuple[int, str | None]) -> None:
    transport = Scripted([answer, (202, None)])
    pipeline = Pipeline(transport, policies=[SettleRetryPolicy()])
    response = pipeline.run(HttpRequest("POST", URL), **RESEND_UNRECEIVED_ONLY)
    assert response.http_response.status_code == answer[0]
    assert transport.sent == 1


@pytest.mark.parametrize(
    "error",
    [ServiceResponseError("answer lost (test)"), AzureError("unknown (test)")],
    ids=["answer-lost", "unknown-error"],
)
def test_a_write_whose_answer_was_lost_is_never_sent_again(error: Exception) -> None:
    transport = Scripted([error, (202, None)])
    pipeline = Pipeline(transport, policies=[SettleRetryPolicy()])
    with pytest.raises(type(error)):
        pipeline.run(HttpRequest("POST", URL), **RESEND_UNRECEIVED_ONLY)
    assert transport.sent == 1


def test_a_call_not_marked_keeps_the_sdks_retries() -> None:
    # a read retried on 500 and on a lost answer, as the SDK's own policy does
    transport = sent([(500, "InternalError"), ServiceResponseError("lost (test)"), (200, None)], method="GET")
    assert transport.sent == 3
    # and the client's own settings still switch them off
    with pytest.raises(HttpResponseError):
        sent([(500, "InternalError"), (200, None)], method="GET", client={"retry_total": 0})


def test_the_table_clients_carry_the_policy_before_the_per_attempt_policies() -> None:
    from common.roundtrips import ROUND_TRIPS
    from common.settings import TableSettings
    from common.tables import Tables

    connection = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
        "TableEndpoint=http://127.0.0.1:1/devstoreaccount1;"
    )
    tables = Tables(TableSettings(connection_string=connection, service_uri=None, client_id=None, prefix="t"))
    policies = tables._service_client()._policies
    retry = [i for i, p in enumerate(policies) if isinstance(p, SettleRetryPolicy)]
    assert len(retry) == 1 and policies[retry[0] + 1] is ROUND_TRIPS
    tables.close()
