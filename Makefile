# ssd-serve: `make demo` runs the services (gateway, target, draft) on the embedded default model and
# queries them with the openai client; `make demo-engine` runs the engine alone; `make test` runs the tests.
# Both work on a fresh machine: they create .venv, install, and fetch the default model first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL  := smollm2-135m-instruct

.PHONY: install protos model demo demo-engine serve test test-slow test-all lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

STUBS  := protos/ssd/v1/_proto_hash.py

# gRPC stubs are generated, never committed (git-ignored); a test fails if they are stale.
$(STUBS): $(wildcard protos/ssd/v1/*.proto) protos/build.py $(STAMP)
	$(BIN)/python protos/build.py

protos: $(STUBS)

install: $(STAMP) $(STUBS)

model: install
	$(BIN)/ssd models pull $(MODEL)

# DRAFT: the demo's draft: the shipped EAGLE-3 head (drafts/smollm2-135m-eagle3; runs ar, sd and ssd), or
# `make demo DRAFT=ngram` (n-gram lookup: ar and sd only)
DRAFT  ?= smollm2-135m-eagle3

demo: model
	$(BIN)/python -m deploy.demo --draft $(DRAFT)

demo-engine: model
	$(BIN)/ssd generate --chat --max-tokens 96 \
		--prompt "Explain in three sentences why the sky is blue."

serve: model
	$(BIN)/ssd serve

lint: install
	$(BIN)/ruff check ssd_kernels ssd bench tests protos rpc tensor_transport target_service draft_service gateway deploy loadtest draft_training cli
	$(BIN)/lint-imports

# The unit tests run on TEST_WORKERS processes (pytest-xdist, a test file per worker at a time); then the
# integration tests (real services on localhost: load-sensitive waits, machine-wide /dev/shm checks) alone.
# `make test TEST_WORKERS=0` runs the first part in one process too.
TEST_WORKERS ?= 2

test: model lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --ignore=tests/integration
	$(BIN)/pytest tests/integration

test-slow: model
	$(BIN)/pytest -m slow

test-all: model lint
	$(BIN)/pytest -m ''

bench: model
	$(BIN)/ssd bench --mode ar --dataset mtbench --numseqs 16 --output-len 128 --batch 1 --dtype bfloat16 --threads 2

clean:
	rm -rf $(VENV) build *.egg-info
