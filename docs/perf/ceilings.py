"""How steady are the microbenchmark's roofline ceilings on this GPU?

    python3 docs/perf/ceilings.py TAG N     (from the repository root, attnbench installed)

Calls `attnbench.kernels.bench.microbench.measure_ceilings` N times in a row, then times
the bf16 8192^3 matmul alone in six 1 s windows, and prints one CSV line per measurement
(no header): TAG, index (``mm1s-i`` for the windows), copy GB/s, matmul TFLOP/s, seconds
the measurement took, and nvidia-smi's SM clock, power and temperature right after it.
Run it in several fresh processes to see a rested GPU's first window against the rest
(docs/perf/kernels-h100.md, "The compute ceiling, timed once the GPU has settled").
"""

import subprocess
import sys
import time

import torch
from triton.testing import do_bench

from attnbench.kernels.bench.microbench import measure_ceilings

MATMUL_N = 8192


def gpu_state() -> str:
    """nvidia-smi's SM clock, power draw and temperature, as it prints them."""
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()


def main(tag: str, count: int) -> None:
    device = torch.device("cuda")
    for i in range(count):
        t0 = time.time()
        c = measure_ceilings(device)
        print(f"{tag},{i},{c.copy_bytes_s / 1e9:.0f},{c.matmul_flops_s / 1e12:.1f},{time.time() - t0:.2f},"
              f"{gpu_state()}", flush=True)
    a = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=device)
    b = torch.randn(MATMUL_N, MATMUL_N, dtype=torch.bfloat16, device=device)
    for i in range(6):
        ms = do_bench(lambda: a @ b, warmup=25, rep=1000, return_mode="median")
        print(f"{tag},mm1s-{i},,{2 * MATMUL_N**3 / (ms * 1e-3) / 1e12:.1f},,{gpu_state()}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: python3 docs/perf/ceilings.py TAG N  (N: how many measure_ceilings calls)")
    main(sys.argv[1], int(sys.argv[2]))
