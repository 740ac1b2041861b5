"""``@client.idempotent``: the function runs once per key; later calls return the stored result."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pydantic import BaseModel
from settle_client import AlreadyProcessed, LockHeld, SettleClient


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


def test_a_pydantic_result_is_stored_as_json(settle, key):
    class Posted(BaseModel):
        ledger_entry: int

    @settle.idempotent(key=invoice_key)
    def post_invoice(invoice: dict[str, Any]) -> Any:
        return Posted(ledger_entry=5)

    invoice = new_invoice(key)
    assert post_invoice(invoice) == Posted(ledger_entry=5)
    assert post_invoice(invoice) == {"ledger_entry": 5}


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
