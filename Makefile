# Every command a user needs. `make run` and `make test` do all the set-up on a fresh machine.
# Python 3.13: what Azure runs the app on (infra/, requirements.txt pins its runtime). Found by
# devtools/find-python.sh (PATH, pyenv, uv, asdf), or set PYTHON=/path/to/python3.13.
PYTHON ?= $(shell devtools/find-python.sh)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The Python half alone (the unit tier, lint and type checks need no npm package: no Azurite, no browser).
PYSTAMP := $(VENV)/.installed-python

.PHONY: install run demo screenshots test test-unit test-tiers lint typecheck pytest bench bench-smoke handoff-ratio bench-report reliability reliability-throttled infra-check infra-types azurite table-export table-restore reshard mutation clean

$(PYSTAMP): requirements.txt requirements-dev.txt client/pyproject.toml
	@test -n "$(PYTHON)" || { devtools/find-python.sh >/dev/null; exit 1; }
	@devtools/find-python.sh --check "$(PYTHON)"
	@test -x $(PY) && $(PY) -c "import sys; sys.exit(sys.version_info[:2] != (3, 13))" || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $(PYSTAMP)

$(STAMP): $(PYSTAMP) package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $(STAMP)

# Nothing here installs system packages: the console's browser tests use a Chromium that is already there
# (SETTLE_CHROMIUM, or /usr/bin/chromium and the other usual paths) and skip, saying why, when none is.
# CI installs Debian's chromium itself (.ci/run).

install: $(STAMP) ## Create .venv and install Python and npm dependencies (once).

run: $(STAMP) ## Run Settle locally on SETTLE_URL's port (default :7071) against its own Azurite (python -m devtools.run --help).
	$(PY) -m devtools.run

demo: $(STAMP) ## Realistic traffic through the resolver of a running `make run` (at SETTLE_URL), for the console.
	$(PY) -m devtools.demo $(DEMO_ARGS)

screenshots: $(STAMP) ## Retake the README's console screenshots from the real console (needs /usr/bin/chromium or SETTLE_CHROMIUM).
	$(PY) -m devtools.screenshots

test: $(STAMP) lint typecheck pytest ## Lint, type-check and run the whole test suite (starts Azurite itself).

# The unit tier on every core (pytest-xdist), its property tests at a quarter of their examples
# (tests/support/examples.py; make test draws them all). Its bytecode is kept in .venv/pycache even where
# PYTHONDONTWRITEBYTECODE is set (the source tree stays clean): compiling every module and rewriting every
# test's asserts again in each xdist process cost 8 of its 21 s.
UNIT_BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache
test-unit: $(PYSTAMP) ## The fast loop: every test that needs no storage and starts no other program (no Azurite, no npm).
	$(UNIT_BYTECODE) SETTLE_QUICK_PROPERTIES=1 $(PY) -m pytest -q -n auto -m "not storage and not heavy and not slow and not live" $(PYTEST_ARGS)

mutation: $(PYSTAMP) ## Break the cores' rules and the services' loops on purpose (mutmut) and count what the unit tier catches; not in CI (tens of minutes). MUTATION_ARGS="--jobs 1 'handoff.guard.*'" picks; docs/mutation.md has the last score.
	$(PY) -m devtools.mutation $(MUTATION_ARGS)

# A tier (-m) skips, without importing them, the test modules tests/support/tiers.json proves it would
# leave out; a module changed since is imported as before. Rewrite the index after changing tests.
test-tiers: $(PYSTAMP) ## Rewrite tests/support/tiers.json (each test module's marks), so make test-unit imports only what it runs.
	$(UNIT_BYTECODE) SETTLE_UPDATE_TIERS=1 $(PY) -m pytest -q --collect-only -p no:cacheprovider >/dev/null
	@git diff --stat -- tests/support/tiers.json

lint: $(PYSTAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(PYSTAMP)
	$(VENV)/bin/mypy .

pytest: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP) ## Side-by-side benchmark (own Azurite); writes bench/results.json.
	$(PY) -m bench $(BENCH_ARGS)

bench-smoke: $(STAMP) ## Tiny sizes (CI): fails only on an error, never on a missed target.
	$(PY) -m bench --smoke --out bench/results-smoke.json

handoff-ratio: $(STAMP) ## Full hand-offs/s on one partition under the throttle, this checkout against BEFORE (a commit): make handoff-ratio BEFORE=d71aadb [RATIO_ARGS="--runs 3 --seconds 60"]
	$(PY) -m bench.ratio --before $(BEFORE) $(RATIO_ARGS)

bench-report: $(STAMP) ## Render docs/benchmark.md and docs/reliability.md from the last full runs.
	$(PY) -m bench.report

reliability: $(STAMP) ## Faults, races, fuzzing: prints the violations table (must be 0), writes bench/reliability-<scale>.json.
	$(PY) -m pytest -m slow -p no:cacheprovider $(PYTEST_ARGS)

reliability-throttled: $(STAMP) ## The same suite with every storage request under bench/throttle.py's budget (Azure ÷ 100): prints what it refused; writes bench/reliability-<scale>-throttled.json.
	SETTLE_RELIABILITY_THROTTLE=$${SETTLE_RELIABILITY_THROTTLE:-1} $(PY) -m pytest -m slow -p no:cacheprovider $(PYTEST_ARGS)

infra-check: $(STAMP) ## Settle's infra checks (types, roles, rules; full report) + checkov in its own venv.
	bash infra/check.sh

infra-types: $(STAMP) ## The infra checks' full report: what was type-checked, what was skipped and why.
	$(PY) -m tests.infra.infracheck

azurite: $(STAMP) ## Start Azurite on the standard ports, data in .azurite/ (Ctrl-C stops it).
	$(PY) -m devtools.azurite --standard-ports --location .azurite

# The data account's recovery story (docs/adr/0014): ENDPOINT is the deployment's tableEndpoint output,
# the signed-in principal (az login) needs Storage Table Data Reader/Contributor on the data account.
table-export: $(STAMP) ## Export Settle's tables: make table-export DIR=backup ENDPOINT=https://<data account>.table.core.windows.net/ [PREFIX=settle]
	$(PY) -m devtools.backup export $(DIR) --prefix $(or $(PREFIX),settle) --endpoint $(ENDPOINT)

table-restore: $(STAMP) ## Restore an export into empty tables: make table-restore DIR=backup ENDPOINT=... [PREFIX=<new prefix>]
	$(PY) -m devtools.backup restore $(DIR) $(if $(PREFIX),--prefix $(PREFIX)) --endpoint $(ENDPOINT)

clean:
	rm -rf $(VENV) .venv-checkov node_modules .pytest_cache .mypy_cache .ruff_cache .azurite mutants

# Changing a shard layout is one explicit, audited step (docs/tables.md, "Changing the layout"): it is
# recorded in storage and every instance follows it; the app settings never change a recorded layout.
# Against Azure: ENDPOINT is the data account's tableEndpoint and the signed-in principal (az login) needs
# Storage Table Data Contributor on it; without ENDPOINT the environment's SETTLE_TABLES (Azurite locally).
reshard: $(STAMP) ## Change a recorded shard layout: make reshard S=16 [FAMILY=state|handoff] [ACCOUNTS=N] [REASON=...] [ENDPOINT=...] [PREFIX=settle]; S unset: show
	$(if $(ENDPOINT),SETTLE_TABLES__tableServiceUri=$(ENDPOINT) SETTLE_TABLES=,) $(if $(PREFIX),SETTLE_TABLE_PREFIX=$(PREFIX),) \
	$(PY) -m management.reshard --family $(or $(FAMILY),state) $(if $(S),--shards $(S),--show) \
	$(if $(ACCOUNTS),--accounts $(ACCOUNTS)) $(if $(REASON),--reason "$(REASON)")
