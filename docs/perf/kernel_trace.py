"""Clock trace of `qblock_ws` (persistent, 128-key tiles): where each work item's time goes.

Run on an sm_90 GPU with the kernel patched by h100/clock-trace.patch (`kernel-trace.sh`
does both); every partition of every program stamps the SM clock (``%clock64``) at the
seams of each of its items. Prints, per case, the mean time of each phase of an item for
one consumer and how evenly the programs' tiles and durations came out.

    python3 docs/perf/kernel_trace.py run OUT_DIR CASE...     (GPU; writes OUT_DIR/trace-CASE.npy)
    python3 docs/perf/kernel_trace.py show FILE.npy...        (anywhere with numpy)

Times in us at ``--mhz`` (default 1755: an H100 SXM's SM clock under load; the stamps
count cycles, so ratios between phases and cases do not depend on it).
"""
from __future__ import annotations

import click
import numpy as np

ROUNDS, PARTS, EVENTS = 40, 3, 10  # the patch's trace layout: [program, round, partition, event]
# consumer events: 0 item start, 1 its metadata found, 2 its Q rows stored to shared memory
# (the loads landed), 3 ... visible to the tensor cores, 4 first K tile ready, 5 first S done,
# 6 loop done, 7 last P V done, 8 O stored; slot 9 holds the item's tile count
TILES = 9
PHASES = [("metadata", 0, 1), ("Q loaded", 1, 2), ("Q fenced", 2, 3), ("first K wait", 3, 4),
          ("first S", 4, 5), ("tile loop", 5, 6), ("last P V", 6, 7), ("O epilogue", 7, 8)]
END = 8


@click.group(help=__doc__)
def main() -> None:
    pass


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False, exists=True))
@click.argument("cases", nargs=-1, required=True)
def run(out_dir: str, cases: tuple[str, ...]) -> None:
    """Trace CASES of llama3-8b-hopper.yaml (GPU, patched kernel) into OUT_DIR/trace-CASE.npy:
    `qblock_ws_persistent`, checked against the fp32 reference, then one launch traced."""
    import torch

    import attnbench.kernels.hopper.qblock_ws as ws
    from attnbench.kernels.bench.microbench import run_for_profiler
    from attnbench.kernels.bench.spec import load_microbench_spec

    suite = load_microbench_spec("recipes/microbench/llama3-8b-hopper.yaml")
    for name in cases:
        try:
            prepared = run_for_profiler(suite, name, "qblock_ws_persistent", "cuda", repeat=1)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        ws.TRACE.zero_()  # an earlier case's programs may have had more rounds
        prepared.run()
        torch.cuda.synchronize()
        np.save(f"{out_dir}/trace-{name}.npy", ws.TRACE.view(-1, ROUNDS, PARTS, EVENTS).cpu().numpy())


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--mhz", type=float, default=1755.0, show_default=True, help="SM clock: cycles per us.")
def show(files: tuple[str, ...], mhz: float) -> None:
    """Per-item phases and the programs' balance of traces written by `run`."""
    for path in files:
        _show(path, mhz)


def _show(path: str, mhz: float) -> None:
    t = np.load(path).astype(np.int64)
    phases = {name: [] for name, _, _ in PHASES}
    tiles, durations = [], []
    for prog in t:
        c0 = prog[:, 0, :]
        rounds = np.flatnonzero(c0[:, 0])
        if not len(rounds):
            continue
        tiles.append(int(c0[rounds, TILES].sum()))
        durations.append((prog[rounds, :2, END].max() - c0[rounds[0], 0]) / mhz)
        for r in rounds:
            if c0[r, TILES] > 0:
                for name, a, b in PHASES:
                    phases[name].append((c0[r, b] - c0[r, a]) / mhz)
    tiles, durations = np.array(tiles), np.array(durations)
    seam, shared = _seams(t, mhz)
    print(f"== {path}: {len(tiles)} programs, us at {mhz:.0f} MHz")
    print(f"  {'phase (consumer 0)':20s} {'mean us/item':>12s} {'total us/program':>16s}")
    for name, v in phases.items():
        print(f"  {name:20s} {np.mean(v):12.3f} {np.sum(v) / len(tiles):16.1f}")
    print(f"  tiles per program: min {tiles.min()} mean {tiles.mean():.1f} max {tiles.max()}; "
          f"duration: mean {durations.mean():.1f} max {durations.max():.1f} us")
    print(f"  seam (loop done -> next item's first S): {seam:.2f} us, of which both consumers "
          f"are in theirs {shared:.2f} us ({100 * shared / seam:.0f}%)")


def _seams(t: np.ndarray, mhz: float) -> tuple[float, float]:
    """Mean length of consumer 0's seam between two items with tiles, and how much of it
    consumer 1 spends in its own seam at the same time (us)."""
    seams, shared = [], []
    for prog in t:
        rounds = np.flatnonzero(prog[:, 0, 0])
        for a, b in zip(rounds[:-1], rounds[1:]):
            if prog[a, 0, TILES] and prog[b, 0, TILES]:
                (s0, e0), (s1, e1) = ((prog[a, h, 6], prog[b, h, 5]) for h in (0, 1))
                seams.append((e0 - s0) / mhz)
                shared.append(max(0, min(e0, e1) - max(s0, s1)) / mhz)
    return float(np.mean(seams)), float(np.mean(shared))


if __name__ == "__main__":
    main()
