# Source on a GPU host that has torch + triton but no network (the device machines of
# docs/perf/): installs attnbench and its pure-Python needs into /tmp, sets PATH/PYTHONPATH.
#   . docs/perf/gpu-setup.sh        (from the repository root)
# Wheels in .whl/ (pydantic and friends, CPython 3.12) travel with the call; with the
# offline vLLM bundle installed (/tmp/site), vLLM's copies are used instead.
set -u
if [ -d /tmp/site ]; then source /tmp/site/env.sh; fi
if ! python3 -c "import pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/whl .whl/*.whl
  export PYTHONPATH=/tmp/whl${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/attnbench . >/dev/null 2>&1 \
  || python3 -m pip install --no-index --no-deps --no-build-isolation --target /tmp/attnbench .
export PYTHONPATH=/tmp/attnbench${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/attnbench/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
