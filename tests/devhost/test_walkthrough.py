"""The README walkthrough (``docs/walkthrough.md``) runs as written against the development host.

Every fenced ``bash`` block is pasted, in order, into one shell (so variables carry over, as for a
reader): bash, and zsh (macOS's login shell), each as a reader has it, without ``set -o pipefail``. The
shell's ``SETTLE_URL`` names a development host started on a free port against the test Azurite (the
page follows that one setting, as every entry point does). The fenced block after each command is its
expected answer: ``json`` is matched as a subset (``"…"`` matches any value; ``$VAR`` is expanded by the
same shell), ``text`` must be equal.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.children import HostProcess, StartHost

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = ROOT / "docs" / "walkthrough.md"
# The page's first block: SETTLE_URL, else what `make run` serves.
ADDRESS = "SETTLE=${SETTLE_URL:-http://127.0.0.1:${SETTLE_RUN_PORT:-7071}}"
# A reader's shells, as they start with no startup files (no pipefail, zsh without bash options).
SHELLS = {"bash": ["bash", "--noprofile", "--norc"], "zsh": ["zsh", "-f"]}
ANY = ("…", "...")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


@dataclass
class Step:
    number: int
    command: str
    expect_kind: str
    expected: str


def walkthrough_steps(markdown: str) -> list[Step]:
    """The bash blocks of the walkthrough, each with the answer block that follows it."""
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]
    steps: list[Step] = []
    for index, (kind, text) in enumerate(blocks):
        if kind != "bash":
            continue
        following = blocks[index + 1] if index + 1 < len(blocks) else None
        assert following is not None and following[0] in {"json", "text"}, (
            f"bash block {len(steps) + 1} of the walkthrough has no expected-answer block after it"
        )
        steps.append(Step(len(steps) + 1, text, following[0], following[1]))
    return steps


class Shell:
    """One interactive-like shell session (``bash`` or ``zsh``) fed block by block, with its defaults."""

    def __init__(self, kind: str = "bash", env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            SHELLS[kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, script: str, timeout: float = 60.0) -> tuple[int, str]:
        marker = f"__settle_walkthrough_{uuid.uuid4().hex}__"
        assert self.process.stdin is not None
        self.process.stdin.write(f"{script}\n__rc=$?; echo; echo {marker} $__rc\n")
        self.process.stdin.flush()
        output: list[str] = []
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError("the shell exited:\n" + "".join(output))
            if line.startswith(marker):
                return int(line.split()[1]), "".join(output).rstrip("\n")
            output.append(line)

    def expand(self, text: str) -> str:
        """``$VAR`` in an expected answer, expanded by this shell (JSON escapes are kept)."""
        code, output = self.run(f"cat <<__EXPECTED__\n{text}__EXPECTED__")
        assert code == 0
        return output

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=10)


def matches(expected: Any, actual: Any) -> bool:
    """Subset match: every expected key/item is there with a matching value; ``"…"`` matches anything."""
    if isinstance(expected, str) and expected in ANY:
        return True
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and matches(value, actual[key]) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) >= len(expected)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=False))
        )
    return bool(expected == actual)


def test_the_walkthrough_parses_into_commands_with_answers() -> None:
    steps = walkthrough_steps(WALKTHROUGH.read_text(encoding="utf-8"))
    assert len(steps) >= 12
    assert steps[0].command.startswith(ADDRESS + "\n")
    commands = "\n".join(s.command for s in steps)
    # One address: every command reaches the app through $SETTLE, never a port of its own
    assert commands.count("7071") == 1 and "localhost:" not in commands
    # Pasted into zsh as into bash: no bash-only expansions, no comments (an interactive zsh runs `#`
    # as a word unless interactivecomments is set), no echo of JSON (zsh's echo decodes backslashes)
    assert "^^" not in commands and ",," not in commands
    assert not re.search(r"(^|\s)#", commands)
    assert not re.search(r"\becho \"\$", commands)
    for needed in (
        "/api/v1/state/lock",
        "/api/v1/state/set",
        "/api/v1/state/history",
        "/admin/functions/resolver",
    ):
        assert needed in commands
    for needed in ("/api/v1/handoffs/Billing/next", "/api/v1/handoffs/complete", "ResolutionResponse"):
        assert needed in commands
    for needed in ("/api/console", "/api/v1/endpoints", "/resubmit", "/api/v1/poison"):
        assert needed in commands


def test_subset_matching_is_strict_where_it_must_be() -> None:
    assert matches({"a": "…"}, {"a": 5, "b": 1})
    assert not matches({"a": 1}, {"a": 2})
    assert not matches({"a": 1}, {"b": 1})
    assert matches([{"s": "x"}], [{"s": "x", "t": 1}, {"s": "y"}])
    assert not matches([{"s": "x"}, {"s": "z"}], [{"s": "x"}, {"s": "y"}])
    assert not matches({"a": None}, {"a": "set"})


@pytest.mark.parametrize("kind", sorted(SHELLS))
def test_the_shell_reports_a_failing_command_and_keeps_variables(kind: str) -> None:
    needs(kind)
    shell = Shell(kind)
    try:
        assert shell.run("A=1; false") == (1, "")
        assert shell.run("false | cat") == (0, "")  # no pipefail: what a reader's shell does
        assert shell.run('echo "$A"') == (0, "1")
        assert shell.expand('{"a": "$A", "b": "x\\"y"}\n') == '{"a": "1", "b": "x\\"y"}'
    finally:
        shell.close()


def needs(kind: str) -> None:
    """zsh is not on every Linux machine; CI installs it (.ci/run), elsewhere its run is skipped."""
    if shutil.which(kind) is None:
        if os.environ.get("SETTLE_REQUIRE_ZSH"):
            pytest.fail(f"{kind} is not installed (SETTLE_REQUIRE_ZSH is set)")
        pytest.skip(f"{kind} is not installed (apt-get install {kind} / brew install {kind}): not run in it")


NEEDED_OPERATIONS = (
    ("post", "/api/v1/state/exists", "state/functions.py"),
    ("post", "/api/v1/state/lock", "state/functions.py"),
    ("post", "/api/v1/state/set", "state/functions.py"),
    ("post", "/api/v1/state/history", "state/functions.py"),
    ("get", "/api/v1/handoffs/{endpointId}/next", "handoff/functions.py"),
    ("post", "/api/v1/handoffs/complete", "handoff/functions.py"),
    ("get", "/api/v1/events/{endpointId}/{eventId}", "handoff/functions.py"),
    ("get", "/api/v1/endpoints", "management/functions.py"),
    ("get", "/api/v1/endpoints/{endpointId}/events", "management/functions.py"),
    ("post", "/api/v1/events/{endpointId}/{eventId}/resubmit", "management/functions.py"),
    ("get", "/api/v1/poison", "management/functions.py"),
    ("post", "/api/v1/poison/{day}/{id}/replay", "management/functions.py"),
)


def missing_operations(host: HostProcess) -> list[str]:
    """Operations the walkthrough needs that the served app does not have (from its OpenAPI document)."""
    import httpx

    paths = httpx.get(host.base_url + "/api/v1/openapi.json").json().get("paths", {})
    missing = [
        f"{verb.upper()} {path} ({owner})"
        for verb, path, owner in NEEDED_OPERATIONS
        if verb not in paths.get(path, {})
    ]
    return missing


@pytest.mark.parametrize("kind", sorted(SHELLS))
def test_walkthrough_runs_as_written_against_the_development_host(kind: str, start_host: StartHost) -> None:
    needs(kind)
    assert shutil.which("jq"), "the walkthrough uses jq: install it (apt-get install jq / brew install jq)"
    host = start_host()  # one per shell: a run leaves leased hand-offs the next run's agents must not see
    missing = missing_operations(host)
    assert not missing, "the app does not serve what the walkthrough needs yet: " + "; ".join(missing)
    host_names = host.output()
    assert "resolver: serviceBusTrigger" in host_names, "the app has no `resolver` Service Bus function yet"

    steps = walkthrough_steps(WALKTHROUGH.read_text(encoding="utf-8"))
    # The reader's environment: SETTLE_URL names the app; `settle` is where `make install` put it (this
    # test's virtualenv: a worktree may have none of its own)
    environ = {k: v for k, v in os.environ.items() if k not in {"SETTLE_RUN_PORT", "BASH_ENV", "ENV"}}
    environ.update(
        SETTLE_URL=host.base_url, PATH=f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    )
    shell = Shell(kind, environ)
    try:
        for step in steps:
            code, output = shell.run(step.command)
            context = (
                f"walkthrough step {step.number} failed in {kind}\n--- command\n{step.command}\n"
                f"--- output\n{output}\n"
                f"--- host log (tail)\n{host.output()[-3000:]}"
            )
            assert code == 0, context
            expected = shell.expand(step.expected).strip()
            if step.expect_kind == "text":
                assert output.strip() == expected, context + f"\n--- expected\n{expected}"
                continue
            try:
                actual = json.loads(output)
            except json.JSONDecodeError as exc:
                raise AssertionError(context + "\n(the answer is not JSON)") from exc
            assert matches(json.loads(expected), actual), context + f"\n--- expected (subset)\n{expected}"
    finally:
        shell.close()
