"""Back-to-back timing of implementations with the GPU's SM clock and power beside it.

`do_bench` times single launches with an L2 flush between them; a serving GPU runs
attention back to back, where an H100 SXM sits at its power cap and lowers its clock. This
runs each implementation or named config of llama3-8b-hopper.yaml (checked against the
fp32 reference first) for SECONDS back to back per case, alternating, while nvidia-smi
samples the SM clock, power and throttle reasons every 50 ms, and prints one line per
window: us per launch, mean SM clock (MHz), mean power (W). To compare two versions of a
kernel, run it from two installs in turn, as kernel-ab.sh does.

    python3 docs/perf/sustained_clocks.py OUT_DIR --impl qblock_ws_persistent --impl fa3 \\
        --case prefill-b4-2k --case prefill-b1-8k       (GPU host; `. docs/perf/gpu-setup.sh` first)
"""
from __future__ import annotations

import datetime as dt
import subprocess
import time
from pathlib import Path

import click


def _samples(path: Path) -> list[tuple[float, float, float, str]]:
    """(epoch s, SM clock MHz, power W, throttle reasons) per nvidia-smi line."""
    rows = []
    for line in path.read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            ts = dt.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, float(f[1].split()[0]), float(f[2].split()[0]), f[3]))
        except (ValueError, IndexError):
            continue
    return rows


@click.command(help=__doc__)
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--impl", "impls", multiple=True, required=True, help="Implementation or named config of the suite.")
@click.option("--case", "cases", multiple=True, required=True, help="Case of llama3-8b-hopper.yaml.")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="Length of each window.")
@click.option("--rounds", type=int, default=2, show_default=True, help="Windows per implementation and case.")
def main(out_dir: Path, impls: tuple[str, ...], cases: tuple[str, ...], seconds: float, rounds: int) -> None:
    import torch

    from attnbench.kernels.bench.microbench import run_for_profiler
    from attnbench.kernels.bench.spec import load_microbench_spec

    suite = load_microbench_spec("recipes/microbench/llama3-8b-hopper.yaml")
    out_dir.mkdir(parents=True, exist_ok=True)
    smi_path = out_dir / "smi.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "50"], stdout=smi_path.open("w"))
    windows = []
    try:
        for case in cases:
            launches = {}
            for name in impls:
                try:  # builds the case's batch, checks the implementation on it, runs it once
                    launches[name] = run_for_profiler(suite, case, name, "cuda", repeat=1).run
                except (ValueError, KeyError) as e:
                    raise click.UsageError(f"--case {case} --impl {name}: {e}") from None
            for rnd in range(rounds):
                for name, launch in launches.items():
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0, launches = time.time(), 0
                    start.record()
                    while time.time() - t0 < seconds:
                        for _ in range(50):
                            launch()
                        launches += 50
                        torch.cuda.synchronize()
                    end.record()
                    torch.cuda.synchronize()
                    windows.append((case, name, rnd, t0, time.time(), start.elapsed_time(end) * 1e3 / launches))
                    time.sleep(1.0)  # let the clock settle between windows
    finally:
        smi.terminate()
        smi.wait()
    samples = _samples(smi_path)
    with (out_dir / "windows.csv").open("w") as f:
        f.write("case,implementation,round,us_per_launch,sm_clock_mhz,power_w,throttle_reasons\n")
        for case, name, rnd, t0, t1, us in windows:
            sel = [s for s in samples if t0 + 0.5 < s[0] < t1]  # past the first half second
            clock = sum(s[1] for s in sel) / max(len(sel), 1)
            power = sum(s[2] for s in sel) / max(len(sel), 1)
            reasons = sel[len(sel) // 2][3] if sel else ""
            f.write(f"{case},{name},{rnd},{us:.1f},{clock:.0f},{power:.0f},{reasons}\n")
            click.echo(f"{case:24s} {name:16s} round {rnd}: {us:8.1f} us  SM {clock:5.0f} MHz  {power:4.0f} W  {reasons}")


if __name__ == "__main__":
    main()
