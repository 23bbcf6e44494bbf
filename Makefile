# ssd-serve: `make demo` runs the engine on the embedded default model, `make test` runs the tests.
# Both work on a fresh machine: they create .venv, install, and fetch the default model first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL  := smollm2-135m-instruct

.PHONY: install model demo test test-slow test-all lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

model: install
	$(BIN)/ssd models pull $(MODEL)

demo: model
	$(BIN)/ssd generate --chat --max-tokens 96 \
		--prompt "Explain in three sentences why the sky is blue."

lint: install
	$(BIN)/ruff check ssd bench tests
	$(BIN)/lint-imports

test: model lint
	$(BIN)/pytest

test-slow: model
	$(BIN)/pytest -m slow

test-all: model lint
	$(BIN)/pytest -m ''

bench: model
	$(BIN)/ssd bench --mode ar --dataset mtbench --numseqs 16 --output-len 128 --batch 1 --dtype bfloat16 --threads 2

clean:
	rm -rf $(VENV) build *.egg-info
