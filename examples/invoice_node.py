"""A workflow node that posts invoices to a ledger exactly once, with settle-client.

    SETTLE_URL=http://127.0.0.1:7071 python examples/invoice_node.py INV-1 INV-2 BAD-3

Each invoice is processed inside ``client.processing(key)``: the lock is taken (only one worker gets
it), the invoice is posted, and the outcome is recorded with what the ledger answered. Run it twice:
the second run skips what the first posted. An invoice the ledger rejects (``BAD-...``) is released
as Failed with the error, so a later run tries it again; a zero amount is recorded as Skipped.
Run several copies at once: each invoice is still posted once.

Settings: ``SETTLE_URL`` (default: what ``make run`` serves, ``http://127.0.0.1:7071``),
``SETTLE_FUNCTION_KEY`` (Azure).
"""

from __future__ import annotations

import os
import sys
import zlib

from settle_client import AlreadyProcessed, LockHeld, SettleClient

TENANT, NODE = 1, 100  # the workflow node (scope Element) that owns these records


def invoice_key(invoice_id: str) -> dict[str, object]:
    return {
        "tenantId": TENANT,
        "scope": "Element",
        "entityId": NODE,
        "itemEntityKey": "invoice",
        "itemKey": invoice_id,
    }


def post_to_ledger(invoice_id: str) -> dict[str, object]:
    """Stands in for the real side effect (an ERP call) that must not happen twice."""
    if invoice_id.startswith("BAD"):
        raise RuntimeError(f"the ledger rejected {invoice_id}: unknown customer")
    return {"ledgerEntry": zlib.crc32(invoice_id.encode()) % 100_000, "posted": True}


def process(client: SettleClient, invoice_id: str, amount: int) -> str:
    try:
        with client.processing(invoice_key(invoice_id), metadata={"nodeType": "PostInvoice"}) as item:
            if amount == 0:
                item.skip("nothing to post for a zero amount")
                return "skipped"
            item.data = post_to_ledger(invoice_id)
        return "posted"
    except AlreadyProcessed:
        return "already done"
    except LockHeld:
        return "another worker has it"
    except RuntimeError as error:
        return f"failed ({error})"


def main(invoices: list[str]) -> int:
    with SettleClient(function_key=os.environ.get("SETTLE_FUNCTION_KEY")) as client:
        for invoice_id in invoices:
            amount = 0 if invoice_id.startswith("ZERO") else 120
            print(f"{invoice_id}: {process(client, invoice_id, amount)}", flush=True)
        for invoice_id in invoices:
            record = client.get(invoice_key(invoice_id))
            print(f"{invoice_id}: {record.status if record else 'None'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["INV-1", "INV-2"]))
