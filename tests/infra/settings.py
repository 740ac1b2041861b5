"""App settings: every setting the deployed code reads is set on the function app (or deliberately not).

The code is scanned (tests/infra/codescan.py) file by file, for every Python file of the code package
(infra/package.py: what .funcignore keeps, so management/ and console/ as much as common/, state/ and
handoff/); the settings are the function app's ``siteConfig.appSettings`` in the checked tree. A setting
the code reads that is neither set nor listed below with its reason is an error, and so is a binding
connection without its identity settings.
"""

from __future__ import annotations

from tests.infra.codescan import scan_code
from tests.infra.report import Finding, Report
from tests.infra.units import Unit
from tests.infra.wiring import SITE, app_settings, numbered_app_settings

# Settings the code reads that are deliberately NOT set in Azure, each with the reason.
LOCAL_ONLY = {
    "SETTLE_TABLES": "connection-string form for Azurite/local runs; Azure uses "
    "SETTLE_TABLES__tableServiceUri + __clientId, and the data account has shared-key access disabled",
    "ServiceBusConnection": "connection-string form for the emulator/local runs; Azure uses "
    "ServiceBusConnection__fullyQualifiedNamespace + __credential + __clientId, and SAS is disabled",
}
# Telemetry switches the code reads that Azure leaves unset on purpose: Application Insights (set) is the
# destination there; these add or redirect exporters, or switch telemetry off (common/telemetry.py).
TELEMETRY_OPTIONS = {
    "SETTLE_TELEMETRY": "off switch; unset means on wherever a destination is configured",
    "OTEL_SDK_DISABLED": "the standard off switch",
    "OTEL_TRACES_EXPORTER": "console/otlp exporters in addition to Application Insights",
    "OTEL_METRICS_EXPORTER": "console/otlp exporters in addition to Application Insights",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "an OTLP collector, if one is used",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "an OTLP collector for traces only",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "an OTLP collector for metrics only",
    "OTEL_SERVICE_NAME": "the distro names the service after the function app",
}
# Set by App Service itself on every instance (not an app setting): the management API fails closed
# (requires a signed-in principal) where it is present (common/principal.py, ADR-0013).
PLATFORM_SET = {"WEBSITE_INSTANCE_ID"}
# Settings whose default is right for Azure, read only to seed a value that storage then records.
SEEDS = {
    "SETTLE_LAYOUT_REFRESH_SECONDS": "seeds the refresh interval recorded with a first deployment's layout "
    "(common/layouts.py); the default, 30 s, is Azure's, and the recorded value is the one in force",
}
# Settings whose default is the one for Azure; tests set them to keep a test short.
DEFAULTS_FOR_AZURE = {
    "SETTLE_HTTP_DEADLINE_SECONDS": "the HTTP deadline (common/invocation.py); its default, 20 s, is "
    "Azure's: well inside the 230 s the front end waits; the tests shorten it",
}
NOT_SET = {
    **LOCAL_ONLY,
    **DEFAULTS_FOR_AZURE,
    **TELEMETRY_OPTIONS,
    **SEEDS,
    **dict.fromkeys(PLATFORM_SET, "set by the platform"),
}
# Numbered settings (tests/infra/codescan.py: a pattern with ``{i}``, one per extra state account) that the
# Bicep deliberately does NOT set for i = 1..N-1, each with the reason.
NUMBERED_NOT_SET = {
    "SETTLE_TABLES_{i}": "connection-string form of state account i for Azurite/local runs; Azure uses "
    "SETTLE_TABLES_{i}__tableServiceUri, and shared-key access is disabled on every account",
    "SETTLE_TABLES_{i}__clientId": "every state account is reached with the one identity: the code "
    "falls back to SETTLE_TABLES__clientId (set), which holds Table Data Contributor on each account",
}


def check_settings(units: dict[str, Unit]) -> Report:
    report = Report()
    scan = scan_code()
    for problem in scan.unresolved:
        report.errors.append(
            Finding(
                problem.split(" ", 1)[0], 0, "", "", f"a setting read whose name is not static: {problem}"
            )
        )
    sites = [
        (unit, res)
        for unit in units.values()
        for res in unit.file.resources
        if res.type.lower() == SITE and not res.existing
    ]
    if not sites:
        report.errors.append(
            Finding("", 0, "", "", "no function app (Microsoft.Web/sites) to check settings on")
        )
    for unit, site in sites:
        settings = set(app_settings(site, unit))
        for name, files in sorted(scan.reads.items()):
            if name not in settings and name not in NOT_SET:
                report.errors.append(
                    Finding(
                        unit.rel,
                        site.line,
                        site.symbol,
                        "appSettings",
                        f"{name}: read by {', '.join(sorted(files))}, not set (set it, or list it in "
                        "tests/infra/settings.py with the reason it is not)",
                    )
                )
        numbered = numbered_app_settings(site, unit.file)
        for pattern, files in sorted(scan.numbered.items()):
            if pattern not in numbered and pattern not in NUMBERED_NOT_SET:
                report.errors.append(
                    Finding(
                        unit.rel,
                        site.line,
                        site.symbol,
                        "appSettings",
                        f"{pattern}: a numbered setting read by {', '.join(sorted(files))}, not set for "
                        "i = 1..N-1 (set it in the numbered settings, or list it in tests/infra/settings.py "
                        "with the reason it is not)",
                    )
                )
        for pattern in sorted(set(numbered) & set(NUMBERED_NOT_SET)):
            report.errors.append(
                Finding(
                    unit.rel, site.line, site.symbol, "appSettings", f"{pattern}: {NUMBERED_NOT_SET[pattern]}"
                )
            )
        for prefix in sorted(scan.connections):
            for suffix in ("__fullyQualifiedNamespace", "__credential", "__clientId"):
                if f"{prefix}{suffix}" not in settings:
                    report.errors.append(
                        Finding(
                            unit.rel,
                            site.line,
                            site.symbol,
                            "appSettings",
                            f"{prefix}{suffix}: the binding connection {prefix} needs it (identity-based)",
                        )
                    )
        for name in sorted(settings & set(LOCAL_ONLY)):
            report.errors.append(
                Finding(unit.rel, site.line, site.symbol, "appSettings", f"{name}: {LOCAL_ONLY[name]}")
            )
    return report
