#!/usr/bin/env bash
# A GPU campaign that outlives the device calls that watch it. On a host where one command
# may run only minutes but the machine stays up between commands, `start` launches the
# jobs in a detached worker (its own session: it survives the call) and every later
# `wait` watches it for up to WAIT_S seconds, then copies what it measured so far to $OUT.
# Every job resumes: a worker that dies (or a machine given back) loses nothing already
# written, and `start` with the same jobs on a fresh host repeats only what is missing.
#
#   bash docs/results/h100/campaign.sh start JOB...    from the repository root, after the vLLM bundle
#   bash docs/results/h100/campaign.sh wait            the same worker, WAIT_S more seconds
#
# Jobs:
#   calibrate          `attnbench calibrate` at 256 and 1024 streams x 1/2/4/8 client processes
#                      (1 stub process at 256 streams, 4 at 1024)
#   micro:NAME[+IMPL,...][@FLUSH]
#                      `attnbench microbench recipes/microbench/NAME.yaml` into NAME.csv; +IMPL,...: only
#                      those implementations (--impl), into NAME+IMPL,....csv; @read, @zero or @none: --l2-flush,
#                      into ...-FLUSH.csv; under `timeout ${MICRO_TIMEOUT_S:-900}` (rows are kept per case)
#   xcheck[:RUN]       docs/results/h100/cross-check.sh on RUN (default backends-custom; SUITE= picks
#                      another suite file) into cross-check/RUN/
#   overhead           docs/results/h100/client-overhead.sh: both clients against the stub (OUTPUT_LEN=256)
#   khost              `attnbench kernels overhead --json --profile`: host cost per kernel call
#   tune:SUITE         `attnbench tune recipes/microbench/SUITE.yaml` over recipes/microbench/tune-space.yaml:
#                      the sweep into tune/SUITE.csv, the fitted tree into tune/tuned_SUITE.py (to review,
#                      then copy to kernels/dispatch/tuned_<device>.py), under `timeout ${TUNE_TIMEOUT_S:-900}`
#   tree:SUITE         later jobs time the tree that tune:SUITE fitted: it replaces this device's
#                      tuned_<device>.py in the installed package (/tmp/attnbench), not in the checkout
#   ncu:SUITE/CASE/IMPL[,IMPL...]
#                      Nsight Compute's full set on one launch of each IMPL on CASE of
#                      recipes/microbench/SUITE.yaml (`attnbench kernels run`, checked first), into
#                      ncu/CASE-IMPL.ncu-rep, its details page ncu/CASE-IMPL.txt and its SASS source
#                      page with sampled stalls ncu/CASE-IMPL-sass.csv, each under
#                      `timeout ${NCU_TIMEOUT_S:-300}` (packed into ncu.tgz: ~1 MB per profile)
#   gputest:FILE[@K]   `python3 -m pytest -q -x tests/FILE [-k K]` (GPU kernel tests, log kept) under
#                      `timeout ${GPUTEST_TIMEOUT_S:-300}`: a kernel that hangs costs minutes, not the lease
#   run:RUN[,RUN...]   `attnbench run recipes/h100.yaml --only RUN ... --resume`
#   runs:PREFIX        the same for every run of recipes/h100.yaml whose name starts with PREFIX
#   seed:PREFIX        copy the committed runs (docs/results/h100/h100/PREFIX*) whose recipe is
#                      unchanged into the campaign's tree, so that later run(s) jobs measure only
#                      what is missing (a fresh host starts with an empty tree)
# Results under $CAMPAIGN (default /tmp/campaign): results/ (the suite tree), micro/,
# calibrate.jsonl, cross-check/, client-overhead/, gputest-*.log, worker.log; every `start` and `wait`
# packs them into $OUT/*.tgz (over 15 MB: X.tgz.part-aa, -ab, ...), so that each call brings back
# everything measured so far: a machine given back between two calls loses nothing already packed.
set -u
CAMPAIGN=${CAMPAIGN:-/tmp/campaign}
mkdir -p "$CAMPAIGN"
cmd=${1:?start JOB... | wait}; shift

pack() {  # what the worker has so far, in pieces small enough for the trip back
  [ -n "${OUT:-}" ] || return 0
  cp "$CAMPAIGN/worker.log" "$OUT/" 2>/dev/null
  [ -d "$CAMPAIGN/results" ] && tar czf "$OUT/runs.tgz" -C "$CAMPAIGN" results
  [ -d "$CAMPAIGN/micro" ] && tar czf "$OUT/micro.tgz" -C "$CAMPAIGN" micro
  [ -d "$CAMPAIGN/ncu" ] && tar czf "$OUT/ncu.tgz" -C "$CAMPAIGN" ncu
  [ -d "$CAMPAIGN/tune" ] && tar czf "$OUT/tune.tgz" -C "$CAMPAIGN" tune
  [ -f "$CAMPAIGN/calibrate.jsonl" ] && cp "$CAMPAIGN/calibrate.jsonl" "$OUT/"
  cp "$CAMPAIGN"/kernels-overhead* "$CAMPAIGN"/gputest-*.log "$OUT/" 2>/dev/null
  [ -d "$CAMPAIGN/cross-check" ] && tar czf "$OUT/cross-check.tgz" -C "$CAMPAIGN" cross-check
  [ -d "$CAMPAIGN/client-overhead" ] && tar czf "$OUT/client-overhead.tgz" -C "$CAMPAIGN" \
    --exclude='*.jsonl' --exclude='vllm-bench/r*.json' client-overhead
  local f
  for f in "$OUT"/*.tgz; do  # files over 16 MiB do not come back: pieces (cat X.tgz.part-* | tar xzf -)
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && split -b 15000000 "$f" "$f.part-" && rm "$f"
  done
  ls -la "$OUT"
}

watch() {  # until the worker is gone or WAIT_S passes
  local deadline=$(( $(date +%s) + ${WAIT_S:-540} ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if ! kill -0 "$(cat "$CAMPAIGN/worker.pid" 2>/dev/null)" 2>/dev/null; then
      echo "worker finished"; break
    fi
    sleep 5
  done
  tail -25 "$CAMPAIGN/worker.log"
  pack
}

job() {
  local spec=$1 name=${1%%:*} arg=
  [ "$spec" != "$name" ] && arg=${spec#*:}
  echo "=== $(date -u +%FT%TZ) $spec"
  case $name in
    calibrate)
      for streams in 256 1024; do
        stubs=$(( streams > 256 ? 4 : 1 ))  # one stub process writes ~50-60k chunks/s; 1,024 streams ask ~51k
        for procs in 1 2 4 8; do
          grep -q "\"concurrency\": $streams, .*\"client_processes\": $procs, \"stub_processes\": $stubs}" "$CAMPAIGN/calibrate.jsonl" 2>/dev/null && continue
          attnbench calibrate --concurrency $streams --requests $((4 * streams)) --client-processes $procs \
            --stub-processes $stubs --json \
            | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))" >> "$CAMPAIGN/calibrate.jsonl"
        done
      done ;;
    micro)
      mkdir -p "$CAMPAIGN/micro"
      local what=${arg%@*} flush= csv suite impls= flags=()
      [ "$what" != "$arg" ] && flush=${arg#*@}
      suite=${what%%+*}
      [ "$suite" != "$what" ] && impls=${what#*+}
      for i in ${impls//,/ }; do flags+=(--impl "$i"); done
      [ -n "$flush" ] && flags+=(--l2-flush "$flush")
      csv=$what${flush:+-$flush}
      [ -s "$CAMPAIGN/micro/$csv.csv" ] || timeout "${MICRO_TIMEOUT_S:-900}" attnbench microbench \
        "recipes/microbench/$suite.yaml" "${flags[@]}" --out "$CAMPAIGN/micro/$csv.csv" ;;
    xcheck)
      XCHECK_DIR="$CAMPAIGN/cross-check/${arg:-backends-custom}" bash docs/results/h100/cross-check.sh ${arg:-backends-custom} ;;
    overhead)
      OVERHEAD_DIR="$CAMPAIGN/client-overhead" OUTPUT_LEN=${OUTPUT_LEN:-256} bash docs/results/h100/client-overhead.sh ;;
    khost)
      [ -s "$CAMPAIGN/kernels-overhead.jsonl" ] || attnbench kernels overhead --json --profile \
        > "$CAMPAIGN/kernels-overhead.jsonl" 2> "$CAMPAIGN/kernels-overhead-profile.txt" ;;
    tune)
      mkdir -p "$CAMPAIGN/tune"
      [ -s "$CAMPAIGN/tune/tuned_$arg.py" ] || timeout "${TUNE_TIMEOUT_S:-900}" attnbench tune \
        "recipes/microbench/$arg.yaml" --space recipes/microbench/tune-space.yaml --rows "$CAMPAIGN/tune/$arg.csv" \
        --max-depth 5 --emit "$CAMPAIGN/tune/tuned_$arg.py" ;;
    tree)
      python3 - "$CAMPAIGN/tune/tuned_$arg.py" <<'PY'
import shutil, sys
import torch
from attnbench.kernels.dispatch.heuristics import tuned_tree_path
dest = tuned_tree_path(torch.cuda.get_device_name())
shutil.copyfile(sys.argv[1], dest)
print(f"tree: {sys.argv[1]} -> {dest}")
PY
      ;;
    ncu)
      mkdir -p "$CAMPAIGN/ncu"
      local suite=${arg%%/*} rest=${arg#*/} case impl impls ncu
      case=${rest%%/*}
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      impls=${rest#*/}
      for impl in ${impls//,/ }; do
        [ -s "$CAMPAIGN/ncu/$case-$impl.txt" ] && continue
        timeout "${NCU_TIMEOUT_S:-300}" "$ncu" --nvtx --nvtx-include "attnbench/" --set full --clock-control none \
          --target-processes all -f -o "$CAMPAIGN/ncu/$case-$impl" \
          attnbench kernels run "recipes/microbench/$suite.yaml" --case "$case" --impl "$impl" --repeat 1 \
          > "$CAMPAIGN/ncu/$case-$impl.log" 2>&1
        "$ncu" -i "$CAMPAIGN/ncu/$case-$impl.ncu-rep" --page details > "$CAMPAIGN/ncu/$case-$impl.txt" 2>&1
        # per SASS instruction: executions and sampled warp stalls by reason (where warps wait)
        "$ncu" -i "$CAMPAIGN/ncu/$case-$impl.ncu-rep" --page source --print-source sass --csv \
          > "$CAMPAIGN/ncu/$case-$impl-sass.csv" 2>&1
        tail -3 "$CAMPAIGN/ncu/$case-$impl.log"
      done ;;
    gputest)
      local file=${arg%@*} select= log
      [ "$file" != "$arg" ] && select=${arg#*@}
      log="$CAMPAIGN/gputest-${file%.py}${select:+-${select//[^A-Za-z0-9_]/_}}.log"
      timeout "${GPUTEST_TIMEOUT_S:-300}" python3 -m pytest -q -x -p no:cacheprovider "tests/$file" \
        ${select:+-k "$select"} > "$log" 2>&1
      echo "exit $?" >> "$log"
      tail -5 "$log" ;;
    run|runs)
      local only=() names=${arg//,/ }
      if [ "$name" = runs ]; then
        names=$(python3 -c "import sys; from attnbench.runner.recipe import load_suite
print(' '.join(r.name for r in load_suite('recipes/h100.yaml').runs if r.name.startswith(sys.argv[1])))" "$arg")
      fi
      for r in $names; do only+=(--only "$r"); done
      attnbench run recipes/h100.yaml --models dummy --models-dir /tmp/models --out "$CAMPAIGN/results" \
        --resume "${only[@]}" 2>&1 | grep -v "it/s]\|req/s]" ;;
    seed)
      python3 - "$arg" "$CAMPAIGN/results/h100" <<'PY'
import shutil, sys
from pathlib import Path
from attnbench.runner.recipe import Recipe, load_suite
from attnbench.validation import validate_yaml
prefix, dest = sys.argv[1], Path(sys.argv[2])
current = {r.name: r for r in load_suite("recipes/h100.yaml").with_dummy_models("/tmp/models").runs}
for run_dir in sorted(Path("docs/results/h100/h100").glob(f"{prefix}*")):
    recipe = current.get(run_dir.name)
    if recipe is None or validate_yaml(Recipe, run_dir / "recipe.yaml", "recipe").digest() != recipe.digest():
        print(f"seed: {run_dir.name} left out (not in the suite now, or its recipe changed)")
    elif not (dest / run_dir.name).exists():
        shutil.copytree(run_dir, dest / run_dir.name)
        print(f"seed: {run_dir.name}")
PY
      ;;
    *) echo "unknown job $spec" ;;
  esac
}

case $cmd in
  start)
    if kill -0 "$(cat "$CAMPAIGN/worker.pid" 2>/dev/null)" 2>/dev/null; then
      echo "a worker is already running"; watch; exit 0
    fi
    . docs/perf/gpu-setup.sh
    # the worker: its own session, so it outlives this call; PYTHONUNBUFFERED for a live log
    PYTHONUNBUFFERED=1 setsid bash "$0" worker "$@" >> "$CAMPAIGN/worker.log" 2>&1 < /dev/null &
    echo $! > "$CAMPAIGN/worker.pid"
    sleep 2
    watch ;;
  wait) watch ;;
  worker)
    . docs/perf/gpu-setup.sh
    for spec in "$@"; do job "$spec"; done
    echo "=== $(date -u +%FT%TZ) all jobs done" ;;
  *) echo "usage: campaign.sh start JOB... | wait" >&2; exit 2 ;;
esac
