#!/usr/bin/env bash
# What produced docs/results/h100/: `attnbench run` of recipes/h100.yaml on an H100 with the
# offline vLLM 0.26.0 bundle (../shared/offline-vllm), dummy weights, natively (the process
# launcher, as inside the CUDA image). From the repository root on the GPU host:
#   [LIMIT_S=540] bash docs/results/h100/run-suite.sh RUN...   (run names of recipes/h100.yaml; resumable)
# LIMIT_S: Ctrl-C attnbench after that many seconds (it stops the server and keeps what it
# measured; run again to resume), for hosts that cap a command's time. REPEATS: override
# every run's repeat count.
# The results tree is packed into $OUT/results.tgz for the trip back.
set -u
. docs/perf/gpu-setup.sh
res=/tmp/attnbench-results
only=()
for run in "$@"; do only+=(--only "$run"); done
[ -n "${REPEATS:-}" ] && only+=(--repeats "$REPEATS")
PYTHONUNBUFFERED=1 timeout -s INT "${LIMIT_S:-0}" attnbench run recipes/h100.yaml --models dummy --models-dir /tmp/models \
  --out "$res" --resume "${only[@]}" 2>&1 | grep -v "it/s]\|req/s]"
tar czf "${OUT:-/tmp}/results.tgz" -C "$res" .
