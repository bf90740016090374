# Source on a GPU host that has torch + triton but no network (the device machines of
# docs/perf/): installs attnbench and its pure-Python needs into /tmp, sets PATH/PYTHONPATH.
#   . docs/campaign/gpu-setup.sh        (from the repository root; a second source in the same shell is a
#                                    no-op; each new shell reinstalls, so edits made between calls count)
# Wheels in .whl/ (`make gpu-host-wheels`: orjson; pydantic and friends for hosts without
# the vLLM bundle; pytest-xdist; CPython 3.12) travel with the call and go after the offline
# vLLM bundle (/tmp/site) on the path, so vLLM's own copies win where both exist.
set -u
if [ -z "${ATTNBENCH_GPU_SETUP:-}" ]; then
  if [ -f /tmp/site/env.sh ]; then source /tmp/site/env.sh; fi
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/whl .whl/*.whl
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/attnbench . >/dev/null 2>&1 \
    || python3 -m pip install --no-index --no-deps --no-build-isolation --upgrade --target /tmp/attnbench .
  export PYTHONPATH=/tmp/attnbench${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/attnbench/bin:$PATH
  export ATTNBENCH_GPU_SETUP=1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
fi
