"""The storage clock: Date headers (whole seconds) narrow down the server's offset."""

from __future__ import annotations

import itertools
import math
import random

from common.clock import SERVER_CLOCK, ServerClock


def test_samples_at_different_phases_pin_the_offset_to_within_the_round_trip():
    # given a server 12.3456 s ahead and responses taking 2 ms
    true_offset, rtt = 12.3456, 0.002
    clock = ServerClock()
    rng = random.Random(7)
    local = 1_000_000.0
    for _ in range(64):
        local += rng.uniform(0.05, 0.9)
        server_second = math.floor(local + rtt / 2 + true_offset)
        clock.observe(server_second, sent_at=local, received_at=local + rtt)
    # then the estimate is within tens of milliseconds (not the header's whole second), and says so
    assert abs(clock.offset_s - true_offset) <= clock.uncertainty_s() + 1e-9
    assert clock.width_s < 0.1 and clock.uncertainty_s() <= clock.width_s


def test_a_clock_step_restarts_the_estimate():
    clock = ServerClock()
    for i in range(10):
        clock.observe(1000.0 + i, sent_at=1000.2 + i, received_at=1000.201 + i)
    clock.observe(5000.0, sent_at=1010.2, received_at=1010.201)  # the server clock jumped
    assert abs(clock.offset_s - (5000.5 - 1010.2)) < 0.6


def test_the_app_learns_the_storage_clock_from_its_responses(call):
    for _ in range(30):
        call(
            "state_exists",
            {"key": {"tenantId": 1, "scopeId": 4, "entityId": 1, "itemKey": "c", "itemEntityKey": "c"}},
        )
    assert SERVER_CLOCK.width_s < 1.0
    assert abs(SERVER_CLOCK.offset_s) < 1.0  # Azurite runs on this machine's clock


def test_the_estimate_never_steps_back_while_the_samples_agree():
    # given a server 0.4 s ahead, first seen through one slow response (a whole-second interval)
    true_offset = 0.4
    clock = ServerClock()
    local = 2_000_000.3
    clock.observe(math.floor(local + 0.05 + true_offset), sent_at=local, received_at=local + 0.1)
    rng = random.Random(11)
    readings = [clock.offset_s]
    for _ in range(200):
        # when later responses at other phases of the second narrow the interval from either side
        local += rng.uniform(0.01, 0.7)
        rtt = rng.uniform(0.001, 0.02)
        clock.observe(math.floor(local + rtt / 2 + true_offset), sent_at=local, received_at=local + rtt)
        readings.append(clock.offset_s)
        # then the estimate stays inside what the samples allow, and the uncertainty covers the truth
        assert clock._lo - 1e-9 <= clock.offset_s <= clock._hi + 1e-9
        assert abs(clock.offset_s - true_offset) <= clock.uncertainty_s() + 1e-9
        below, above = clock.bounds_s()
        assert clock.offset_s - below - 1e-9 <= true_offset <= clock.offset_s + above + 1e-9
    # and it moved only one way (the middle of each narrower interval steps back and forth)
    steps = [b - a for a, b in itertools.pairwise(readings)]
    assert all(step >= 0 for step in steps) or all(step <= 0 for step in steps), steps
    assert clock.width_s < 0.05


def test_readings_never_step_back_when_a_narrower_interval_pulls_the_estimate_back():
    # given a server 0.1 s ahead, first seen through a slow response: the estimate starts at the middle of a
    # whole-second interval, well above the truth
    true_offset = 0.1
    clock = ServerClock()
    local = 3_000_000.95
    clock.observe(math.floor(local + 0.05 + true_offset), sent_at=local, received_at=local + 0.1)
    start = clock.offset_s
    readings = [clock._reading(local + 0.1)]
    offsets = [start]
    # when fast responses, 5 ms apart, pull the upper bound down below the estimate as their second ages
    for _ in range(400):
        local += 0.005
        server_second = math.floor(local + 0.0005 + true_offset)
        clock.observe(server_second, sent_at=local, received_at=local + 0.001)
        offsets.append(clock.offset_s)
        readings.append(clock._reading(local + 0.001))
    # then the estimate itself was pulled back (the case this guards) ...
    assert min(offsets) < start - 0.05, (start, min(offsets))
    # ... yet no reading handed out is earlier than one before it
    assert all(b >= a for a, b in itertools.pairwise(readings))
    # and readings catch up with the estimate once time passes the held one
    later = local + 1.0
    assert clock._reading(later) == later + clock.offset_s


def test_after_a_clock_step_readings_follow_the_new_estimate_back():
    clock = ServerClock()
    for i in range(10):
        clock.observe(1000.0 + i, sent_at=1000.2 + i, received_at=1000.201 + i)
    held = clock._reading(1010.0)
    clock.observe(900.0, sent_at=1010.2, received_at=1010.201)  # the server clock stepped back 110 s
    assert clock._reading(1010.3) < held - 100
