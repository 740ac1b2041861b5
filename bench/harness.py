"""The benchmark's shared machinery: sizes, the app under test, raw Table clients, timing, figures, output.

Every figure is a ratio of two things measured side by side in the same run against the same Azurite
(interleaved where they are timings), so a slow or noisy machine moves both sides and not the verdict.

The app is imported inside the function that loads it, after the bench has set the environment it reads.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import azure.functions as func
from azure.data.tables import TableServiceClient
from azure.functions.timer import TimerRequest
from pydantic import BaseModel, ConfigDict, Field

from common import runtime
from devtools.azurite import Azurite

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results.json"

# "within noise": the figure's confidence interval straddles its target (bench/latency.py)
Verdict = Literal["met", "missed", "info", "missing", "within noise"]


# ---------------------------------------------------------------------------------------------- sizes


def _size[T](full: T, smoke: T) -> T:
    """One knob of :class:`Sizes`: the full run's size (the default) beside the smoke run's."""
    return field(default=full, metadata={"smoke": smoke})


@dataclass(frozen=True)
class Sizes:
    """How much work each section does: the defaults are the full run's, :meth:`smoke` a seconds-long one."""

    rounds: int = _size(7, smoke=2)  # medians are taken over this many rounds
    roundtrip_rounds: int = _size(3, smoke=1)
    # operations counted together per round (batched work is amortised over them)
    roundtrip_ops: int = _size(10, smoke=1)
    roundtrip_quiet_s: float = _size(0.5, smoke=0.25)  # no storage request for this long: work has drained
    # lock + set cycles at one call per 0.3 s (context; 0: skipped)
    roundtrip_paced_cycles: int = _size(10, smoke=0)
    latency_reps: int = _size(40, smoke=3)  # calls per operation per round
    contention_ks: tuple[int, ...] = _size((2, 8, 32), smoke=(2, 8))
    contention_repeats: int = _size(10, smoke=1)
    # 100k took 452 s to load on a busy machine, 25k 197 s: make bench must stay under 10 min
    catchup_sizes: tuple[int, int] = _size((2_000, 10_000), smoke=(200, 1_000))
    # through HTTP, when the bulk loader is missing
    catchup_fallback_sizes: tuple[int, int] = _size((1_000, 5_000), smoke=(50, 250))
    # 50 due locks per run (was 100): the size-dependent part of a run weighs more in its time
    catchup_expired: int = _size(50, smoke=10)
    catchup_runs: int = _size(5, smoke=2)
    # four messages per event; a throughput ratio: 600 messages over 10 blocks
    resolver_events: int = _size(150, smoke=10)
    resolver_blocks: int = _size(10, smoke=2)
    coldstart_processes: int = _size(11, smoke=2)
    # endpoints (x 4 shards) a find by each kind of id runs over
    find_endpoints: int = _size(500, smoke=12)

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(**{knob.name: knob.metadata["smoke"] for knob in fields(cls)})


# -------------------------------------------------------------------------------------------- figures


class Figure(BaseModel):
    """One row of the results table."""

    model_config = ConfigDict(frozen=True)

    section: str
    name: str
    settle: float | None
    baseline: float | None
    ratio: float | None
    target: str
    verdict: Verdict
    unit: str = ""
    note: str = ""


class Results(BaseModel):
    """What ``bench/results.json`` holds."""

    started_at: str
    duration_s: float
    smoke: bool
    command: str
    python: str
    sections: dict[str, list[Figure]]
    details: dict[str, Any]
    machine: dict[str, Any] = Field(default_factory=dict)
    # Wall time of each section (s), in the order run: the machine is shared, so the total alone does not
    # say which section grew.
    section_s: dict[str, float] = Field(default_factory=dict)


def ratio(settle: float | None, baseline: float | None) -> float | None:
    if settle is None or baseline is None or baseline == 0:
        return None
    return settle / baseline


def verdict_at_most(value: float | None, limit: float) -> Verdict:
    if value is None:
        return "missing"
    return "met" if value <= limit + 1e-9 else "missed"


def verdict_at_least(value: float | None, limit: float) -> Verdict:
    if value is None:
        return "missing"
    return "met" if value >= limit - 1e-9 else "missed"


def verdict_equal(value: float | None, expected: float) -> Verdict:
    if value is None:
        return "missing"
    return "met" if abs(value - expected) < 1e-9 else "missed"


def at_most(
    section: str, name: str, value: float, limit: float, *, target: str, unit: str, note: str = ""
) -> Figure:
    """A figure without a baseline: ``value`` (shown to two decimals) must stay at or below ``limit``."""
    return Figure(
        section=section,
        name=name,
        settle=round(value, 2),
        baseline=None,
        ratio=None,
        target=target,
        verdict=verdict_at_most(value, limit),
        unit=unit,
        note=note,
    )


def missing(section: str, name: str, target: str, why: str, unit: str = "") -> Figure:
    """A figure that could not be measured (the code under test is absent or failed)."""
    why = " ".join(why.split())  # one line: exception texts (pydantic's) span several
    return Figure(
        section=section,
        name=name,
        settle=None,
        baseline=None,
        ratio=None,
        target=target,
        verdict="missing",
        unit=unit,
        note=why if len(why) <= 240 else why[:237] + "...",
    )


# --------------------------------------------------------------------------------------------- timing


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def interleaved(
    ops: Mapping[str, Callable[[], Callable[[], Any]]], *, rounds: int, reps: int
) -> dict[str, list[float]]:
    """Time several operations side by side; returns each operation's per-round median (seconds).

    ``ops`` maps a name to a *preparer*: called untimed, it sets up one call (a fresh key, a lock) and
    returns the callable that is timed. Within a round the operations alternate call by call, and the
    order rotates every call, so drift in the machine affects all of them alike.
    """
    names = list(ops)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        samples: dict[str, list[float]] = {name: [] for name in names}
        for rep in range(reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                call = ops[name]()
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
        for name in names:
            per_round[name].append(median(samples[name]))
    return per_round


# ---------------------------------------------------------------------------------- the app under test

_FUNCTIONS: dict[str, Any] | None = None


def load_functions() -> dict[str, Any]:
    """The app's functions by name (``get_functions`` may run only once per app object)."""
    global _FUNCTIONS
    if _FUNCTIONS is None:
        import function_app

        _FUNCTIONS = {str(f.get_function_name()): f for f in function_app.app.get_functions()}
    return _FUNCTIONS


@dataclass
class HttpAnswer:
    status: int
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class App:
    """Calls the app's functions exactly as the Functions worker does (the entry points)."""

    functions: Mapping[str, Any]

    def has(self, name: str) -> bool:
        return name in self.functions

    def http(
        self,
        name: str,
        body: Any = None,
        *,
        method: str | None = None,
        params: Mapping[str, str] | None = None,
        route: Mapping[str, str] | None = None,
    ) -> HttpAnswer:
        fn = self.functions[name]
        trigger = fn.get_trigger()
        methods = [str(getattr(m, "value", m)) for m in (trigger.methods or ["POST"])]
        req = func.HttpRequest(
            method or methods[0],
            f"http://localhost/api/{trigger.route or name}",
            headers={"content-type": "application/json"},
            params=dict(params or {}),
            route_params=dict(route or {}),
            body=b"" if body is None else json.dumps(body).encode(),
        )
        resp: func.HttpResponse = fn.get_user_function()(req)
        return HttpAnswer(resp.status_code, resp.get_body())

    def message(self, name: str, message: Any) -> None:
        """Deliver one Service Bus message to a trigger function (exceptions propagate)."""
        self.functions[name].get_user_function()(message)

    def timer(self, name: str) -> None:
        """Run a timer function once."""

        self.functions[name].get_user_function()(TimerRequest(past_due=False))


# ------------------------------------------------------------------------------------------ environment


@dataclass
class Environment:
    """The Azurite the run uses, the app pointed at it, and raw SDK clients for the baselines."""

    connection: str
    app: App
    sizes: Sizes
    smoke: bool
    details: dict[str, Any] = field(default_factory=dict)
    _raw_tables: list[str] = field(default_factory=list)

    def use_fresh_prefix(
        self,
        *,
        prefix: str | None = None,
        policies: Sequence[Any] = (),
        connection: str | None = None,
        **extra_env: str,
    ) -> str:
        """Point the app at empty tables (a new prefix, or ``prefix``) and rebuild its cached clients;
        ``connection`` reaches Azurite another way (through the counting proxy)."""
        prefix = prefix or "b" + uuid.uuid4().hex[:12]
        os.environ["SETTLE_TABLES"] = connection or self.connection
        os.environ["SETTLE_TABLE_PREFIX"] = prefix
        os.environ.pop("SETTLE_TABLES__tableServiceUri", None)
        os.environ.update(extra_env)
        runtime.reset(policies=policies)
        return prefix

    def table_endpoint(self) -> str:
        """``http://host:port`` of Azurite's table service (from the connection string)."""
        for part in self.connection.split(";"):
            name, _, value = part.partition("=")
            if name.strip().lower() == "tableendpoint":
                scheme, _, rest = value.partition("://")
                return f"{scheme}://{rest.split('/', 1)[0]}"
        raise ValueError("the connection string has no TableEndpoint")

    def raw_table(self, purpose: str) -> Any:
        """A plain SDK ``TableClient`` on a new table (no Settle code on its path)."""

        service = TableServiceClient.from_connection_string(self.connection)
        name = f"raw{purpose}{uuid.uuid4().hex[:10]}"
        service.create_table(name)
        self._raw_tables.append(name)
        return service.get_table_client(name)


@contextmanager
def environment(
    sizes: Sizes, *, smoke: bool, connection: str | None = None, functions: Mapping[str, Any] | None = None
) -> Iterator[Environment]:
    """Start Azurite (unless ``connection`` is given), load the app, and restore ``os.environ`` after."""
    names = ("SETTLE_TABLES", "SETTLE_TABLE_PREFIX", "SETTLE_LOOPBACK", "SETTLE_LAYOUT_REFRESH_SECONDS")
    saved = {k: os.environ.get(k) for k in names}
    azurite = None
    try:
        if connection is None:
            azurite = Azurite(services=("table",)).start()
            connection = azurite.connection_string
        env = Environment(
            connection=connection,
            app=App(functions if functions is not None else load_functions()),
            sizes=sizes,
            smoke=smoke,
        )
        env.use_fresh_prefix()
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        runtime.reset()
        if azurite is not None:
            azurite.stop()


# ---------------------------------------------------------------------------------------------- output


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if float(value).is_integer():
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"
    if unit in ("requests", "entities", "holders"):
        return f"{value:.2f}"
    if unit == "s":
        return f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "msg/s":
        return f"{value:,.0f}/s"
    return f"{value:.3g}"


def render_table(figures: Sequence[Figure]) -> str:
    """A plain text table: figure, Settle, baseline, ratio, target, verdict."""
    header = ("figure", "Settle", "baseline", "ratio", "target", "verdict")
    rows = [
        (
            f.name,
            _fmt(f.settle, f.unit),
            _fmt(f.baseline, f.unit),
            "-" if f.ratio is None else f"{f.ratio:.2f}",
            f.target,
            f.verdict.upper() if f.verdict in ("missed", "missing") else f.verdict,
        )
        for f in figures
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)), line]
    section = None
    for f, row in zip(figures, rows, strict=True):
        if f.section != section:
            section = f.section
            out.append(f"[{section}]")
        out.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    notes = [f"- {f.name}: {f.note}" for f in figures if f.note]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def render_markdown(figures: Sequence[Figure]) -> str:
    """The same table as Markdown (for docs/benchmark.md)."""
    out = [
        "| section | figure | Settle | baseline | ratio | target | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        cells = (
            f.section,
            f.name,
            _fmt(f.settle, f.unit),
            _fmt(f.baseline, f.unit),
            "-" if f.ratio is None else f"{f.ratio:.2f}",
            f.target,
            f"**{f.verdict}**" if f.verdict in ("missed", "missing") else f.verdict,
        )
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


def section_times(results: Results) -> str:
    """``roundtrips 150 s, latency 93 s, ...``: where a run's time went (a section run beside the others
    is marked so: its time overlaps theirs)."""
    beside = results.details.get("beside", {}).get("sections", [])
    return (
        ", ".join(
            f"{name} {seconds:.0f} s" + (" (beside)" if name in beside else "")
            for name, seconds in results.section_s.items()
        )
        or "-"
    )


def write_results(results: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(results.model_dump_json(indent=2) + "\n", encoding="utf-8")


def log(message: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()
