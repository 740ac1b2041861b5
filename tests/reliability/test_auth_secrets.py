"""Auth levels of every function, and no secret in any committed file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from common.settings import AZURITE_ACCOUNT_KEY
from tests.conftest import Caller
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.slow

AREA = "auth & secrets"
ANONYMOUS = {"health", "openapi_document", "state_meta"}  # state_meta: lookup lists, no I/O
ROOT = Path(__file__).resolve().parents[2]

# A real key is long base64; placeholders ("...", "SAS_KEY_VALUE", a test's "eA==") are not.
SECRET_PATTERNS = {
    "storage/Service Bus key": re.compile(r"(?:AccountKey|SharedAccessKey)\s*=\s*([A-Za-z0-9+/]{40,}={0,2})"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "SAS signature": re.compile(r"[?&]sig=([A-Za-z0-9%+/=]{30,})"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "Functions key in a URL": re.compile(r"[?&]code=([A-Za-z0-9_\-]{40,}={0,2})"),
}
ALLOWED_VALUES = {AZURITE_ACCOUNT_KEY}


def test_only_health_and_the_openapi_document_are_anonymous(functions):
    http = {n: f for n, f in functions.items() if type(f.get_trigger()).__name__ == "HttpTrigger"}
    TALLY.add(AREA, operations=len(functions))
    for name, fn in http.items():
        level = str(getattr(fn.get_trigger().auth_level, "value", fn.get_trigger().auth_level)).lower()
        expected = "anonymous" if name in ANONYMOUS else "function"
        TALLY.check(AREA, level == expected, f"{name} is {level}, must be {expected}")
    TALLY.check(AREA, set(http) >= ANONYMOUS, f"missing anonymous functions: {ANONYMOUS - set(http)}")
    TALLY.check(AREA, len(http) > len(ANONYMOUS), "no operation functions found")


def test_the_openapi_document_requires_a_function_key_exactly_where_the_host_does(functions):
    document = Caller(functions)("openapi_document", method="GET").json
    for ops in document["paths"].values():
        for op in ops.values():
            secured = bool(op.get("security"))
            TALLY.check(
                AREA,
                secured == (op["operationId"] not in ANONYMOUS),
                f"{op['operationId']}: documented security {op.get('security')}",
            )


def committed_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_secret_is_committed():
    files = committed_files()
    assert len(files) > 20  # the scan really ran over the repository
    findings: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        TALLY.add(AREA, operations=1)
        for kind, pattern in SECRET_PATTERNS.items():
            for match in pattern.finditer(text):
                value = match.group(1) if match.groups() else match.group(0)
                if value in ALLOWED_VALUES:
                    continue
                line = text.count("\n", 0, match.start()) + 1
                findings.append(f"{path.relative_to(ROOT)}:{line}: {kind}")
    TALLY.check(AREA, not findings, "secrets in committed files: " + "; ".join(findings))


def test_the_scanner_finds_what_it_looks_for():
    # Given text with a real-looking key, a private key and the Azurite key
    fake = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=" + "Zm9v" * 22 + ";"
    samples = [fake, "-----BEGIN RSA " + "PRIVATE KEY-----", "https://x/y?sv=2024&sig=" + "a" * 40]
    for sample in samples:
        TALLY.check(
            AREA, any(p.search(sample) for p in SECRET_PATTERNS.values()), f"not detected: {sample[:40]}"
        )
    azurite = f"AccountKey={AZURITE_ACCOUNT_KEY};"
    hits = [m.group(1) for p in SECRET_PATTERNS.values() for m in p.finditer(azurite) if m.groups()]
    TALLY.check(AREA, all(h in ALLOWED_VALUES for h in hits), "the Azurite well-known key is not a secret")
