"""Timing a callable on the device: ``triton.testing.do_bench`` on a GPU (median and
p20/p80 in microseconds; do_bench flushes L2 before every run), the wall clock under the CPU
interpreter (so the pipeline runs anywhere; not a kernel speed), and CUDA/HIP-graph replays.

do_bench flushes L2 by zeroing a 256 MiB buffer, so every timed call starts with an L2 full
of dirty lines and pays their write-back to memory (up to the L2's size, ~50 MB on an H100)
on top of its own traffic: a constant cost that weighs most on short memory-bound kernels.
``l2_flush="read"`` times the same way but flushes by reading that buffer, ``"none"`` does
not flush at all: each call finds in L2 what the one before it read, its own data wherever
that fits (an H100 reads MQA decode's 33.6 MB in 6.4 us from L2 against 20 us from memory),
as a benchmark that times calls back to back does (`event_bench`; graph replays: several
calls per graph, `time_graph_us`)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from triton.testing import do_bench

from ..schema import L2_FLUSHES


FLUSH_BYTES = 256 * 2**20  # do_bench's flush buffer: several times the L2 of any GPU here


def event_bench(fn: Callable, warmup_ms: float, rep_ms: float,
                flush: Callable[[], object] | None) -> tuple[float, float, float]:
    """do_bench's method with another flush: (median, p20, p80) in milliseconds.

    As do_bench: five calls (each after a flush) estimate the time per call, which sets the
    warm-up and repeat counts for ``warmup_ms`` and ``rep_ms``; each repeat runs ``flush``,
    then times one call between two events. The flush kernel also keeps the GPU busy while
    the host queues the call, so the events time the call and not the host's launch. With
    ``flush=None`` a spin kernel does that instead (`hold_stream`: no memory traffic, so the
    call finds L2 as the last call left it).
    """
    flush = flush or hold_stream
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = start.elapsed_time(end) / 5
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    n = max(1, int(rep_ms / estimate_ms))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)], dtype=torch.float64)
    med, p20, p80 = torch.quantile(times, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64)).tolist()
    return med, p20, p80


HOLD_CYCLES = 200_000  # ~0.1 ms of spinning at the H100's clocks: about as long as do_bench's flush


def hold_stream() -> None:
    """Spin one GPU thread for `HOLD_CYCLES` clock cycles, touching no memory: the stream
    stays busy while the host queues the next call, and L2 keeps what it holds."""
    torch.cuda._sleep(HOLD_CYCLES)


def read_flush() -> Callable[[], object]:
    """A flush that reads (sums) a `FLUSH_BYTES` buffer: L2 is left holding clean lines of
    that buffer and none of the timed call's data."""
    flush_buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return flush_buf.sum


def time_us(fn: Callable, warmup_ms: float, rep_ms: float, device: torch.device,
            l2_flush: str = "zero") -> tuple[float, float, float]:
    """(median, p20, p80) in microseconds; ``l2_flush`` is "zero" (do_bench), "read" or
    "none" (`event_bench`) on a GPU, and has no meaning under the interpreter."""
    if l2_flush not in L2_FLUSHES:
        raise ValueError(f"l2_flush: expected one of {L2_FLUSHES}, got {l2_flush!r}")
    if device.type == "cuda":
        if l2_flush == "zero":
            med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
        else:
            med, p20, p80 = event_bench(fn, warmup_ms, rep_ms, read_flush() if l2_flush == "read" else None)
        return med * 1e3, p20 * 1e3, p80 * 1e3
    # CPU (Triton interpreter): wall clock, so the pipeline runs anywhere; not a kernel speed
    samples = []
    deadline = time.perf_counter() + rep_ms * 1e-3
    while len(samples) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    q = statistics.quantiles(samples, n=10, method="inclusive")
    return statistics.median(samples), q[1], q[7]


# calls captured back to back in one graph when timing without a flush (`time_graph_us`)
WARM_GRAPH_CALLS = 20


def time_graph_us(fn: Callable, warmup_ms: float, rep_ms: float, l2_flush: str = "zero") -> tuple[float, float, float]:
    """Capture ``fn`` in a CUDA/HIP graph and time its replays (as `time_us`), per call.

    With a flush the graph holds one call. Without one (``"none"``) it holds
    `WARM_GRAPH_CALLS` calls back to back and a replay's time is divided by their number,
    as `triton.testing.do_bench_cudagraph` times: each call finds the last one's data in L2
    and starts as soon as the last one ends, with no host launch or event between them.
    """
    calls = WARM_GRAPH_CALLS if l2_flush == "none" else 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    med, p20, p80 = time_us(graph.replay, warmup_ms, rep_ms, torch.device("cuda"), l2_flush)
    return med / calls, p20 / calls, p80 / calls
