#!/usr/bin/env bash
# What each client itself adds at a burst (issue 12): `attnbench load` and `vllm bench serve`
# against attnbench's zero-work stub (`attnbench stub-server`), the same prompts (the
# cross-check's 500 ShareGPT-shaped prompts, exported as ShareGPT JSON), all sent at once,
# PAIRS alternating pairs. The stub answers at once and then sends one chunk per PACE_MS ms,
# so its own TTFT is ~0 and its ITL exactly the pace: a client's TTFT here is what the client
# (with loopback and the stub's accept loop, the same for both) adds. PACE_MS 80 makes 500
# streams deliver ~6,200 chunks/s, the rate vLLM streamed during the H100 cross-check's burst.
# The stub runs on CPU 1, each client on CPU 0 (one process each, as in the cross-check).
# OUTPUT_LEN fixes every request's output length for both clients (a run lasts OUTPUT_LEN x
# PACE_MS instead of the longest prompt's 1,776 x 80 ms; the burst's first chunks, where the
# TTFT difference arises, are the same).
#   [OUTPUT_LEN=256] bash docs/results/h100/client-overhead.sh   (OVERHEAD_DIR: output, default $OUT/client-overhead)
# Needs attnbench and vLLM's benchmark client (`vllm bench serve`) on this Python; no GPU.
set -u
[ -n "${NO_GPU_SETUP:-}" ] || . docs/perf/gpu-setup.sh
pairs=${PAIRS:-3}; prompts=${PROMPTS:-500}; pace=${PACE_MS:-80}; port=8124
res=${OVERHEAD_DIR:-${OUT:-/tmp}/client-overhead}; mkdir -p "$res"
tok=${TOKENIZER:-/tmp/models/llama-3.1-8b}
[ -s "$tok/tokenizer.json" ] || attnbench model dummy --arch llama-3.1-8b "$tok" > /dev/null
[ -s "$res/prompts.json" ] || attnbench dataset export --tokenizer "$tok" --num-prompts "$prompts" --seed 0 "$res/prompts.json"

setsid taskset -c 1 attnbench stub-server --port $port > "$res/stub.out" 2>&1 &
stub=$!
trap 'kill -TERM -- -$stub 2>/dev/null; wait $stub 2>/dev/null' EXIT
until curl -sf http://127.0.0.1:$port/health > /dev/null; do sleep 0.2; done
url=http://127.0.0.1:$port/pace/$pace
fixed_ours=(); fixed_theirs=()
[ -n "${OUTPUT_LEN:-}" ] && fixed_ours=(--output-len "$OUTPUT_LEN") && fixed_theirs=(--sharegpt-output-len "$OUTPUT_LEN")

for i in $(seq "$pairs"); do
  [ -s "$res/attnbench/r$i/summary.json" ] || taskset -c 0 attnbench load --url "$url" --model stub \
    --tokenizer "$tok" --dataset sharegpt --dataset-path "$res/prompts.json" --num-prompts "$prompts" --seed 0 \
    "${fixed_ours[@]}" --request-rate inf --out "$res/attnbench/r$i" 2>/dev/null
  [ -s "$res/vllm-bench/r$i.json" ] || taskset -c 0 python3 docs/results/h100/vllm_bench_serve.py \
    --backend vllm --base-url "$url" --model stub --tokenizer "$tok" --dataset-name sharegpt \
    --dataset-path "$res/prompts.json" --num-prompts "$prompts" "${fixed_theirs[@]}" --ignore-eos --temperature 0 \
    --request-rate inf \
    --seed 0 --percentile-metrics ttft,tpot,itl,e2el --save-result --save-detailed \
    --result-dir "$res/vllm-bench" --result-filename "r$i.json" 2>&1 | grep -E "Mean TTFT|Median TTFT" | head -2
done
python3 - "$res" "$pace" <<'EOF' | tee "$res/overhead.md"
import json, sys
from pathlib import Path
res, pace = Path(sys.argv[1]), float(sys.argv[2])
rows = [("attnbench", json.loads(p.read_text())) for p in sorted(res.glob("attnbench/r*/summary.json"))]
rows += [("vllm bench serve", json.loads(p.read_text())) for p in sorted(res.glob("vllm-bench/r*.json"))]
print(f"| client | TTFT p50 / mean / p99 ms (= added: the stub's TTFT is ~0) | mean TPOT - pace ms | median ITL - pace ms | output tok/s |")
print("|---|---|---|---|---|")
for name, s in rows:
    print(f"| {name} | {s['median_ttft_ms']:.1f} / {s['mean_ttft_ms']:.1f} / {s['p99_ttft_ms']:.1f} | "
          f"{s['mean_tpot_ms'] - pace:+.2f} | {s['median_itl_ms'] - pace:+.2f} | {s['output_throughput']:,.0f} |")
EOF
