"""``@client.idempotent``: the function runs once per key; later calls return the stored result."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from settle_client import (
    AlreadyProcessed,
    LockHeld,
    PayloadMismatch,
    PreviousAttempt,
    ResultNotStored,
    SettleClient,
)

from tests.client.conftest import some, wait_until
from tests.support.client_results import refuses_the_result, result_refused


def invoice_key(invoice: dict[str, Any]) -> dict[str, Any]:
    return {
        "tenantId": 1,
        "scope": "Element",
        "entityId": 200,
        "itemEntityKey": "invoice",
        "itemKey": invoice["id"],
    }


def new_invoice(key: dict[str, Any]) -> dict[str, Any]:
    return {"id": key["itemKey"], "amount": 120}


def test_the_function_runs_once_and_later_calls_return_the_stored_result(settle, key):
    calls: list[str] = []

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> dict[str, Any]:
        calls.append(invoice["id"])
        invoice["amount"] = 0  # mutating the argument cannot change the key: it was bound first
        return {"ledgerEntry": 7781, "posted": True}

    invoice = new_invoice(key)
    first = post_invoice(invoice)
    again = post_invoice(new_invoice(key))
    assert first == again == {"ledgerEntry": 7781, "posted": True}
    assert calls == [key["itemKey"]]
    assert settle.get(invoice_key(invoice)).data == first


def test_an_exception_releases_the_key_and_the_next_call_runs_again(settle, key):
    outcomes = iter([RuntimeError("ERP down"), {"posted": True}])

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> Any:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    invoice = new_invoice(key)
    with pytest.raises(RuntimeError, match="ERP down"):
        post_invoice(invoice)
    assert settle.get(invoice_key(invoice)).status == "Failed"
    assert post_invoice(invoice) == {"posted": True}
    assert post_invoice(invoice) == {"posted": True}


class Posted(BaseModel):
    ledger_entry: int
    at: datetime
    amount: Decimal


def test_a_pydantic_result_is_stored_as_json_and_replayed_as_the_declared_model(settle, key):
    posted = Posted(
        ledger_entry=5, at=datetime(2026, 5, 1, 9, 30, 4, 585000, tzinfo=UTC), amount=Decimal("12.50")
    )

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> Posted:
        return posted

    invoice = new_invoice(key)
    assert post_invoice(invoice) is posted
    again = post_invoice(invoice)
    assert isinstance(again, Posted) and again == posted
    assert settle.get(invoice_key(invoice)).data["amount"] == "12.50"


def test_datetime_and_decimal_results_charge_once_and_replay_as_declared(settle, key):
    charges: list[Decimal] = []

    @settle.idempotent(key=invoice_key)
    def charge(invoice: dict[str, Any]) -> Decimal:
        charges.append(Decimal("12.50"))
        return Decimal("12.50")

    @settle.idempotent(key=lambda invoice: {**invoice_key(invoice), "itemKey": invoice["id"] + "-at"})
    def stamp(invoice: dict[str, Any]) -> dict[str, Any]:
        charges.append(Decimal(1))
        return {"at": datetime(2026, 5, 1, tzinfo=UTC), "amount": Decimal("1.10")}

    invoice = new_invoice(key)
    assert charge(invoice) == Decimal("12.50") and charge(invoice) == Decimal("12.50")
    assert isinstance(charge(invoice), Decimal)
    assert stamp(invoice)["amount"] == Decimal("1.10")
    assert stamp(invoice) == {"at": "2026-05-01T00:00:00Z", "amount": "1.10"}  # declared: a JSON dict
    assert len(charges) == 2, "a side effect ran again"


@pytest.mark.parametrize("result", [object(), "x" * (600 * 1024)], ids=["not-json", "over-512-KiB"])
def test_a_result_that_cannot_be_stored_never_reruns_the_side_effect(settle, key, result):
    charges: list[int] = []

    @settle.idempotent(key=invoice_key)
    def charge(invoice: dict[str, Any]) -> Any:
        charges.append(1)
        return result

    invoice = new_invoice(key)
    assert charge(invoice) is result  # the first call has its result
    with pytest.raises(ResultNotStored) as replayed:
        charge(invoice)
    assert isinstance(replayed.value, AlreadyProcessed)
    assert charges == [1], "the side effect ran again"
    record = settle.get(invoice_key(invoice))
    assert record.status == "Processed" and "resultNotStored" in record.data


class RefuseResult(httpx.BaseTransport):
    """Real HTTP, except that Settle answers 413 to the result's outcome write (nothing written)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if refuses_the_result(request):
            self.refused += 1
            return result_refused()
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_result_settle_refuses_after_the_side_effect_never_reruns_it(host, key):
    """The client judged the result storable, Settle refused it (413): the key is recorded Processed
    without it (the fallback write), not released Failed; the next call raises ResultNotStored."""
    charges: list[int] = []
    transport = RefuseResult()
    with SettleClient(host.base_url, transport=transport) as client:

        @client.idempotent(key=invoice_key)
        def charge(invoice: dict[str, Any]) -> dict[str, Any]:
            charges.append(1)
            return {"charged": 1}

        invoice = new_invoice(key)
        assert charge(invoice) == {"charged": 1}
        assert transport.refused == 1
        with pytest.raises(ResultNotStored, match="refused"):
            charge(invoice)
        record = client.get(invoice_key(invoice))
        assert record is not None and record.status == "Processed"
        assert "refused" in record.data["resultNotStored"]
    assert charges == [1], "the side effect ran again"


def test_the_same_key_with_another_payload_raises_payload_mismatch(settle, key):
    calls: list[int] = []

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> dict[str, Any]:
        calls.append(invoice["amount"])
        return {"posted": invoice["amount"]}

    invoice = new_invoice(key)
    assert post_invoice(invoice) == {"posted": 120}
    assert post_invoice(dict(invoice)) == {"posted": 120}  # the same payload replays
    with pytest.raises(PayloadMismatch) as mismatch:
        post_invoice({**invoice, "amount": 999})
    assert mismatch.value.stored_hash != mismatch.value.payload_hash
    assert calls == [120]

    # payload= picks what must match (here: the amount only)
    @settle.idempotent(key=invoice_key, payload=lambda invoice: invoice["amount"])
    def by_amount(invoice: dict[str, Any]) -> dict[str, Any]:
        return {"posted": invoice["amount"]}

    other = {**new_invoice(key), "id": key["itemKey"] + "-p"}
    assert by_amount(other) == by_amount({**other, "note": "ignored"}) == {"posted": 120}
    with pytest.raises(PayloadMismatch):
        by_amount({**other, "amount": 1})


def test_a_concurrent_caller_gets_lock_held_or_waits_for_the_result(host, key):
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    with SettleClient(host.base_url) as client:

        def post(invoice: dict[str, Any]) -> dict[str, Any]:
            calls.append(1)
            started.set()
            assert release.wait(60)
            return {"posted": len(calls)}

        impatient = client.idempotent(key=invoice_key)(post)
        patient = client.idempotent(key=invoice_key, wait_seconds=60)(post)
        invoice = new_invoice(key)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(impatient, invoice)
            assert started.wait(30)
            with pytest.raises(LockHeld):
                impatient(invoice)
            waiting = pool.submit(patient, invoice)
            release.set()
            assert first.result(60) == {"posted": 1}
            assert waiting.result(60) == {"posted": 1}
        assert calls == [1]


def test_a_skipped_record_raises_already_processed(settle, key):
    with settle.processing(invoice_key(new_invoice(key))) as item:
        item.skip("not ours")

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> None:
        pytest.fail("ran for a skipped record")

    with pytest.raises(AlreadyProcessed):
        post_invoice(new_invoice(key))


# -- pass_previous: the function learns how the attempt before it ended, as the with-block does ----------
def test_pass_previous_hands_the_function_the_attempt_a_crash_left_mid_way(settle, key):
    seen: list[Any] = []

    @settle.idempotent(key=invoice_key, pass_previous=True)
    def post_invoice(invoice: dict[str, Any], *, previous: PreviousAttempt | None = None) -> dict[str, Any]:
        seen.append(previous)
        return {"posted": True, "checkedLedgerFirst": bool(previous and previous.lock_expired)}

    # Given a worker that took the key's lock and died without recording anything (its lock expires)
    invoice = new_invoice(key)
    crashed = settle.lock(invoice_key(invoice), lock_seconds=1)
    assert crashed.acquired
    expired_at = some(crashed.locked_until) + timedelta(seconds=2)  # past the storage clock's margin
    wait_until(lambda: datetime.now(UTC) > expired_at, what="the crashed attempt's lock to expire")

    # When the decorated function is called for that key
    result = post_invoice(invoice)

    # Then it ran once, told that the attempt before it stopped mid-way (it may have half posted)
    assert result == {"posted": True, "checkedLedgerFirst": True}
    assert len(seen) == 1 and seen[0] is not None and seen[0].lock_expired is True
    # And `previous` is not part of the payload: the stored result replays for the same arguments
    assert post_invoice(new_invoice(key)) == result and len(seen) == 1


def test_pass_previous_is_none_for_a_new_key_and_the_error_after_a_released_attempt(settle, key):
    seen: list[Any] = []
    outcomes = iter([RuntimeError("ERP down"), {"posted": True}])

    @settle.idempotent(key=invoice_key, pass_previous=True)
    def post_invoice(invoice: dict[str, Any], previous: PreviousAttempt | None = None) -> Any:
        seen.append(previous)
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    with pytest.raises(RuntimeError, match="ERP down"):
        post_invoice(new_invoice(key))
    assert post_invoice(new_invoice(key)) == {"posted": True}
    assert seen[0] is None
    assert seen[1] is not None and seen[1].lock_expired is False and seen[1].error == "RuntimeError: ERP down"


def test_pass_previous_needs_a_function_that_takes_it(settle):
    with pytest.raises(TypeError, match="must take a keyword argument `previous`"):

        @settle.idempotent(key=invoice_key, pass_previous=True)
        def post_invoice(invoice: dict[str, Any]) -> None: ...

    @settle.idempotent(key=invoice_key)  # without the opt-in nothing is passed
    def plain(invoice: dict[str, Any], previous: Any = "unchanged") -> Any:
        return previous

    assert plain({"id": f"plain-{uuid.uuid4().hex}"}) == "unchanged"
