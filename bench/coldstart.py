"""Figure 6: cold start. ``import function_app`` in a fresh interpreter ÷ importing the SDKs the app cannot
avoid (``azure.functions``, ``azure.data.tables``, ``pydantic``), in fresh interpreters taking turns; the
median of each. Interpreter start-up itself is outside every timing.

The figure's baseline is the issue's literal ``import azure.functions, azure.data.tables, pydantic``. That
``import pydantic`` is lazy (pydantic 2 loads ``BaseModel`` and pydantic-core on first attribute access),
so it leaves out what every pydantic user pays; ``from pydantic import BaseModel`` is timed beside it for
context, to show how much of the gap is pydantic itself and how much is Settle's own modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.harness import ROOT, Environment, Figure, median, verdict_at_most

SECTION = "cold start"
TARGET = 1.5
HEAVY = ("azure.servicebus", "azure.identity", "azure.storage", "aiohttp", "cryptography")

_PROBE = """
import json, sys, time
t = time.perf_counter()
{imports}
elapsed = time.perf_counter() - t
heavy = [h for h in {heavy!r} if h in sys.modules]
print(json.dumps({{"seconds": elapsed, "modules": len(sys.modules), "heavy": heavy}}))
"""

APP = "import function_app"
SDKS_LITERAL = "import azure.functions, azure.data.tables, pydantic"  # the baseline
SDKS = "import azure.functions, azure.data.tables; from pydantic import BaseModel"  # context


def probe(imports: str) -> dict[str, object]:
    """Run ``imports`` in a fresh interpreter (cwd = the repo) and return its timing."""
    code = _PROBE.format(imports=imports, heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def own_import_costs(top: int = 20) -> dict[str, float]:
    """Self time (ms) of Settle's own modules when ``function_app`` is imported (``-X importtime``)."""
    stderr = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", APP],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stderr
    own: dict[str, float] = {}
    for line in stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        module = parts[2].strip()
        if module.split(".")[0] in ("function_app", "common", "state", "handoff"):
            own[module] = int(parts[0]) / 1000
    return dict(sorted(own.items(), key=lambda kv: -kv[1])[:top])


def run(env: Environment) -> list[Figure]:
    sides = (APP, SDKS, SDKS_LITERAL)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    last: dict[str, object] = {}
    for side in sides:
        probe(side)  # warm the file cache and bytecode for every side alike
    for n in range(env.sizes.coldstart_processes):
        # Rotate which side goes first, so none always runs on a warmer machine.
        for imports in sides[n % 3 :] + sides[: n % 3]:
            result = probe(imports)
            elapsed = result["seconds"]
            assert isinstance(elapsed, float)
            seconds[imports].append(elapsed)
            if imports == APP:
                last = result
    app, sdks, literal = (seconds[s] for s in sides)
    value = median(app) / median(literal)
    own = own_import_costs()
    env.details["coldstart"] = {
        "app_seconds": app,
        "sdk_seconds": literal,
        "sdk_with_basemodel_seconds": sdks,
        "app_probe": last,
        "own_modules_self_ms": own,
    }
    loaded = last.get("heavy")
    heavy = [str(h) for h in loaded] if isinstance(loaded, list) else []
    return [
        Figure(
            section=SECTION,
            name="import function_app / import SDKs",
            settle=median(app),
            baseline=median(literal),
            ratio=value,
            target=f"<= {TARGET}x",
            verdict=verdict_at_most(value, TARGET),
            unit="s",
            note=(
                f"{len(app)} fresh interpreters each; modules loaded by the app: {last.get('modules')}; "
                f"heavy SDKs loaded at import: {', '.join(heavy) or 'none'}; Settle's own modules "
                f"cost {sum(own.values()):.0f} ms self time (largest: "
                + ", ".join(f"{m} {ms:.0f} ms" for m, ms in list(own.items())[:3])
                + ")"
            ),
        ),
        Figure(
            section=SECTION,
            name="import function_app / SDKs with `from pydantic import BaseModel`",
            settle=median(app),
            baseline=median(sdks),
            ratio=median(app) / median(sdks),
            target="(context)",
            verdict="info",
            unit="s",
            note="`import pydantic` is lazy; this baseline also loads BaseModel and pydantic-core",
        ),
    ]
