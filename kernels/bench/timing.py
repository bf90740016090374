"""Timing a callable on the device: ``triton.testing.do_bench`` on a GPU (median and
p20/p80 in microseconds; do_bench flushes L2 before every run), the wall clock under the CPU
interpreter (so the pipeline runs anywhere; not a kernel speed), and CUDA/HIP-graph replays."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from triton.testing import do_bench


def time_us(fn: Callable, warmup_ms: float, rep_ms: float, device: torch.device) -> tuple[float, float, float]:
    """(median, p20, p80) in microseconds."""
    if device.type == "cuda":
        med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
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


def time_graph_us(fn: Callable, warmup_ms: float, rep_ms: float) -> tuple[float, float, float]:
    """Capture one call of ``fn`` in a CUDA/HIP graph and time its replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_us(graph.replay, warmup_ms, rep_ms, torch.device("cuda"))
