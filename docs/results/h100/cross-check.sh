#!/usr/bin/env bash
# The `vllm bench serve` cross-check (issue 5, part 3): one vLLM server (a run of
# recipes/h100.yaml, default backends-triton), the same 500 prompts (attnbench's synthetic
# ShareGPT-shaped set, exported as ShareGPT JSON), loaded in turn by `attnbench load` and by
# `vllm bench serve` (same vLLM install; --temperature 0: greedy, as attnbench asks, where
# vLLM's client would leave sampling to the server's default), $REPEATS (default 3) times each, alternating; then
# once more by `attnbench load --per-chunk-usage` (what that option costs the server). From the repository root
# on the GPU host, after the offline vLLM bundle is installed:
#   bash docs/results/h100/cross-check.sh [RUN]
# Writes $OUT/cross-check/ (per-repeat results of both clients, server log, comparison.md).
set -u
. docs/perf/gpu-setup.sh
run=${1:-backends-triton}
models=/tmp/models; tok=$models/llama-3.1-8b; port=8123; url=http://127.0.0.1:$port
res=${OUT:-/tmp}/cross-check; mkdir -p "$res"
attnbench serve recipes/h100.yaml --only "$run" --models dummy --models-dir $models --port $port \
  --log "$res/server.log" &
server=$!
# TERM, not INT: a background job of a script starts with SIGINT ignored
trap 'kill -TERM $server 2>/dev/null; wait $server' EXIT
until curl -sf $url/health >/dev/null; do
  kill -0 $server 2>/dev/null || { tail -20 "$res/server.log"; exit 1; }
  sleep 2
done
attnbench dataset export --tokenizer $tok --num-prompts 500 --seed 0 "$res/prompts.json"
common=(--url $url --model llama-3.1-8b --tokenizer $tok --dataset sharegpt --dataset-path "$res/prompts.json")
attnbench load "${common[@]}" --num-prompts 8 --out "$res/warmup" >/dev/null
for i in $(seq "${REPEATS:-3}"); do
  attnbench load "${common[@]}" --num-prompts 500 --out "$res/attnbench/r$i" 2>&1 | grep -v "it/s]"
  python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url $url --model llama-3.1-8b \
    --tokenizer $tok --dataset-name sharegpt --dataset-path "$res/prompts.json" --num-prompts 500 \
    --ignore-eos --temperature 0 --request-rate inf --seed 0 --percentile-metrics ttft,tpot,itl,e2el \
    --save-result --result-dir "$res/vllm-bench" --result-filename "r$i.json" 2>&1 | tail -25
done
attnbench load "${common[@]}" --num-prompts 500 --per-chunk-usage --out "$res/per-chunk-usage/r1" 2>&1 | grep -v "it/s]"
gzip -f "$res"/*/r*/requests.jsonl "$res"/warmup/requests.jsonl
tar czf "$res/attnbench-records.tgz" -C "$res" attnbench per-chunk-usage warmup
python3 docs/results/h100/compare_clients.py "$res" | tee "$res/comparison.md"
