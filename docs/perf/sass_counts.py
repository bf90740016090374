"""Executed instructions and stall samples per SASS opcode, from Nsight Compute's source page.

Reads the ``*-sass.csv.gz`` files that the ``ncu`` campaign job keeps (`ncu --page source
--csv`: one row per SASS instruction, with its executed count and sampled stalls) and
compares kernels side by side: for each opcode, executed warp instructions divided by
``--per`` (e.g. tiles x consumer warps, to read them per tile) and the stall samples on it.
Takes, from each file, the kernel that executed the most instructions (FA3's files also
hold its small scheduling kernel).

    python3 docs/perf/sass_counts.py h100/ncu-2026-11-24/prefill-b4-2k-auto-page-copies-sass.csv.gz \\
        h100/ncu-2026-11-24/prefill-b4-2k-fa3-sass.csv.gz --per 139264
"""
from __future__ import annotations

import collections
import csv
import gzip
import re
from pathlib import Path

import click

OPCODE = re.compile(r"\s*(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def main_kernel(path: Path) -> list[dict]:
    """The rows of the kernel in ``path`` that executed the most instructions."""
    kernels: dict[str, list[dict]] = {}
    name, header = None, None
    with gzip.open(path, "rt") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                name, header = row[1], None
                kernels[name] = []
            elif row and row[0] == "Address":
                header = row
            elif name and header:
                kernels[name].append(dict(zip(header, row)))
    if not kernels:
        raise click.BadParameter(f"{path}: no 'Kernel Name' rows; expected ncu's source page as CSV")
    return max(kernels.values(), key=lambda rows: sum(int(r["Instructions Executed"] or 0) for r in rows))


def by_opcode(rows: list[dict]) -> tuple[collections.Counter, collections.Counter]:
    """(executed warp instructions, stall samples) per opcode."""
    executed, stalls = collections.Counter(), collections.Counter()
    for r in rows:
        m = OPCODE.match(r["Source"])
        op = m.group(1) if m else "?"
        executed[op] += int(r["Instructions Executed"] or 0)
        stalls[op] += int(r["Warp Stall Sampling (All Samples)"] or 0)
    return executed, stalls


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--per", type=float, default=1.0, show_default=True,
              help="divide executed counts by this (e.g. tiles x consumer warps)")
@click.option("--top", type=int, default=30, show_default=True, help="opcodes to list, by executed count")
def main(files: tuple[Path, ...], per: float, top: int) -> None:
    counts = [by_opcode(main_kernel(f)) for f in files]
    names = [f.name.removesuffix(".csv.gz") for f in files]
    print("executed / --per, then stall samples, per file:", ", ".join(names))
    print(f"{'total':10s} " + " ".join(f"{sum(e.values()) / per:12.1f} {sum(s.values()):8d}" for e, s in counts))
    ops = collections.Counter()
    for e, _ in counts:
        ops.update(e)
    for op, _ in ops.most_common(top):
        print(f"{op:10s} " + " ".join(f"{e[op] / per:12.1f} {s[op]:8d}" for e, s in counts))


if __name__ == "__main__":
    main()
