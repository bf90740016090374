"""How steady are the microbenchmark's roofline ceilings on this GPU?

    python3 docs/perf/ceilings.py TAG N     (from the repository root, attnbench installed)

Prints one CSV line per measurement (no header): TAG, what was measured, copy GB/s, matmul
TFLOP/s, seconds it took, and nvidia-smi's SM clock, power and temperature right after it.
First one cold 200 ms matmul window (``cold``: 25 ms of warm-up, what `measure_ceilings`
timed before it settled the GPU), then N calls of
`attnbench.kernels.bench.microbench.measure_ceilings` (``0`` .. ``N-1``), then the matmul
alone in six 1 s windows (``mm1s-i``). Run it in several fresh processes to see a rested
GPU's first window against the rest (docs/perf/kernels-h100.md, "The compute ceiling,
timed once the GPU has settled").
"""

import subprocess
import sys
import time

import torch

from attnbench.kernels.bench.microbench import matmul_flops_s, measure_ceilings


def gpu_state() -> str:
    """nvidia-smi's SM clock, power draw and temperature, as it prints them."""
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()


def main(tag: str, count: int) -> None:
    device = torch.device("cuda")
    t0 = time.time()
    cold = matmul_flops_s(device, warmup_ms=25)
    print(f"{tag},cold,,{cold / 1e12:.1f},{time.time() - t0:.2f},{gpu_state()}", flush=True)
    for i in range(count):
        t0 = time.time()
        c = measure_ceilings(device)
        print(f"{tag},{i},{c.copy_bytes_s / 1e9:.0f},{c.matmul_flops_s / 1e12:.1f},{time.time() - t0:.2f},"
              f"{gpu_state()}", flush=True)
    for i in range(6):
        print(f"{tag},mm1s-{i},,{matmul_flops_s(device, warmup_ms=25, rep_ms=1000) / 1e12:.1f},,{gpu_state()}",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        sys.exit("usage: python3 docs/perf/ceilings.py TAG N  (N: how many measure_ceilings calls)")
    main(sys.argv[1], int(sys.argv[2]))
