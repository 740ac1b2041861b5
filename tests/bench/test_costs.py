"""Entity writes counted at the wire hold the documented table (bench/costs.py): a full hand-off and a state
item run through the app's entry points against Azurite, through the counting proxy, and every step writes
exactly the entities documented for it. A change that adds a write fails here until the table (and
docs/benchmark.md, rendered from it) says why. The proxy's own reading of requests is checked without
storage."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import costs
from bench.harness import App, Sizes, environment
from bench.proxy import CountingProxy, applied, entities_in, writes_of


@contextmanager
def _behind_proxy(connection: str, functions: dict[str, Any]) -> Iterator[tuple[App, CountingProxy]]:
    """The app on fresh tables, reaching Azurite through a counting proxy."""
    with (
        environment(Sizes.smoke(), smoke=True, connection=connection, functions=functions) as env,
        CountingProxy(env.table_endpoint()) as proxy,
    ):
        env.use_fresh_prefix(connection=proxy.connection_string(env.connection))
        yield env.app, proxy


def test_a_full_handoff_writes_the_documented_entities_per_step(
    azurite_connection: str, functions: dict[str, Any]
) -> None:
    # Given the app behind the counting proxy, warm (its first hand-off created the tables, read the
    # layouts and registered the endpoint)
    with _behind_proxy(azurite_connection, functions) as (app, proxy):
        costs.handoff(app, proxy, quiet_s=0.2)

        # When one more hand-off runs, step by step, and the next sweeper tick folds its counts
        measured = costs.handoff(app, proxy, quiet_s=0.2)

    # Then every step wrote exactly the entities the table documents
    assert measured.writes() == {step.name: step.writes for step in costs.HANDOFF}
    # And the agent's next only reads
    assert measured.total(("an agent's next",)).read > 0


def test_a_state_item_writes_the_documented_entities_per_step(
    azurite_connection: str, functions: dict[str, Any]
) -> None:
    # Given the app behind the counting proxy, its state tables in use
    with _behind_proxy(azurite_connection, functions) as (app, proxy):
        costs.state_item(app, proxy, quiet_s=0.2, entity_id=1)

        # When an item of a node no lock has touched yet is locked, set Processed and asked for
        measured = costs.state_item(app, proxy, quiet_s=0.2, entity_id=2)

    # Then each step, and the minute's preparation its lock made, wrote the documented entities
    documented = (*costs.STATE_ITEM, costs.STATE_PREPARATION)
    assert measured.writes() == {step.name: step.writes for step in documented}


def test_the_proxy_splits_a_batch_into_its_operations_and_counts_only_what_storage_applied() -> None:
    # Given a transaction of an insert, a conditional replace, an unconditional merge and a delete
    body = (
        b"--changeset_1\r\nContent-Type: application/http\r\n\r\n"
        b"POST http://h/acct/t HTTP/1.1\r\nContent-Type: application/json\r\n\r\n"
        b'{"PartitionKey": "p", "RowKey": "a"}\r\n'
        b"--changeset_1\r\nContent-Type: application/http\r\n\r\n"
        b"PUT http://h/acct/t(PartitionKey='p',RowKey='b') HTTP/1.1\r\nIf-Match: W/\"x\"\r\n\r\n{}\r\n"
        b"--changeset_1\r\nContent-Type: application/http\r\n\r\n"
        b"PATCH http://h/acct/t(PartitionKey='p',RowKey='c') HTTP/1.1\r\nAccept: */*\r\n\r\n{}\r\n"
        b"--changeset_1\r\nContent-Type: application/http\r\n\r\n"
        b"DELETE http://h/acct/t(PartitionKey='p',RowKey='it''s') HTTP/1.1\r\nIf-Match: *\r\n\r\n"
        b"--changeset_1--\r\n"
    )

    # When the proxy reads it
    written = writes_of("POST", "/acct/$batch", "Content-Type: multipart/mixed", body)

    # Then each operation is one entity written, of its kind
    assert [(w.kind, w.table, w.row_key) for w in written] == [
        ("insert", "t", "a"),
        ("replace", "t", "b"),
        ("upsert", "t", "c"),
        ("delete", "t", "it's"),
    ]
    # And a transaction storage refused, or a refused single write, wrote nothing
    assert applied("/acct/$batch", 202, b"HTTP/1.1 204 No Content\r\nHTTP/1.1 201 Created\r\n")
    assert not applied("/acct/$batch", 202, b"HTTP/1.1 409 Conflict\r\n")
    assert not applied("/acct/t", 409, b"")
    # And a read counts the entities its answer holds
    assert entities_in("GET", 200, b'{"value": [{"PartitionKey": "p"}, {"PartitionKey": "q"}]}') == 2
    assert entities_in("GET", 200, b'{"PartitionKey": "p", "RowKey": "a"}') == 1
    assert entities_in("GET", 404, b"{}") == 0
