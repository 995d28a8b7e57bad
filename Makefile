# The two quick-start commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck unit venv clean

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

typecheck: $(STAMP)
	$(BIN)/mypy --strict sharing_plugin

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/sharing-plugin demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Every benchmark of bench/, each bounded (the whole run <= 5 min on 2 cores); rewrites the
# results table in bench/README.md.
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python bench/run_all.py
