"""Table round trips per operation, counted by the azure-core policy every client carries.

The targets are in docs/tables.md; this test holds them.
"""

from __future__ import annotations

import time

import pytest

from common.roundtrips import ROUND_TRIPS
from state import service
from tests.state.conftest import new_key


@pytest.fixture(autouse=True)
def warm(state):
    state.exists(new_key())  # table clients created, tables exist


def count(fn) -> int:
    with ROUND_TRIPS.measure() as tally:
        fn()
    return tally.requests


def test_exists_and_get_are_one_point_read(state, key):
    state.set(key, status="Processed")
    assert count(lambda: state.exists(key)) == 1
    assert count(lambda: state.get(key)) == 1


def test_lock_on_a_new_key_is_one_insert(state, key):
    assert count(lambda: state.lock(key)) == 1


def test_a_refused_lock_is_two(state, key):
    state.lock(key)
    service.store()._hints.entries.clear()  # another instance: nothing known about the key
    assert count(lambda: state.lock(key)) == 2


def test_a_refused_lock_known_to_this_instance_is_one_read(state, key):
    state.lock(key)
    assert count(lambda: state.lock(key)) == 1


def test_fenced_set_and_release_with_a_token_are_one_transaction(state):
    a, b = new_key(), new_key()
    ta, tb = state.lock(a).json["lockToken"], state.lock(b).json["lockToken"]
    assert count(lambda: state.set(a, status="Processed", lockToken=ta)) == 1
    assert count(lambda: state.release(b, error="x", lockToken=tb)) == 1


def test_set_and_release_without_a_token_are_read_plus_transaction(state):
    a, b = new_key(), new_key()
    state.lock(a)
    state.lock(b)
    service.store()._hints.entries.clear()
    assert count(lambda: state.set(a, status="Processed")) == 2
    assert count(lambda: state.release(b, error="x")) == 2


def test_lock_again_after_release_on_the_same_instance_is_one(state, key):
    token = state.lock(key).json["lockToken"]
    state.release(key, error="x", lockToken=token)
    assert count(lambda: state.lock(key)) == 1


def test_lock_again_after_release_on_another_instance_is_three(state, key):
    token = state.lock(key).json["lockToken"]
    state.release(key, error="x", lockToken=token)
    service.store()._hints.entries.clear()
    assert count(lambda: state.lock(key)) == 3


def test_seed_pattern_exists_then_lock_then_set_is_three(state, key):
    state.set(key, status="Failed", error="earlier")
    service.store()._hints.entries.clear()
    assert count(lambda: state.exists(key)) == 1
    with ROUND_TRIPS.measure() as tally:
        token = state.lock(key).json["lockToken"]
        state.set(key, status="Processed", lockToken=token)
    assert tally.requests == 2


def test_extend_with_a_token_is_one(state, key):
    token = state.lock(key, lockSeconds=60).json["lockToken"]
    assert count(lambda: state.extend(key, lockToken=token, lockSeconds=120)) == 1


def test_upsert_is_read_plus_transaction(state, key):
    state.set(key, status="Processed", data={"v": 1})
    service.store()._hints.entries.clear()
    assert count(lambda: state.upsert(key, data={"v": 2})) == 2


def test_takeover_of_an_expired_lock_known_to_this_instance_is_one(state, key):
    state.lock(key, lockSeconds=1)
    time.sleep(1.2)
    assert count(lambda: state.lock(key)) == 1
