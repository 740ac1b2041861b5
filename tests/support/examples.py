"""How many examples a property test draws.

`make test` (and any plain pytest run) draws each property test's own number. `make test-unit`, the loop a
maintainer runs after every change, sets ``SETTLE_QUICK_PROPERTIES=1`` and draws a quarter of it (at least
25): the fence interleavings and the settlement and lifecycle models still explore hundreds of orders
there, and the whole number runs in `make test` and CI. The example tests named after each rule, which the
mutation run (docs/mutation.md) holds to catching at least 90 % of broken rules, run in full in both.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("SETTLE_QUICK_PROPERTIES") == "1"


def examples(full: int) -> int:
    """``full`` in the whole suite; a quarter of it (at least 25, at most ``full``) in the quick loop."""
    return min(full, max(full // 4, 25)) if QUICK else full
