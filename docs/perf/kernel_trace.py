"""Clock trace of `qblock_ws` (persistent, 128-key tiles): where each work item's time goes.

Run on an sm_90 GPU with the kernel patched by h100/clock-trace.patch (`kernel-trace.sh`
does both); every partition of every program stamps the SM clock (``%clock64``) at the
seams of each of its items, and each consumer at the end of each phase of a tile-loop
iteration for the program's first 64 tiles. Prints, per case, the mean time of each phase
of an item for one consumer, how evenly the programs' tiles and durations came out, and
the phases of a loop iteration for both consumers.

    python3 docs/perf/kernel_trace.py run OUT_DIR CASE...     (GPU; writes OUT_DIR/trace-CASE.npy
                                                               and trace-CASE-loop.npy)
    python3 docs/perf/kernel_trace.py show FILE.npy...        (anywhere with numpy)

Times in us at ``--mhz`` (default 1755: an H100 SXM's SM clock under load; the stamps
count cycles, so ratios between phases and cases do not depend on it).
"""
from __future__ import annotations

import os

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
# the loop's stamps (the patch's second region): [program, tile, consumer, event] for each
# program's first `LOOP_TILES` tiles (the patch's constants), at the end of each phase of a
# loop iteration
LOOP_PHASES = ["waits (K_j, V_j-1)", "S_j issued, done", "softmax of S_j", "P V_j-1 done, P_j"]


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
        trace = ws.TRACE.cpu().numpy()
        loop_shape = (ws.NUM_PROGRAMS, ws.LOOP_TILES.value, 2, ws.LOOP_EVENTS.value)
        items = trace.size - int(np.prod(loop_shape))
        np.save(f"{out_dir}/trace-{name}.npy", trace[:items].reshape(-1, ROUNDS, PARTS, EVENTS))
        np.save(f"{out_dir}/trace-{name}-loop.npy", trace[items:].reshape(loop_shape))


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--mhz", type=float, default=1755.0, show_default=True, help="SM clock: cycles per us.")
def show(files: tuple[str, ...], mhz: float) -> None:
    """Per-item phases and the programs' balance of traces written by `run`."""
    for path in files:
        _show(path, mhz)
        loop = path.removesuffix(".npy") + "-loop.npy"
        if os.path.exists(loop):
            _show_loop(loop, mhz)


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


def _show_loop(path: str, mhz: float) -> None:
    """Per-iteration phases of the tile loop (tiles 2..n-1 of an item: those whose previous
    tile also ran in the loop), each consumer's, and how long the two consumers run their
    softmax at the same time."""
    t = np.load(path).astype(np.int64)  # [program, tile, consumer, event]
    done = (t > 0).all(axis=3)  # stamped: the tile ran in a loop iteration
    follows = done[:, 1:] & done[:, :-1]  # ... right after another loop iteration
    print(f"  loop phases, us per iteration ({int(follows[..., 0].sum())} iterations of consumer 0):")
    for half in (0, 1):
        cur, prev = t[:, 1:, half][follows[..., half]], t[:, :-1, half][follows[..., half]]
        ends = np.column_stack([prev[:, -1], cur])
        means = np.diff(ends, axis=1).mean(axis=0) / mhz
        print(f"    consumer {half}: " + ", ".join(f"{n} {m:.3f}" for n, m in zip(LOOP_PHASES, means))
              + f"; tile {means.sum():.3f}")
    both = done[..., 0] & done[..., 1]
    s0, e0, s1, e1 = t[..., 0, 1][both], t[..., 0, 2][both], t[..., 1, 1][both], t[..., 1, 2][both]
    shared = np.clip(np.minimum(e0, e1) - np.maximum(s0, s1), 0, None)
    print(f"    both consumers in their softmax: {shared.mean() / mhz:.3f} us of consumer 0's "
          f"{(e0 - s0).mean() / mhz:.3f}")


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
