"""The latency verdict (never flips between runs at the 1.3 threshold): taken on a
distribution-free interval of the median per-round ratio, "within noise" when it straddles the target."""

from __future__ import annotations

import random

from bench.latency import TARGET, median_interval, verdict_within


def test_the_interval_is_the_order_statistics_that_cover_the_median_at_the_asked_confidence() -> None:
    values = [float(v) for v in range(1, 12)]  # 11 rounds
    low, high, coverage = median_interval(values)
    # k = 3: 1 - 2 * (C(11,0) + C(11,1) + C(11,2)) / 2**11 = 0.9346 >= 0.90; k = 4 would be 0.77
    assert (low, high) == (3.0, 9.0)
    assert abs(coverage - (1 - 2 * 67 / 2048)) < 1e-12
    # too few rounds for the confidence: the whole range, with its own (lower) coverage
    assert median_interval([1.0, 2.0, 3.0]) == (1.0, 3.0, 0.75)


def test_a_ratio_whose_rounds_straddle_the_target_is_within_noise_not_met_or_missed() -> None:
    # The rounds of "get" in the three runs: 1.31, 1.31, 1.13 (a single median flipped)
    straddling = [1.13, 1.18, 1.22, 1.25, 1.28, 1.29, 1.31, 1.31, 1.33, 1.36, 1.40]
    low, high, _ = median_interval(straddling)
    assert verdict_within(low, high, TARGET) == "within noise"
    below = [1.02, 1.05, 1.07, 1.08, 1.1, 1.1, 1.12, 1.15, 1.16, 1.2, 1.35]  # one slow round only
    assert verdict_within(*median_interval(below)[:2], TARGET) == "met"
    above = [1.25, 1.36, 1.38, 1.4, 1.41, 1.42, 1.44, 1.45, 1.47, 1.5, 1.6]
    assert verdict_within(*median_interval(above)[:2], TARGET) == "missed"


def test_the_verdict_of_a_ratio_away_from_the_target_is_stable_across_noisy_runs() -> None:
    # Three runs of 11 rounds each, per-round noise of +-15 %: a true 1.10 is "met" every time, a true
    # 1.50 "missed" every time; a true 1.30 is never called met or missed by more than chance allows.
    rng = random.Random(21)

    def run(true: float) -> str:
        ratios = [true * rng.uniform(0.85, 1.15) for _ in range(11)]
        return verdict_within(*median_interval(ratios)[:2], TARGET)

    assert [run(1.10) for _ in range(3)] == ["met"] * 3
    assert [run(1.50) for _ in range(3)] == ["missed"] * 3
    at_target = [run(1.30) for _ in range(200)]
    assert at_target.count("within noise") >= 180  # >= 90 % (the interval's confidence)
