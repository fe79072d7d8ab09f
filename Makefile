# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SOURCES := $(wildcard aioinfer tests benchmarks scripts examples)

.PHONY: demo test lint bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/aioinfer run --iterations 20

lint: $(BIN)/.installed
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

bench: $(BIN)/.installed
	$(BIN)/python -m benchmarks.async_runtime

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
