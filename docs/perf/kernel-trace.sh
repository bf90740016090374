#!/usr/bin/env bash
# Clock trace of qblock_ws on an sm_90 GPU (docs/perf/kernel_trace.py): installs attnbench
# into /tmp (gpu-setup.sh), patches its kernel with h100/clock-trace.patch, traces each case
# of llama3-8b-hopper.yaml named, and prints the phases of an item and the programs' balance.
#   bash docs/perf/kernel-trace.sh prefill-b4-2k mixed-2k     (writes $OUT, default /tmp/trace)
. docs/perf/gpu-setup.sh
set -eu
out=${OUT:-/tmp/trace}; mkdir -p "$out"
patch -s -p1 -d /tmp/attnbench/attnbench < docs/perf/h100/clock-trace.patch
python3 docs/perf/kernel_trace.py run "$out" "$@"
for c in "$@"; do python3 docs/perf/kernel_trace.py show "$out/trace-$c.npy"; done
