"""Long work: a one-hour job held by the client's lock keeper, simulated with a short lock.

The client extends its lock every third of the lock's length, so the keeper's traffic and the history it
leaves depend only on how many lock lengths the job lasts. A job of one hour under the default 60 s lock
is 60 lock lengths; the benchmark runs the same 60 lock lengths with a 2 s lock (a clock 30 times faster:
two minutes; the smoke run simulates six minutes), through the real client (``settle_client``, its
background keeper and its fenced outcome) against the app's functions in-process, then records the
outcome and reads the record's history.

Figures: history rows the job leaves (target: 1, the lock's start; before extensions were written in
place there was one row per extension too: the baseline column, counted from the extensions the run
made), and the keeper's requests per minute of the simulated job (3 with the default lock: one extension
per 20 s).

The client is imported inside the section, so the bench still runs where the client package is not installed.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx

from bench.harness import Environment, Figure, at_most, missing, verdict_at_most

SECTION = "keeper"
DEFAULT_LOCK_S = 60  # settle_client's default lock length
LOCK_S = 2  # the short lock: the simulated clock runs DEFAULT_LOCK_S / LOCK_S times faster
HOUR_S = 3600
SMOKE_MINUTES = 6


class InProcess(httpx.BaseTransport):
    """An httpx transport that hands each request to the app's HTTP function (no sockets), counting
    the requests per route."""

    def __init__(self, env: Environment) -> None:
        self._env = env
        self.counts: dict[str, int] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        route = request.url.path.removeprefix("/api/v1/")
        name = route.replace("/", "_")
        self.counts[name] = self.counts.get(name, 0) + 1
        body = request.read()
        answer = self._env.app.http(name, json.loads(body) if body else None, method=request.method)
        return httpx.Response(
            answer.status, content=answer.body, headers={"content-type": "application/json"}
        )


def run(env: Environment) -> list[Figure]:
    try:
        from settle_client import SettleClient
    except ImportError as exc:  # the client is not installed here
        return [missing(SECTION, "long work: history rows of a 60-minute job", "1", str(exc))]
    minutes = SMOKE_MINUTES if env.smoke else HOUR_S // 60
    lock_lengths = minutes * 60 / DEFAULT_LOCK_S
    real_s = lock_lengths * LOCK_S
    transport = InProcess(env)
    key: dict[str, Any] = {
        "tenantId": 1,
        "scopeId": 4,
        "entityId": 900,
        "itemEntityKey": "job",
        "itemKey": f"JOB-{uuid.uuid4().hex[:10]}",
    }
    with SettleClient("http://bench.invalid", transport=transport, handle_sigterm=False) as client:
        with client.processing(key, lock_seconds=LOCK_S) as item:
            deadline = time.monotonic() + real_s
            while time.monotonic() < deadline:
                item.check()
                time.sleep(0.05)
            item.data = {"minutes": minutes}
        history = [r for r in client.history(key) if r.status == "Superseded"]
    extensions = transport.counts.get("state_lock_extend", 0)
    per_minute = extensions / minutes
    env.details[SECTION] = {
        "simulated_minutes": minutes,
        "lock_seconds": LOCK_S,
        "real_seconds": round(real_s, 1),
        "requests": transport.counts,
    }
    what = f"{minutes} min job at the default {DEFAULT_LOCK_S} s lock, simulated with a {LOCK_S} s lock"
    return [
        Figure(
            section=SECTION,
            name=f"long work: history rows of a {minutes}-minute job",
            settle=float(len(history)),
            baseline=float(extensions + 1),
            ratio=None,
            target="1 (the lock's start)",
            verdict=verdict_at_most(float(len(history)), 1),
            unit="rows",
            note=f"{what}; {extensions} extensions; baseline: one row per extension (the earlier design)",
        ),
        at_most(
            SECTION,
            "long work: keeper requests per minute",
            per_minute,
            3.5,
            target="≤ 3.5 (one extension per 20 s)",
            unit="req/min",
            note=f"{what}; {extensions} lock/extend requests over {minutes} simulated minutes",
        ),
    ]
