"""Timer triggers on their NCRONTAB schedules, one thread each, one invocation of a timer at a time."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime

from devtools.appsettings import resolve_expression
from devtools.calls import Calls
from devtools.functiontable import TimerFunction
from devtools.ncrontab import Schedule

log = logging.getLogger("settle.devhost")


class Timers:
    """Runs the app's timers: on their schedules (:meth:`start`) and on demand (:meth:`run`)."""

    def __init__(
        self,
        timers: Mapping[str, TimerFunction],
        environ: Mapping[str, str],
        stop: threading.Event,
        calls: Calls,
    ) -> None:
        self.timers = timers
        self.calls = calls
        self.environ = environ
        self._stop = stop
        self.threads: list[threading.Thread] = []
        # One invocation of a timer at a time (the host's singleton lock): schedule and admin endpoint wait.
        self._locks = {name: threading.Lock() for name in timers}

    def run(self, name: str, *, past_due: bool) -> None:
        """Invoke timer function ``name`` once."""
        with self._locks[name]:
            self.calls.timer(self.timers[name], past_due=past_due)

    def _loop(self, fn: TimerFunction, schedule: Schedule) -> None:
        if fn.run_on_startup:
            self._safe_run(fn.name, past_due=False)
        due = schedule.next_after(datetime.now(UTC))
        while not self._stop.is_set():
            wait = (due - datetime.now(UTC)).total_seconds()
            if wait > 0 and self._stop.wait(min(wait, 1.0)):
                return
            if wait > 0:
                continue
            # Late by more than a few seconds (a suspended laptop): tell the function, as the host does.
            late = (datetime.now(UTC) - due).total_seconds() > 5
            self._safe_run(fn.name, past_due=late)
            due = schedule.next_after(datetime.now(UTC))

    def _safe_run(self, name: str, *, past_due: bool) -> None:
        started = time.perf_counter()
        try:
            self.run(name, past_due=past_due)
        except Exception:
            log.error("timer %s raised:\n%s", name, traceback.format_exc())
            return
        log.info(
            "timer %s ran in %.0f ms (past_due=%s)", name, (time.perf_counter() - started) * 1000, past_due
        )

    def start(self) -> dict[str, Schedule]:
        """Start one thread per timer; returns the schedules (timers with unresolvable ones are skipped)."""
        schedules: dict[str, Schedule] = {}
        for fn in self.timers.values():
            try:
                schedule = Schedule.parse(resolve_expression(fn.schedule_expression, self.environ))
            except (KeyError, ValueError) as exc:
                log.error("timer %s not scheduled: %s", fn.name, exc)
                continue
            schedules[fn.name] = schedule
            thread = threading.Thread(
                target=self._loop, args=(fn, schedule), name=f"timer-{fn.name}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
        return schedules
