#!/usr/bin/env bash
# Static checks of infra/ (no Bicep compiler exists on this machine):
# 1. Settle's own checks (tests/infra/infracheck.py: syntax, names, types against Azure's resource types,
#    role IDs, deployment rules), with the full report including what they skipped; `make test` runs them
#    too, through pytest;
# 2. security checks with checkov.
#
# checkov pins pycep-parser==0.5.1, so it lives in its own virtualenv (.venv-checkov/, or $CHECKOV_VENV)
# that this script creates on first use. checkov runs offline (--skip-download) with Settle's own checks
# from infra/checkov-checks/ (checkov has no Bicep check for Service Bus, shared-key access, App Insights
# or Log Analytics local auth, or basic-auth publishing) and writes JSON;
# infra/checkov_gate.py then fails on parsing errors, on failed checks not accepted in
# infra/checkov-skips.txt (each with its reason), and on accepted entries that no longer fail.
set -euo pipefail
cd "$(dirname "$0")/.."

"${PROJECT_PYTHON:-.venv/bin/python}" -m tests.infra.infracheck

venv=${CHECKOV_VENV:-.venv-checkov}
checkov_version=3.3.30
if [ ! -x "$venv/bin/checkov" ] || ! "$venv/bin/checkov" --version 2>/dev/null | grep -qx "$checkov_version"; then
  "${PYTHON:-$(devtools/find-python.sh)}" -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$checkov_version"
fi

report=$(mktemp)
trap 'rm -f "$report"' EXIT
# Exit status ignored on purpose: checkov exits 1 on any failed check (accepted ones included) and 0 on a
# syntax error; the gate below reads the report instead.
"$venv/bin/checkov" --directory infra --framework bicep --skip-download \
  --external-checks-dir infra/checkov-checks --output json >"$report" 2>/dev/null || true
"$venv/bin/python" infra/checkov_gate.py "$report" infra/checkov-skips.txt
