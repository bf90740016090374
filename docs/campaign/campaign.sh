#!/usr/bin/env bash
# How the GPU numbers under docs/ were measured: a campaign that outlives the device calls
# that watch it. On a host where one command may run only minutes but the machine stays up
# between commands, `start` launches the jobs in a detached worker (its own session: it
# survives the call) and every later `wait` watches it for up to WAIT_S seconds, then packs
# what it measured so far into $OUT. Every job is an attnbench command that resumes: a
# worker that dies (or a machine given back) loses nothing already written, and `start` with
# the same jobs on a fresh host repeats only what is missing.
#
#   bash docs/campaign/campaign.sh start JOB...    from the repository root, after the vLLM bundle
#   bash docs/campaign/campaign.sh wait            the same worker, WAIT_S more seconds
#   bash docs/campaign/campaign.sh seed FILES_AT   here, between two leases: the runs and microbenchmark
#                                                  CSVs a lease packed (FILES_AT/results.tgz, micro.tgz or
#                                                  their .part-* pieces) into .carry/results and .carry/micro,
#                                                  server logs and locks left out (a call carries at most
#                                                  64 MiB); name .carry in the carry of the next lease's
#                                                  `start` call, which copies them into $CAMPAIGN, so that
#                                                  `attnbench run --resume` and `attnbench microbench --resume`
#                                                  measure only what the last lease did not finish
#   LANES=4 bash docs/campaign/campaign.sh start JOB...
#                                                  one worker per GPU of the host (lane i sees GPU i
#                                                  alone), each over the same jobs: a run another lane
#                                                  measures is skipped by its lock (attnbench run's), any
#                                                  other job by a claim held while it runs, so the lanes
#                                                  share the work and a dead lane's job is free again
#   AFTER=DIR bash docs/campaign/campaign.sh start JOB...
#                                                  the workers start their jobs once every worker of the
#                                                  campaign in DIR has ended: a timing campaign queued behind
#                                                  one (tests, say) started in an earlier call, so that the
#                                                  two never share the GPU
#
# Jobs:
#   run:NAME[,NAME...]   `attnbench run ${SUITE:-recipes/h100.yaml} --only NAME ... --resume` (names or
#                        patterns: run:'fig9-steps-*')
#   micro:NAME[/GROUP][+IMPL,...][@FLUSH]
#                        `attnbench microbench recipes/microbench/NAME.yaml` into
#                        micro/NAME[-GROUP][+IMPL,...][-FLUSH].csv; /GROUP: only that group's (or case's)
#                        cases; +IMPL,...: only those implementations; @read, @zero or @none: --l2-flush;
#                        after tree:off the CSV's name ends in -untuned; --resume: a CSV a lease left
#                        half-written (or a seeded one) gets only the rows it lacks
#   tune:SUITE           `attnbench tune recipes/microbench/SUITE.yaml` over recipes/microbench/tune-space.yaml:
#                        the sweep into tune/SUITE.csv, the fitted tree into tune/tuned_SUITE.py
#   tree:SUITE           later jobs run the tree tune:SUITE fitted (ATTNBENCH_TUNED_TREE), not the shipped one;
#                        tree:off runs the hand-written tree (what a GPU without a fitted tree gets);
#                        tree:shipped goes back to the tree the package ships
#   xcheck[:RUN]         `attnbench crosscheck run ${SUITE:-recipes/cross-check-h100.yaml} --only RUN` into
#                        cross-check/RUN/ (XCHECK_ARGS: more options, e.g. "--side-by-side --load poisson")
#   calibrate            `attnbench calibrate` at 256 and 1024 streams x 1/2/4/8 client processes
#   khost                `attnbench kernels overhead --json --profile`: host cost per kernel call
#   gputest:FILE[@K]     `python3 -m pytest tests/FILE [-k K]` (the GPU kernel tests), log kept; GPUTEST_WORKERS=N
#                        runs them in N pytest-xdist processes (compiling is most of their time)
#   ncu:SUITE/CASE/IMPL[,IMPL...]
#                        Nsight Compute's full set on one launch of each IMPL (`attnbench kernels run`):
#                        the details page, and the source counters per SASS instruction (warp samples,
#                        executions) as CSV
# Timeouts: MICRO_TIMEOUT_S (1800), TUNE_TIMEOUT_S (900), GPUTEST_TIMEOUT_S, NCU_TIMEOUT_S (300).
set -u
CAMPAIGN=${CAMPAIGN:-/tmp/campaign}
MODELS_DIR=${MODELS_DIR:-/tmp/models}
mkdir -p "$CAMPAIGN"
cmd=${1:?start JOB... | wait | seed FILES_AT}; shift

pack() {  # what the workers have so far, in pieces small enough for the trip back (16 MiB)
  [ -n "${OUT:-}" ] || return 0
  cp "$CAMPAIGN"/*.jsonl "$CAMPAIGN"/*.log "$OUT/" 2>/dev/null
  local d f
  for d in results micro tune cross-check ncu; do
    [ -d "$CAMPAIGN/$d" ] && tar czf "$OUT/$d.tgz" -C "$CAMPAIGN" "$d"
  done
  for f in "$OUT"/*.tgz; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && split -b 15000000 "$f" "$f.part-" && rm "$f"
  done
  ls -la "$OUT"
}

working() {  # is any lane's worker of campaign ${1:-$CAMPAIGN} alive?
  local f
  for f in "${1:-$CAMPAIGN}"/worker-*.pid; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0
  done
  return 1
}

watch() {  # until every worker is gone or WAIT_S passes
  local deadline=$(( $(date +%s) + ${WAIT_S:-540} )) f
  while [ "$(date +%s)" -lt "$deadline" ] && working; do
    sleep 5
  done
  local logs=("$CAMPAIGN"/worker-*.log)
  if [ -e "${logs[0]}" ]; then
    for f in "${logs[@]}"; do echo "--- $f"; tail -$(( 25 / ${#logs[@]} + 3 )) "$f"; done
  else
    echo "no worker has run in $CAMPAIGN"
  fi
  pack
}

claim() {  # the file a job's claim is held on: its spec, and the tree it runs under
  local tree=${ATTNBENCH_TUNED_TREE:-}
  mkdir -p "$CAMPAIGN/claims"
  echo "$CAMPAIGN/claims/${1//[^A-Za-z0-9._+-]/_}${tree:+@${tree//[^A-Za-z0-9._+-]/_}}"
}

claimed() {  # job "$1" under its claim; skipped while another lane holds it
  ( flock -n 9 || { echo "$1: another lane runs it"; exit 0; }; job "$1" ) 9> "$(claim "$1")"
}

job() {
  local spec=$1 name=${1%%:*} arg=
  [ "$spec" != "$name" ] && arg=${spec#*:}
  echo "=== $(date -u +%FT%TZ) $spec"
  case $name in
    run)
      local only=() n
      for n in ${arg//,/ }; do only+=(--only "$n"); done
      attnbench run "${SUITE:-recipes/h100.yaml}" --models dummy --models-dir "$MODELS_DIR" \
        --out "$CAMPAIGN/results" --resume "${only[@]}" 2>&1 | grep -v "it/s]\|req/s]" ;;
    micro)
      local what=${arg%@*} flush= suite impls= group= flags=() i
      [ "$what" != "$arg" ] && flush=${arg#*@}
      suite=${what%%+*}
      [ "$suite" != "$what" ] && impls=${what#*+}
      [ "${suite#*/}" != "$suite" ] && group=${suite#*/} && suite=${suite%%/*}
      for i in ${impls//,/ }; do flags+=(--impl "$i"); done
      [ -n "$group" ] && flags+=(--only "$group")
      [ -n "$flush" ] && flags+=(--l2-flush "$flush")
      local csv=$CAMPAIGN/micro/${what//\//-}${flush:+-$flush}
      [ "${ATTNBENCH_TUNED_TREE:-}" = off ] && csv+=-untuned  # after tree:off
      mkdir -p "$CAMPAIGN/micro"
      timeout "${MICRO_TIMEOUT_S:-1800}" attnbench microbench \
        "recipes/microbench/$suite.yaml" "${flags[@]}" --out "$csv.csv" --resume ;;
    tune)
      mkdir -p "$CAMPAIGN/tune"
      [ -s "$CAMPAIGN/tune/tuned_$arg.py" ] || timeout "${TUNE_TIMEOUT_S:-900}" attnbench tune \
        "recipes/microbench/$arg.yaml" --space recipes/microbench/tune-space.yaml --rows "$CAMPAIGN/tune/$arg.csv" \
        --max-depth 5 --emit "$CAMPAIGN/tune/tuned_$arg.py" ;;
    tree)
      if [ "$arg" = off ]; then export ATTNBENCH_TUNED_TREE=off
      elif [ "$arg" = shipped ]; then unset ATTNBENCH_TUNED_TREE
      else
        # the tree another lane may still be fitting: wait for its claim (held while tune runs)
        ( flock 9 ) 9> "$(ATTNBENCH_TUNED_TREE= claim "tune:$arg")"
        export ATTNBENCH_TUNED_TREE=$CAMPAIGN/tune/tuned_$arg.py
      fi
      echo "ATTNBENCH_TUNED_TREE=${ATTNBENCH_TUNED_TREE:-(the shipped tree)}" ;;
    xcheck)
      # shellcheck disable=SC2086  # XCHECK_ARGS: several options
      attnbench crosscheck run "${SUITE:-recipes/cross-check-h100.yaml}" --only "${arg:-api1-custom}" --models dummy \
        --models-dir "$MODELS_DIR" --out "$CAMPAIGN/cross-check/${arg:-api1-custom}" ${XCHECK_ARGS:-} ;;
    calibrate)
      local streams procs
      for streams in 256 1024; do
        for procs in 1 2 4 8; do
          attnbench calibrate --concurrency $streams --requests $((4 * streams)) --client-processes $procs \
            --stub-processes $(( streams > 256 ? 4 : 1 )) --json | tr -d '\n ' >> "$CAMPAIGN/calibrate.jsonl"
          echo >> "$CAMPAIGN/calibrate.jsonl"
        done
      done ;;
    khost)
      attnbench kernels overhead --json --profile > "$CAMPAIGN/kernels-overhead.jsonl" 2> "$CAMPAIGN/kernels-overhead.log" ;;
    gputest)
      local file=${arg%@*} select=
      [ "$file" != "$arg" ] && select=${arg#*@}
      # another lane's finished run of the same tests (the claim is free once it ends)
      grep -qE "[0-9]+ (passed|failed)" "$CAMPAIGN/gputest-${file%.py}.log" 2>/dev/null && return 0
      timeout "${GPUTEST_TIMEOUT_S:-300}" python3 -m pytest -q -x -p no:cacheprovider "tests/$file" \
        ${select:+-k "$select"} ${GPUTEST_WORKERS:+-n "$GPUTEST_WORKERS"} > "$CAMPAIGN/gputest-${file%.py}.log" 2>&1
      tail -3 "$CAMPAIGN/gputest-${file%.py}.log" ;;
    ncu)
      local suite=${arg%%/*} rest=${arg#*/} case impl ncu
      case=${rest%%/*}
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      mkdir -p "$CAMPAIGN/ncu"
      local impls=${rest#*/}
      for impl in ${impls//,/ }; do
        [ -s "$CAMPAIGN/ncu/$case-$impl.txt" ] && continue
        timeout "${NCU_TIMEOUT_S:-300}" "$ncu" --nvtx --nvtx-include "attnbench/" --set full --target-processes all \
          -f -o "$CAMPAIGN/ncu/$case-$impl" attnbench kernels run "recipes/microbench/$suite.yaml" --case "$case" \
          --impl "$impl" --repeat 1 > "$CAMPAIGN/ncu/$case-$impl.log" 2>&1
        "$ncu" -i "$CAMPAIGN/ncu/$case-$impl.ncu-rep" --page details > "$CAMPAIGN/ncu/$case-$impl.txt" 2>&1
        "$ncu" -i "$CAMPAIGN/ncu/$case-$impl.ncu-rep" --page source --csv --print-source sass \
          > "$CAMPAIGN/ncu/$case-$impl-sass.csv" 2>&1
      done ;;
    *) echo "unknown job $spec" ;;
  esac
}

seed() {  # a lease's packed runs and microbenchmark CSVs into .carry/{results,micro}, for the next `start`
  local from=${1:?usage: campaign.sh seed FILES_AT} to=${CARRY:-.carry} d tgz found=
  for d in results micro; do
    tgz=$from/$d.tgz
    if [ ! -f "$tgz" ]; then
      ls "$from/$d".tgz.part-* >/dev/null 2>&1 || continue
      tgz=$(mktemp)
      cat "$from/$d".tgz.part-* > "$tgz"
    fi
    rm -rf "${to:?}/$d" && mkdir -p "$to"
    tar xzf "$tgz" -C "$to" --exclude='*/server.log' --exclude='*/.lock' "$d" || exit 1
    du -sh "$to/$d"
    found=1
  done
  if [ -z "$found" ]; then
    echo "seed: $from holds no results.tgz nor micro.tgz (nor their .part-* pieces): expected a campaign's packed runs" >&2
    exit 2
  fi
}

case $cmd in
  seed) seed "$@" ;;
  start)
    if working; then
      echo "a worker is already running"; watch; exit 0
    fi
    # the runs and CSVs an earlier lease measured (`seed`), so that this one resumes them
    for d in results micro; do
      if [ -d "${CARRY:-.carry}/$d" ] && [ ! -e "$CAMPAIGN/$d" ]; then
        cp -r "${CARRY:-.carry}/$d" "$CAMPAIGN/$d"
      fi
    done
    . docs/campaign/gpu-setup.sh
    # the workers: each in its own session, so it outlives this call; PYTHONUNBUFFERED for a live log
    for (( lane = 0; lane < ${LANES:-1}; lane++ )); do
      PYTHONUNBUFFERED=1 LANE=$lane setsid bash "$0" worker "$@" >> "$CAMPAIGN/worker-$lane.log" 2>&1 < /dev/null &
      echo $! > "$CAMPAIGN/worker-$lane.pid"
    done
    sleep 2
    watch ;;
  wait) watch ;;
  worker)
    if [ -n "${AFTER:-}" ]; then  # queued behind another campaign's workers
      echo "=== $(date -u +%FT%TZ) waiting for the workers of $AFTER"
      while working "$AFTER"; do sleep 5; done
    fi
    . docs/campaign/gpu-setup.sh
    if [ "${LANES:-1}" -gt 1 ]; then  # lane i: GPU i alone, numbered as nvidia-smi and NVML number them
      export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$LANE
    fi
    for spec in "$@"; do
      case ${spec%%:*} in
        run|tree) job "$spec" ;;  # runs: locked per run by attnbench itself; tree: this lane's setting
        *) claimed "$spec" ;;
      esac
    done
    echo "=== $(date -u +%FT%TZ) all jobs done" ;;
  *) echo "usage: campaign.sh start JOB... | wait | seed FILES_AT" >&2; exit 2 ;;
esac
