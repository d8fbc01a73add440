# Two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip's find-links warnings on this kind of machine are noise
PIP := $(PY) -m pip install -q --disable-pip-version-check
QUIET := 2>&1 | { grep -v '^WARNING: Location' || true; }

.PHONY: demo test test-fast test-hosts lint docs bench clean chromium

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "popflow needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) -e . $(QUIET)
	touch $@

# the dev extras, then HEBOSearch's HEBO without its stale pins (numpy<1.25): the hebo
# extra installs what HEBO needs
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) -e ".[dev]" $(QUIET)
	$(PIP) --no-deps "HEBO==0.3.6" $(QUIET)
	touch $@

## Run the PBT benchmark on the embedded default: local Prefect, a local Dask cluster, ./results
## (tests/test_console.py runs this target, with DEMO_STORAGE in a temporary folder)
DEMO_STORAGE ?= ./results
demo: $(VENV)/.installed
	@PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) examples/pbt_benchmark.py --storage $(DEMO_STORAGE) --name pbt_benchmark_$$(date +%Y%m%d-%H%M%S)

# The UI tests render the Prefect UI in headless Chromium (Debian's package; as root, installed)
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } || \
	  { echo "the tests need Chromium: apt-get install chromium" >&2; exit 1; }

## Lint, then the whole test suite (the tests start their own Prefect server, Dask cluster, S3 server)
test: $(VENV)/.installed-dev chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

## The unit tier alone (no processes, no sockets; tests/support/tiers.py), a tenth of each
## property test's examples (tests/support/examples.py): under a minute
test-fast: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -q -m unit --hypothesis-profile=fast

## The hosts tier alone: popflow on simulated machines (network namespaces; needs root)
test-hosts: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -q -m hosts

## The docs site into ./site (MkDocs Material; warnings are errors). `make test` builds it too.
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## Benchmarks against Ray Tune (installs ray[tune] into the venv)
bench: $(VENV)/.installed-dev
	$(PIP) -e ".[bench]" $(QUIET)
	$(PY) benchmarks/pbt_overhead.py

clean:
	rm -rf $(VENV) results site .pytest_cache .ruff_cache .hypothesis
