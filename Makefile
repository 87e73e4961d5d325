# Two entry points for a newcomer: `make demo` and `make test`. Both set themselves up.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# SkyPilot pins click<8.2 (the project needs newer): it lives in its own venv, used by the
# tests that check the emitted SkyPilot YAML with SkyPilot itself.
SKY_VENV ?= .venv-sky
SKY_PY := $(abspath $(SKY_VENV))/bin/python
SKY_STAMP := $(SKY_VENV)/.installed-stamp
export MLFLOW_TRACKING_URI ?= sqlite:///mlflow.db
export OMP_NUM_THREADS ?= 2
# Test processes (pytest-xdist): most tests wait on subprocesses, servers and sockets, so two
# workers on two cores halve the suite's wall time; PYTEST_WORKERS=0 runs it in one process.
# Each worker's torch takes one thread (tests/conftest.py's default), not the demo's two.
PYTEST_WORKERS ?= 2

.PHONY: demo test setup browser clean bench skypilot faults

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of PyTorch from local disk; must come first so nothing pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	# the integrations' libraries, tested in tests/integrations/test_integrations.py
	$(BIN)/pip install --quiet -c constraints.txt -e '.[hf,lightning]'
	touch $(STAMP)

setup: $(STAMP)

$(SKY_STAMP):
	test -x $(SKY_PY) || $(PY) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install --quiet skypilot==0.14.1
	touch $(SKY_STAMP)

skypilot: $(SKY_STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: install Debian's chromium (browser tests will be skipped)"; fi; }

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP) browser skypilot
	$(BIN)/ruff check mlflow_gpuopt tests examples benchmarks
	OMP_NUM_THREADS=1 GPUOPT_SKYPILOT_PYTHON=$(SKY_PY) $(BIN)/python -m pytest -q \
	  -n $(PYTEST_WORKERS)

# The fault-injection suite (real mlflow servers, full disks, corrupt journals, bad input),
# then its figures: values delivered/lost/duplicated per outage, bad inputs, secrets found.
faults: $(STAMP)
	$(BIN)/python -m pytest -q -m faults
	$(BIN)/python benchmarks/bench_faults.py

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_accuracy.py
	$(BIN)/python benchmarks/bench_recommend.py

clean:
	rm -rf $(VENV) $(SKY_VENV) mlruns mlartifacts mlflow.db
