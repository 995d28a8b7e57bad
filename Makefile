# The two quick-start commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit unit-fast venv clean api

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]' >$(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache >$(VENV)/lint-imports.log || { cat $(VENV)/lint-imports.log; exit 1; }

# bench/ too, with the test modules it imports on its path (followed, not checked): a bench
# script that calls the product with old names fails here, not in the next `make bench`.
typecheck: $(STAMP)
	$(BIN)/mypy --strict sharing_plugin tests/support scripts
	MYPYPATH=tests:tests/integration $(BIN)/mypy --follow-imports=silent bench

unit: $(STAMP)
	# Three workers on CI's 2 cores: a third of the suite's time is spent waiting (timers,
	# child processes, the real kubelet and DRA binaries), and a third worker fills it: ~47 s
	# instead of ~54 s here. The tests bounded in time ("within a second") passed with two
	# CPU-bound processes running beside the suite (85 s). Bytecode is written even where
	# PYTHONDONTWRITEBYTECODE is set (CI, the image): each worker collects every test module, and
	# ~100 child processes import the package; compiling all of it again each time cost about a
	# fifth of the suite's CPU time.
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n 3

# The fast lane while editing (<= 15 s on 2 cores): tests/unit less the tests that start a
# process or search exhaustively (CONTRIBUTING.md, "Markers"); 14-18 s of CPU in all, so two
# workers, each collecting the folder once.
unit-fast: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n 2 -m "not subprocess and not exhaustive" tests/unit

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/sharing-plugin demo

# Rewrites the generated gRPC code of both API trees (kubelet/api, dra/api) from their .proto
# files; commit the result (a test compares it byte for byte).
api: $(STAMP)
	$(BIN)/python scripts/generate_api.py

clean:
	rm -rf $(VENV) build/venv-min .pytest_cache .mypy_cache .ruff_cache

# Every benchmark of bench/, each bounded (the whole run <= 7 min on 2 cores); rewrites the
# results table in bench/README.md.
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# The declared lower bounds, proved: a second virtualenv with exactly the oldest versions
# pyproject.toml allows (constraints/minimum.txt) runs the fast tests plus those of the code each
# floor is about (inotify watches, health events, metrics, the Kubernetes API). CI runs it after
# `make test`. TEST_EXPECT_PINS makes the suite check that the versions it runs with are
# those pins.
MIN_VENV := build/venv-min
MIN_TESTS := tests/unit tests/e2e tests/integration/test_fswatch.py \
	tests/integration/test_daemon_health.py tests/integration/test_metrics_http.py \
	tests/integration/test_kube_sources.py tests/integration/test_daemon_kube.py

.PHONY: test-min
test-min:
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MIN_VENV)/bin/python -m pip install -c constraints/minimum.txt -e '.[test]' \
		>$(MIN_VENV)/install.log 2>&1 || { cat $(MIN_VENV)/install.log; exit 1; }
	TEST_EXPECT_PINS=constraints/minimum.txt $(MIN_VENV)/bin/pytest $(MIN_TESTS)

# Rewrites constraints/docker.txt (the image's exact versions) from pyproject.toml's current
# bounds; commit the result.
.PHONY: lock
lock: $(STAMP)
	$(BIN)/python constraints/lock.py
