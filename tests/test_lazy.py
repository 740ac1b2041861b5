"""common.runtime.Lazy: the process-wide holder of the stores and services (built once, dropped on reset)."""

from __future__ import annotations

import threading
import time

from common import runtime


def test_many_threads_at_first_use_build_it_once() -> None:
    built: list[object] = []

    def build() -> object:
        time.sleep(0.05)  # every thread arrives while the first build is running
        built.append(object())
        return built[-1]

    lazy = runtime.Lazy(build)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(lazy())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert got == built * 8


def test_runtime_reset_drops_it_closing_the_old_one_and_the_next_use_builds_anew() -> None:
    closed: list[int] = []
    counter = iter(range(100))
    lazy = runtime.Lazy(lambda: next(counter), close=closed.append)
    assert lazy() == 0
    assert lazy() == 0 and lazy.built() == 0
    runtime.reset()
    assert closed == [0]
    assert lazy.built() is None
    assert lazy() == 1


def test_a_replacement_is_used_until_the_next_drop_and_is_closed_then() -> None:
    closed: list[str] = []
    lazy = runtime.Lazy(lambda: "built", close=closed.append)
    lazy.replace("injected")
    assert lazy() == "injected"
    lazy.drop()
    assert closed == ["injected"]
    assert lazy() == "built"
    lazy.drop()
    lazy.drop()  # nothing built: nothing to close
    assert closed == ["injected", "built"]
