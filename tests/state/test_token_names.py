"""A lock token's claims have readable names in code and one-letter aliases on the wire: a token signed
before the names existed verifies, reads the same, and is minted again byte for byte."""

from __future__ import annotations

from common.signing import Signer
from state.token import LockClaims

SIGNER = Signer(b"k" * 32)

# Minted by the code before the claims had names (state/token.py at 5c06c05), with SIGNER.
FULL = (
    "v2.eyJpIjoiMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDEiLCJrIjoiYWJhYmFiYWJhYmFiYWJhYmFiYWJhYmFiYWJhYmFi"
    "YWIiLCJuIjozLCJlIjoiVy9cImRhdGV0aW1lJzIwMjYtMDEtMDJUMDMlM0EwNCUzQTA1LjY3OFonXCIiLCJhIjoxNzY3MzIyODAwMDAw"
    "LCJ1IjoxNzY3MzIyODYwMDAwLCJ3IjoxNzY3MzIyODAwMDAwLCJjIjoxNzY3MzAwMDAwMDAwLCJoIjoiYnVpbHQtaW4iLCJzIjo3LCJ4"
    "Ijo0MiwidCI6ODY0MDAsImIiOiJMb2NrVGFrZW5PdmVyIiwibyI6IlRvb2sgb3ZlciBsb2NrIHggdGhhdCBleHBpcmVkIGF0IHkuIiwi"
    "cSI6InJlcS0xIn0.JxYHT-aTmlAzwPOWYGZ6Tn5pUTV6lZfp7d-YgbUOjLA"
)
BARE = (
    "v2.eyJpIjoiZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmYiLCJrIjoiY2RjZGNkY2RjZGNkY2RjZGNkY2RjZGNkY2RjZGNk"
    "Y2QiLCJuIjoxLCJlIjoiZXRhZy0xIiwiYSI6MCwidSI6MTAwMCwidyI6MCwiYyI6MCwiaCI6ImJ1aWx0LWluIn0."
    "f-uqlvLsHhlYnL-VmQZ1GwjZdion6pDbhpjPs2VUmZs"
)


def test_a_token_minted_before_the_names_reads_the_same() -> None:
    claims = LockClaims.decode(FULL, SIGNER)
    assert claims.lock_id == "0" * 31 + "1"
    assert claims.key_digest == "ab" * 16
    assert claims.version == 3
    assert claims.etag == "W/\"datetime'2026-01-02T03%3A04%3A05.678Z'\""
    assert (claims.locked_at_ms, claims.locked_until_ms) == (1767322800000, 1767322860000)
    assert (claims.updated_at_ms, claims.created_at_ms) == (1767322800000, 1767300000000)
    assert claims.handler_key == "built-in"
    assert (claims.source_app_id, claims.entity_execution_id, claims.retention_seconds) == (7, 42, 86400)
    assert claims.substatus == "LockTakenOver"
    assert claims.note == "Took over lock x that expired at y."
    assert claims.request_id == "req-1"


def test_a_token_minted_now_is_the_token_minted_before() -> None:
    for text in (FULL, BARE):
        assert LockClaims.decode(text, SIGNER).encode(SIGNER) == text


def test_absent_claims_stay_off_the_wire() -> None:
    bare = LockClaims.decode(BARE, SIGNER)
    assert (bare.source_app_id, bare.retention_seconds, bare.substatus, bare.note, bare.request_id) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert LockClaims.model_validate(bare.model_dump(by_alias=True)) == bare
