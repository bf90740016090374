"""How long this GPU takes to read the bytes of each decode case, and nothing else: the
floor a memory-bound kernel of that size can reach under the microbenchmark's timing.

`attnbench microbench` puts every case against its roofline floor, bytes over the
bandwidth of a 2 GiB device copy. A short kernel cannot reach that bandwidth: the launch,
the ramp until enough requests are in flight and the last wave's tail are a fixed cost
that a 2 GiB copy hides and a 33.6 MB read does not. This times a plain streaming read of
each decode case's K/V bytes (a Triton kernel that sums its elements, every byte read
once and checked, one fp32 partial stored per program so the loads cannot be dropped), best over
launch shapes (one tile per program: 2-64 KiB tiles; persistent: 1-8 programs per SM),
eager and CUDA graph, under do_bench's zeroing L2 flush and the clean (read) flush, and
prints each as us and as the share of the roofline floor it reaches, with the copy
ceiling measured in the same run. A kernel that has to read those bytes cannot do better
than this row; one at 60% of the floor where a bare read reaches 65% is near its limit.

    python3 docs/perf/read_floor.py OUT.csv      (GPU host; `. docs/perf/gpu-setup.sh` first)
"""
from __future__ import annotations

import csv
import itertools
from pathlib import Path

import click
import triton
import triton.language as tl

HEAD_SIZE, BYTES_PER_ELEMENT = 128, 2  # Llama-3-8B heads in bf16, as recipes/microbench/llama3-8b-roofline.yaml
DECODE_CASES = {  # name: (sequences, context tokens, KV heads) of that suite's decode cases
    "mqa-decode-b16-ctx4k": (16, 4096, 1),
    "decode-b1-ctx16k": (1, 16384, 8),
    "decode-b4-ctx16k": (4, 16384, 8),
    "decode-b32-ctx4k": (32, 4096, 8),
    "decode-b128-ctx4k": (128, 4096, 8),
}


def kv_bytes(sequences: int, context: int, kv_heads: int) -> int:
    """Bytes of K and V a decode step of these sequences reads (Q and O are < 0.1% here)."""
    return sequences * context * kv_heads * HEAD_SIZE * BYTES_PER_ELEMENT * 2


@triton.jit
def read_tiles_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    # One program per BLOCK elements: load them, store their sum.
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def read_persistent_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, NUM_STAGES: tl.constexpr):
    # A fixed grid; each program strides over the tiles, NUM_STAGES loads in flight.
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for tile in tl.range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0), num_stages=NUM_STAGES):
        offs = tile * BLOCK + tl.arange(0, BLOCK)  # < 2**31: the largest case has 2**30 elements
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def read_launches(x, programs_per_sm=(1, 2, 4, 8), num_sms: int = 132):
    """(label, callable, partials) for every launch shape: each callable reads all of ``x``
    once and leaves per-program sums in ``partials`` (their total is ``x``'s sum)."""
    import torch

    n = x.numel()
    out = []
    for block, warps in itertools.product((1024, 2048, 4096, 8192, 16384, 32768), (4, 8)):
        grid = triton.cdiv(n, block)
        partials = torch.empty(grid, dtype=torch.float32, device=x.device)
        out.append((f"tiles {block * x.element_size() // 1024} KiB, {warps} warps",
                    lambda b=block, w=warps, g=grid, p=partials: read_tiles_kernel[(g,)](x, p, n, BLOCK=b, num_warps=w),
                    partials))
    for per_sm, block, stages in itertools.product(programs_per_sm, (2048, 4096), (2, 4)):
        grid = min(per_sm * num_sms, triton.cdiv(n, block))
        partials = torch.empty(grid, dtype=torch.float32, device=x.device)
        out.append((f"persistent {per_sm}/SM, {block * x.element_size() // 1024} KiB, {stages} stages",
                    lambda b=block, s=stages, g=grid, p=partials: read_persistent_kernel[(g,)](
                        x, p, n, BLOCK=b, NUM_STAGES=s, num_warps=8),
                    partials))
    return out


def random_small_integers(elements: int, device):
    """bf16 values in -3..3, drawn at random (no memory compression can shrink them): their
    fp32 sums stay exact in any order, so a read that misses a byte shows."""
    import torch

    return torch.randint(-3, 4, (elements,), dtype=torch.int8, device=device).to(torch.bfloat16)


def check_read(x, launch, partials) -> None:
    """Run ``launch`` once; its partial sums must total ``x``'s sum exactly."""
    launch()
    got, expected = partials.double().sum().item(), x.double().sum().item()
    if got != expected:
        raise ValueError(f"the read kernel summed {got}, torch {expected}: it did not read every element once")


@click.command(help=__doc__)
@click.argument("out_csv", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--case", "cases", multiple=True, type=click.Choice(list(DECODE_CASES)),
              help="Decode case whose bytes to read (repeatable); default all.")
def main(out_csv: Path, cases: tuple[str, ...]) -> None:
    import torch

    from attnbench.kernels.bench.microbench import environment, measure_ceilings
    from attnbench.kernels.bench.timing import time_graph_us, time_us

    device = torch.device("cuda")
    env = environment(device)
    ceilings = measure_ceilings(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    click.echo(f"{env['device']}, torch {env['torch']}, triton {env['triton']}; "
               f"copy ceiling {ceilings.copy_bytes_s / 1e9:.0f} GB/s")
    rows = []
    for case in cases or DECODE_CASES:
        size = kv_bytes(*DECODE_CASES[case])
        x = random_small_integers(size // BYTES_PER_ELEMENT, device)
        floor_us = size / ceilings.copy_bytes_s * 1e6
        for label, launch, partials in read_launches(x, num_sms=sms):
            try:
                check_read(x, launch, partials)
            except ValueError as e:
                raise click.ClickException(f"{case}, {label}: {e}") from None
            for flush in ("zero", "read"):
                eager = time_us(launch, 25, 100, device, flush)[0]
                graph = time_graph_us(launch, 25, 100, flush)[0]
                rows.append({"case": case, "bytes": size, "launch": label, "l2_flush": flush,
                             "eager_us": round(eager, 2), "graph_us": round(graph, 2), "floor_us": round(floor_us, 2),
                             "copy_gb_s": round(ceilings.copy_bytes_s / 1e9), **env})
        del x
    with out_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    click.echo("| case | MB | floor us | best read, zero flush | best read, read flush | launch (zero) |")
    click.echo("|---|---|---|---|---|---|")
    for case in dict.fromkeys(r["case"] for r in rows):
        best = {flush: min((r for r in rows if r["case"] == case and r["l2_flush"] == flush), key=_best_us)
                for flush in ("zero", "read")}
        floor_us = best["zero"]["floor_us"]
        cells = [f"{_best_us(best[f]):.1f} us ({floor_us / _best_us(best[f]):.0%})" for f in ("zero", "read")]
        click.echo(f"| {case} | {best['zero']['bytes'] / 1e6:.1f} | {floor_us:.1f} | {cells[0]} | {cells[1]} "
                   f"| {best['zero']['launch']} |")


def _best_us(row: dict) -> float:
    """The better of a row's eager and graph medians, us."""
    return min(row["eager_us"], row["graph_us"])


if __name__ == "__main__":
    main()
