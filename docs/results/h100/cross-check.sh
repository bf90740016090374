#!/usr/bin/env bash
# The `vllm bench serve` cross-check (issue 12): one vLLM server (a run of recipes/h100.yaml,
# default backends-custom: attnbench's kernels, the configuration of the issue), one set of
# 500 prompts (attnbench's synthetic ShareGPT-shaped set exported as ShareGPT JSON, read by
# both clients), and PAIRS (default 5) alternating pairs of `attnbench load` and `vllm bench
# serve` (same vLLM install) for each load: all at once (burst) and Poisson arrivals at
# RATE req/s (default 20, ~80% of the burst's completion rate). Both clients send the same
# requests (same prompts, max_tokens, temperature 0, ignore_eos) on the same schedule (same
# seed: attnbench draws arrivals as vLLM does). Around every client run: vLLM's /metrics
# (the server's own TTFT/ITL: the third witness) and the CPU time of every server process
# and of the client, and the host's speed (a probe's fixed work, stolen and stalled CPU).
# From the repository root on the GPU host, after the vLLM bundle:
#   bash docs/results/h100/cross-check.sh [RUN]       (XCHECK_DIR: output, default $OUT/cross-check)
# LOADS (default "burst poisson") picks the loads; FIXED_PROCS="1 2 8" adds to every pair a
# run of `attnbench load --client-processes N` for each N (attnbench-pN/; 1 is vllm bench
# serve's own count), which separates what the client's process count does to the server's
# own timing from what each client adds. SEND_TRACE=1 runs every client under send_trace.py
# (aiohttp's trace of when each request was written, in sent/), so that the report also
# counts TTFT from the write, not only from each client's own clock. SIDE_BY_SIDE=1 runs the
# two clients at once instead, each on half of the prompts at half the rate, from one start
# (LOAD-side/; below), PAIRS pairs of such runs with the halves swapped. It ends with
# compare_clients.py's verdict in XCHECK_DIR/comparison.md. SERVER_PID=PID measures a server
# already listening on port 8123 instead of starting one (PID: its process, for the CPU
# accounting; it is left running). The same server with two API-server processes:
#   SUITE=recipes/cross-check-h100.yaml bash docs/results/h100/cross-check.sh api2-custom
# A dry run on a CPU:
#   NO_GPU_SETUP=1 SUITE=recipes/cpu-demo.yaml MODEL=tiny-llama TOKENIZER=.models/tiny-llama \
#   PROMPTS=24 PAIRS=1 RATE=4 MODELS=as-written bash docs/results/h100/cross-check.sh v1
set -u
[ -n "${NO_GPU_SETUP:-}" ] || . docs/perf/gpu-setup.sh
run=${1:-backends-custom}
pairs=${PAIRS:-5}; rate=${RATE:-20}; prompts=${PROMPTS:-500}
suite=${SUITE:-recipes/h100.yaml}; model=${MODEL:-llama-3.1-8b}; models=/tmp/models
tok=${TOKENIZER:-$models/llama-3.1-8b}; port=8123; url=http://127.0.0.1:$port
res=${XCHECK_DIR:-${OUT:-/tmp}/cross-check}; mkdir -p "$res"
here=docs/results/h100

if [ -n "${SERVER_PID:-}" ]; then  # a server the caller started on $port (e.g. `vllm serve` with other flags)
  server=$SERVER_PID
else
  setsid attnbench serve "$suite" --only "$run" --models "${MODELS:-dummy}" --models-dir $models --port $port \
    --log "$res/server.log" > "$res/serve.out" 2>&1 &
  server=$!
  stop_server() { kill -TERM -- -$server 2>/dev/null; wait $server 2>/dev/null; }
fi
# the host probe (proc_cpu.py --probe) times a fixed piece of work 4 times a second through
# the whole campaign: how fast the host ran during each run, for compare_clients.py
python3 $here/proc_cpu.py --probe "$res/host-probe.jsonl" & probe=$!
trap 'kill $probe 2>/dev/null; [ -z "${SERVER_PID:-}" ] && stop_server' EXIT
until curl -sf $url/health >/dev/null; do
  kill -0 $server 2>/dev/null || { tail -20 "$res/server.log"; exit 1; }
  sleep 2
done
[ -s "$res/prompts.json" ] || attnbench dataset export --tokenizer $tok --num-prompts "$prompts" --seed 0 "$res/prompts.json"
target=(--url $url --model $model --tokenizer $tok --dataset sharegpt)
common=("${target[@]}" --dataset-path "$res/prompts.json" --num-prompts "$prompts" --seed 0)
attnbench load "${common[@]}" --num-prompts 16 --out "$res/warmup" > /dev/null 2>&1
# What each client run sends (the measure functions read these; a side-by-side run sets its
# own in a subshell): the prompt file, how many, the seed of their order and arrivals, and a
# shared start (epoch s; empty: when ready)
dataset=$res/prompts.json; count=$prompts; seed=0; start_at=

python_for() {  # $1 a trace's file prefix: sets $py, the python command line a client runs under
  py=(python3); [ -z "${SEND_TRACE:-}" ] || py=(python3 $here/send_trace.py "$1")
}

measure_attnbench() {  # $1 load, $2 rate, $3 repeat, $4 client name, $5 client processes
  local name=${4:-attnbench}
  [ -s "$res/$1/$name/r$3/summary.json" ] && return
  python_for "$res/$1/sent/$name-r$3"
  python3 $here/proc_cpu.py $server > "$res/$1/cpu/$name-r$3.before.json"
  python3 $here/proc_cpu.py --run "$res/$1/cpu/$name-r$3.client.json" -- \
    "${py[@]}" -m attnbench.cli load "${target[@]}" --dataset-path "$dataset" --num-prompts "$count" --seed "$seed" ${start_at:+--start-at $start_at} \
    --request-rate "$2" --arrival poisson --client-processes "${5:-auto}" \
    --out "$res/$1/$name/r$3" 2>&1 | tail -2
  python3 $here/proc_cpu.py $server > "$res/$1/cpu/$name-r$3.after.json"
}
measure_fixed() {  # attnbench with each of FIXED_PROCS client processes
  local n
  for n in ${FIXED_PROCS:-}; do measure_attnbench "$1" "$2" "$3" "attnbench-p$n" "$n"; done
}
measure_vllm_bench() {  # $1 load, $2 rate, $3 repeat
  { [ -s "$res/$1/vllm-bench/r$3.json" ] || [ -s "$res/$1/vllm-bench/r$3.json.gz" ]; } && return
  python_for "$res/$1/sent/vllm-bench-r$3"
  python3 $here/proc_cpu.py $server > "$res/$1/cpu/vllm-bench-r$3.before.json"
  curl -s $url/metrics > "$res/$1/vllm-bench/r$3.before.prom"
  python3 $here/proc_cpu.py --run "$res/$1/cpu/vllm-bench-r$3.client.json" -- \
    "${py[@]}" $here/vllm_bench_serve.py ${start_at:+--start-at $start_at} --backend vllm --base-url $url \
    --model $model --tokenizer $tok --dataset-name sharegpt --dataset-path "$dataset" --num-prompts "$count" \
    --ignore-eos --temperature 0 --request-rate "$2" --burstiness 1.0 --seed "$seed" \
    --percentile-metrics ttft,tpot,itl,e2el --save-result --save-detailed \
    --result-dir "$res/$1/vllm-bench" --result-filename "r$3.json" 2>&1 | grep -E "start-at|throughput|TTFT|ITL" | head -5
  curl -s $url/metrics > "$res/$1/vllm-bench/r$3.after.prom"
  python3 $here/proc_cpu.py $server > "$res/$1/cpu/vllm-bench-r$3.after.json"
}

# Side by side (SIDE_BY_SIDE=1): both clients in one run, each sending half of the prompts
# (even- and odd-numbered: prompts-a.json, prompts-b.json) at half the rate, from one start.
# Two Poisson streams of RATE/2 with their own seeds (a: 1, b: 2) add up to one of RATE, so
# the server sees the alternating runs' load; in the next run the clients swap halves, so a
# pair of runs sends each client every prompt on the same schedule. Within a run both
# clients meet the same server on the same host: its drift from run to run, which decides
# the alternating runs' TTFT (README, "Twenty Poisson pairs"), is common to both.
split_prompts() {
  [ -s "$res/prompts-b.json" ] || python3 - "$res/prompts.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for half, share in (("a", rows[0::2]), ("b", rows[1::2])):
    json.dump(share, open(sys.argv[1].replace("prompts.json", f"prompts-{half}.json"), "w"))
PY
}
measure_side_by_side() {  # $1 load folder, $2 rate of each client, $3 run
  local ours=a theirs=b lead=${SIDE_LEAD_S:-30}  # vllm bench took up to 27 s to be ready on the H100 host
  [ $(($3 % 2)) = 1 ] || { ours=b; theirs=a; }
  seed_of() { [ "$1" = a ] && echo 1 || echo 2; }
  # the start leaves time for vllm bench serve's imports, tokenizer and test request
  local at; at=$(python3 -c "import time; print(f'{time.time() + $lead:.3f}')")
  ( dataset=$res/prompts-$ours.json count=$((prompts / 2)) seed=$(seed_of $ours) start_at=$at
    measure_attnbench "$1" "$2" "$3" ) &
  local a=$!
  ( dataset=$res/prompts-$theirs.json count=$((prompts / 2)) seed=$(seed_of $theirs) start_at=$at
    measure_vllm_bench "$1" "$2" "$3" ) &
  wait $a $!
}

for load in ${LOADS:-burst poisson}; do
  if [ $load = burst ]; then r=inf; else r=$rate; fi
  folder=$load${SIDE_BY_SIDE:+-side}
  mkdir -p "$res/$folder/vllm-bench" "$res/$folder/cpu" "$res/$folder/sent"
  # one unrecorded run of this load first: the server's first run after a change of load
  # was the slowest of its kind in the 2026-11-23 runs, whichever client sent it
  [ -e "$res/$folder/warmed-up" ] || { attnbench load "${common[@]}" --request-rate $r --arrival poisson \
    --out "$res/$folder/warmup" > /dev/null 2>&1; touch "$res/$folder/warmed-up"; }
  if [ -n "${SIDE_BY_SIDE:-}" ]; then
    [ $((prompts % 2)) = 0 ] || { echo "SIDE_BY_SIDE: PROMPTS=$prompts must be even (two equal halves)" >&2; exit 2; }
    split_prompts; touch "$res/$folder/side-by-side"  # compare_clients.py pairs the clients run by run
    [ $r = inf ] || r=$(python3 -c "print($r / 2)")
    for i in $(seq $((2 * pairs))); do measure_side_by_side $folder $r $i; done
    continue
  fi
  # ABBA: attnbench goes first in odd pairs, vllm bench serve in even ones, so a drift of
  # the server over the session weighs on both clients alike (the fixed-process runs, if
  # any, sit between them)
  for i in $(seq "$pairs"); do
    if [ $((i % 2)) = 1 ]; then
      measure_attnbench $load $r $i; measure_fixed $load $r $i; measure_vllm_bench $load $r $i
    else
      measure_vllm_bench $load $r $i; measure_fixed $load $r $i; measure_attnbench $load $r $i
    fi
  done
done
gzip -f "$res"/*/attnbench*/r*/requests.jsonl "$res"/*/vllm-bench/r*.json "$res"/*/sent/*.jsonl 2>/dev/null
python3 $here/compare_clients.py "$res" > "$res/comparison.md"
cat "$res/comparison.md"
