"""Every app setting the code reads is set by the Bicep (found by scanning the code, not from a list)."""

from __future__ import annotations

from tests.infra.bicep import REPO, load_infra
from tests.infra.codescan import Scan, scan_code, scan_source, sources
from tests.infra.settings import (
    DEFAULTS_FOR_AZURE,
    LOCAL_ONLY,
    NUMBERED_NOT_SET,
    PLATFORM_SET,
    SEEDS,
    TELEMETRY_OPTIONS,
)
from tests.infra.wiring import SITE, numbered_app_settings

# Settings the Functions host (not our code) needs in Azure.
HOST_SETTINGS = {
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "AzureWebJobsStorage__blobServiceUri",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
}


def bicep_settings() -> set[str]:
    settings = load_infra("modules/functionapp.bicep").variables["appSettings"]
    assert isinstance(settings, dict)
    return set(settings)


def test_the_scan_finds_the_reads_we_know_of() -> None:
    # Guards the scanner itself: each of these is read in a different way (env, f-string constant, %..%).
    reads = scan_code().reads
    for name in (
        "SETTLE_TABLES__tableServiceUri",
        "SETTLE_TABLE_PREFIX",
        "ServiceBusConnection__fullyQualifiedNamespace",
        "RESOLVER_TOPIC",
        "RESOLVER_SUBSCRIPTION",
        "HANDOFF_SWEEPER_SCHEDULE",
        "HANDOFF_SWEEPER_ENABLED",
        "SETTLE_LOOPBACK",
        "SETTLE_OPERATOR_AUTH",  # common/principal.py
    ):
        assert name in reads, name


def test_the_scan_reads_every_package_the_code_package_deploys() -> None:
    # Settings read by management/ or console/ went unchecked (only common, state, handoff).
    scanned = {p.relative_to(REPO).parts[0] for p in sources()}
    assert {"function_app.py", "common", "state", "handoff", "management", "console"} <= scanned
    assert not scanned & {"tests", "bench", "devtools", "client", "examples"}


def test_every_setting_the_code_reads_is_set_by_the_bicep() -> None:
    scan = scan_code()
    assert scan.unresolved == [], "setting names must be literals or module constants"
    missing = {
        name: sorted(files)
        for name, files in scan.reads.items()
        if name not in bicep_settings()
        and name not in LOCAL_ONLY
        and name not in TELEMETRY_OPTIONS
        and name not in PLATFORM_SET
        and name not in SEEDS
        and name not in DEFAULTS_FOR_AZURE
    }
    assert missing == {}


def bicep_numbered_settings() -> set[str]:
    file = load_infra("modules/functionapp.bicep")
    site = next(r for r in file.resources if r.type.lower() == SITE)
    return set(numbered_app_settings(site, file))


def test_every_numbered_setting_the_code_reads_is_set_for_each_extra_account_or_listed() -> None:
    # State account i >= 1 is read as SETTLE_TABLES_{i}...; the code declares each pattern once.
    numbered = scan_code().numbered
    assert {
        "SETTLE_TABLES_{i}",
        "SETTLE_TABLES_{i}__tableServiceUri",
        "SETTLE_TABLES_{i}__clientId",
    } <= set(numbered)
    missing = sorted(set(numbered) - bicep_numbered_settings() - set(NUMBERED_NOT_SET))
    assert missing == []
    assert bicep_numbered_settings() & set(NUMBERED_NOT_SET) == set()


def test_every_binding_connection_has_its_identity_settings() -> None:
    scan = scan_code()
    assert "ServiceBusConnection" in scan.connections
    for prefix in scan.connections:
        for suffix in ("__fullyQualifiedNamespace", "__credential", "__clientId"):
            assert f"{prefix}{suffix}" in bicep_settings(), f"{prefix}{suffix}"


def test_local_only_settings_are_not_set_in_azure() -> None:
    assert set(LOCAL_ONLY) & bicep_settings() == set()


def test_telemetry_exports_to_application_insights_only_and_joins_the_host_s_trace() -> None:
    # Unset in Azure: no console/OTLP exporter, telemetry not switched off.
    assert set(TELEMETRY_OPTIONS) & bicep_settings() == set()
    settings = load_infra("modules/functionapp.bicep").variables["appSettings"]
    assert isinstance(settings, dict)
    # Settle joins the host's trace from context.trace_context itself; with either of these the worker
    # would configure telemetry of its own (a second pipeline, an error logged at start).
    assert "PYTHON_ENABLE_OPENTELEMETRY" not in settings
    assert "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY" not in settings


def test_the_host_settings_and_the_sdk_identity_are_set() -> None:
    assert HOST_SETTINGS | {"AZURE_CLIENT_ID"} <= bicep_settings()


def test_a_new_setting_in_code_would_be_found() -> None:
    # Given a module that reads settings in every supported way
    source = (
        "import os\n"
        "PREFIX = 'NEW_CONN'\n"
        "a = env('NEW_PLAIN')\n"
        'b = env_flag("NEW_FLAG")\n'
        "c = os.environ.get('NEW_ENVIRON')\n"
        "d = os.environ['NEW_SUBSCRIPT']\n"
        "e = env(f'{PREFIX}__clientId')\n"
        "@bp.timer_trigger(arg_name='t', schedule='%NEW_SCHEDULE%')\n"
        "@bp.service_bus_queue_trigger(arg_name='m', queue_name='q', connection=PREFIX)\n"
        "def f(t): ...\n"
        "g = env(compute_name())\n"
        "ACCOUNT = 'NEW_ACCOUNT_{i}__uri'\n"
        "h = env(ACCOUNT.format(i=n))\n"
        "k = env(f'NEW_ACCOUNT_{n}')\n"
        "when = now.strftime('%Y%m%dT%H%M%S%fZ')\n"
    )
    # When it is scanned
    scan = scan_source(source, "new.py", Scan())
    # Then every read is found, the dynamic one is reported, and strftime is not taken for a setting
    assert set(scan.reads) == {
        "NEW_PLAIN",
        "NEW_FLAG",
        "NEW_ENVIRON",
        "NEW_SUBSCRIPT",
        "NEW_CONN__clientId",
        "NEW_SCHEDULE",
    }
    assert set(scan.connections) == {"NEW_CONN"}
    # a numbered setting read through its declared pattern is the pattern; an f-string of a number is not
    assert set(scan.numbered) == {"NEW_ACCOUNT_{i}__uri"}
    assert len(scan.unresolved) == 2
    assert "compute_name" in scan.unresolved[0] and "NEW_ACCOUNT_{n}" in scan.unresolved[1]
    # and none of them is in the Bicep, so the main test would fail for such a module
    assert set(scan.reads) & bicep_settings() == set()
