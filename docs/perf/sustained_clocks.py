"""Back-to-back timing of `qblock_ws` variants with the GPU's SM clock and power beside it.

`do_bench` times single launches with an L2 flush between them; a serving GPU runs
attention back to back, where an H100 SXM sits at its power cap and lowers its clock. This
runs each variant (a module of attnbench.kernels.hopper, e.g. a patched copy dropped into
the installed package) for SECONDS back to back per case, alternating, while nvidia-smi
samples the SM clock, power and throttle reasons every 50 ms, and prints one line per
window: us per launch, mean SM clock (MHz), mean power (W).

    python3 docs/perf/sustained_clocks.py OUT_DIR --module qblock_ws --module qblock_ws_ring \\
        --case prefill-b4-2k --case prefill-b1-8k       (GPU host; `. docs/perf/gpu-setup.sh` first)
"""
from __future__ import annotations

import datetime as dt
import importlib
import subprocess
import time
from pathlib import Path

import click
from hopper_cases import hopper_cases, persistent_launch


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
@click.option("--module", "modules", multiple=True, required=True, help="Module of attnbench.kernels.hopper.")
@click.option("--case", "cases", multiple=True, required=True, help="Case of llama3-8b-hopper.yaml.")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="Length of each window.")
@click.option("--rounds", type=int, default=2, show_default=True, help="Windows per variant and case.")
def main(out_dir: Path, modules: tuple[str, ...], cases: tuple[str, ...], seconds: float, rounds: int) -> None:
    import torch

    from attnbench.kernels.bench.microbench import build_batch

    suite, chosen = hopper_cases(cases, "--case")
    out_dir.mkdir(parents=True, exist_ok=True)
    smi_path = out_dir / "smi.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
                            "--format=csv,noheader", "-lms", "50"], stdout=smi_path.open("w"))
    windows = []
    try:
        for case, spec in chosen.items():
            b = build_batch(suite, spec, torch.device("cuda"), 0)
            out = torch.empty_like(b.q)
            for rnd in range(rounds):
                for name in modules:
                    launch = persistent_launch(importlib.import_module(f"attnbench.kernels.hopper.{name}"), b, out)
                    launch()
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
        f.write("case,module,round,us_per_launch,sm_clock_mhz,power_w,throttle_reasons\n")
        for case, name, rnd, t0, t1, us in windows:
            sel = [s for s in samples if t0 + 0.5 < s[0] < t1]  # past the first half second
            clock = sum(s[1] for s in sel) / max(len(sel), 1)
            power = sum(s[2] for s in sel) / max(len(sel), 1)
            reasons = sel[len(sel) // 2][3] if sel else ""
            f.write(f"{case},{name},{rnd},{us:.1f},{clock:.0f},{power:.0f},{reasons}\n")
            click.echo(f"{case:24s} {name:16s} round {rnd}: {us:8.1f} us  SM {clock:5.0f} MHz  {power:4.0f} W  {reasons}")


if __name__ == "__main__":
    main()
