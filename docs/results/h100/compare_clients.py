"""Side by side: `attnbench load` (attnbench/r<k>/summary.json) and `vllm bench serve`
(vllm-bench/r<k>.json) on the same server and prompts; mean over repeats, and the
difference of vllm bench serve from attnbench in %; then `attnbench load --per-chunk-usage`
(per-chunk-usage/r<k>/summary.json) if it ran.
    python3 compare_clients.py CROSS_CHECK_DIR
"""

import json
import statistics
import sys
from pathlib import Path

KEYS = ["completed", "total_input_tokens", "total_output_tokens", "duration", "request_throughput",
        "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms",
        "mean_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms"]


def mean_of(files: list[Path]) -> dict:
    runs = [json.loads(f.read_text()) for f in files]
    return {k: statistics.fmean(r[k] for r in runs) for k in KEYS if all(k in r for r in runs)}


root = Path(sys.argv[1])
ours = mean_of(sorted(root.glob("attnbench/r*/summary.json")))
theirs = mean_of(sorted(root.glob("vllm-bench/r*.json")))
extra_files = sorted(root.glob("per-chunk-usage/r*/summary.json"))
extra = mean_of(extra_files) if extra_files else {}
print(f"| metric (mean of {len(list(root.glob('vllm-bench/r*.json')))} repeats) | attnbench load "
      "| vllm bench serve | difference |" + (" attnbench load --per-chunk-usage |" if extra else ""))
print("|---|---|---|---|" + ("---|" if extra else ""))
for k in KEYS:
    if k in ours and k in theirs:
        diff = (theirs[k] - ours[k]) / ours[k] * 100 if ours[k] else float("nan")
        tail = f" {extra[k]:,.2f} |" if k in extra else (" - |" if extra else "")
        print(f"| {k} | {ours[k]:,.2f} | {theirs[k]:,.2f} | {diff:+.1f}% |" + tail)
