#!/usr/bin/env bash
# Does the Gluon kernel under `auto` change serving? One vLLM server per arm of
# backends-custom (attnbench's kernels through the plugin, `auto`), the arms differing only
# in ATTNBENCH_GLUON (1: prefill and mixed batches run qblock_ws on Hopper; 0: Triton's
# Q-block kernel, as before 2026-11-24), each given the same warm-up and RUNS `attnbench
# load` runs of the cross-check's 500 prompts at Poisson RATE (default 20) req/s. From the
# repository root on the GPU host, after the vLLM bundle:
#   bash docs/results/h100/gluon-ab.sh            (AB_DIR: output, default $OUT/gluon-ab)
set -u
. docs/perf/gpu-setup.sh
runs=${RUNS:-2}; rate=${RATE:-20}; port=8124; url=http://127.0.0.1:$port; models=/tmp/models
res=${AB_DIR:-${OUT:-/tmp}/gluon-ab}; mkdir -p "$res"
for arm in ${ARMS:-1 0}; do
  dir=$res/gluon-$arm; mkdir -p "$dir"
  ATTNBENCH_GLUON=$arm setsid attnbench serve recipes/h100.yaml --only backends-custom --models dummy \
    --models-dir $models --port $port --log "$dir/server.log" > "$dir/serve.out" 2>&1 &
  server=$!
  until curl -sf $url/health >/dev/null; do
    kill -0 $server 2>/dev/null || { tail -20 "$dir/server.log"; exit 1; }
    sleep 2
  done
  tok=$models/llama-3.1-8b
  [ -s "$res/prompts.json" ] || attnbench dataset export --tokenizer $tok --num-prompts 500 --seed 0 "$res/prompts.json"
  common=(--url $url --model llama-3.1-8b --tokenizer $tok --dataset sharegpt --dataset-path "$res/prompts.json"
          --num-prompts 500 --seed 0 --request-rate "$rate" --arrival poisson)
  attnbench load "${common[@]}" --out "$dir/warmup" > /dev/null 2>&1
  for i in $(seq "$runs"); do
    attnbench load "${common[@]}" --out "$dir/r$i" 2>&1 | tail -1
  done
  kill -TERM -- -$server 2>/dev/null; wait $server 2>/dev/null
  while curl -sf $url/health >/dev/null 2>&1; do sleep 1; done
done
python3 - "$res" <<'PY'
import json, sys
from pathlib import Path
print("| arm | run | median TTFT ms | mean TTFT ms | server mean TTFT ms | mean TPOT ms | median ITL ms | out tok/s |")
print("|---|---|---|---|---|---|---|---|")
for s in sorted(Path(sys.argv[1]).glob("gluon-*/r*/summary.json")):
    d = json.loads(s.read_text())
    server = (d.get("server_metrics") or {}).get("mean_ttft_ms")
    print(f"| {s.parts[-3]} | {s.parts[-2]} | {d['median_ttft_ms']:.1f} | {d['mean_ttft_ms']:.1f} | "
          f"{server if server is None else round(server, 1)} | {d['mean_tpot_ms']:.2f} | {d['median_itl_ms']:.2f} | "
          f"{d['output_throughput']:,.0f} |")
PY
