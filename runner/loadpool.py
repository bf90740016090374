"""One load spread over several client processes, each with its own event loop.

A single Python event loop parses a few tens of thousands of chunks per second; at
hundreds of synchronized streams its backlog of ready reads delays a new request's first
chunk by milliseconds (docs/perf/loadgen-calibration.md). `run_load_processes` deals the
requests round-robin to ``processes`` forked workers. They start together on one clock
(``time.perf_counter`` is CLOCK_MONOTONIC on Linux, shared by every process), run
`loadgen.run_load` on their share, and send each finished record back here, where it goes
to the sink exactly as with one process. ``max_concurrency`` is split between the workers
(a global limit of 10 over 3 processes becomes 4 + 3 + 3).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from .datasets import BenchRequest
from .loadgen import ClientStats, LoadConfig, RequestRecord, run_async, run_load

_DONE = "done"  # a worker's last message
_DRAIN_AFTER_INTERRUPT_S = 10.0
_START_MARGIN_S = 0.1  # from "all workers ready" to t0: time for each worker to wake up


# `client_processes: auto`, from `attnbench calibrate` on a 16-core H100 host
# (docs/perf/loadgen-calibration.md): at 256 paced streams every count from 1 to 8 keeps
# the added p99 TTFT within 5 ms (1.9-2.3 ms with the current client); at 1,024 streams 2
# processes do (3.9 ms) and 8 with the most margin (2.1 ms), while one process falls a
# whole pace behind (75.9 ms)
STREAMS_PER_PROCESS = 128
MAX_AUTO_PROCESSES = 8


def auto_processes(streams: int, cpus: int | None = None) -> int:
    """Client processes for a load with up to ``streams`` requests in flight: one per
    `STREAMS_PER_PROCESS`, at most `MAX_AUTO_PROCESSES` and at most half the host's CPUs
    (a single-node run shares the host with the server)."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(-(-streams // STREAMS_PER_PROCESS), MAX_AUTO_PROCESSES, cpus // 2))


def resolve_processes(setting: int | str, num_requests: int, max_concurrency: int | None) -> int:
    """A ``client_processes`` setting as a count; ``"auto"`` by `auto_processes` for the most
    requests the load can have in flight."""
    if setting != "auto":
        return int(setting)
    return auto_processes(min(max_concurrency or num_requests, num_requests))


def concurrency_shares(limit: int | None, processes: int) -> list[int | None]:
    """``limit`` split as evenly as possible over ``processes`` (None: no limit)."""
    if limit is None:
        return [None] * processes
    return [limit // processes + (1 if w < limit % processes else 0) for w in range(processes)]


def _worker(cfg: LoadConfig, requests: list[BenchRequest], offsets: list[float], indices: list[int],
            phase: str, out: mp.Queue, ready, go, start) -> None:
    def wait_for_start() -> float:  # called by run_load with its HTTP session open
        ready.wait()
        go.wait()
        return start.value

    stats = ClientStats()
    try:
        run_async(run_load(cfg, requests, offsets, out.put, phase=phase, start=wait_for_start, indices=indices,
                           stats=stats))
    except KeyboardInterrupt:
        pass  # run_load has handed the interrupted requests to the sink
    finally:
        out.put((_DONE, stats.loop_lag_ms))


def run_load_processes(cfg: LoadConfig, requests: list[BenchRequest], offsets: Iterable[float],
                       sink: Callable[[RequestRecord], None], processes: int, phase: str = "measure",
                       on_done: Callable[[RequestRecord], None] | None = None,
                       stats: ClientStats | None = None) -> list[RequestRecord]:
    """`run_load` over ``processes`` client processes (1: in this process); returns the
    records in request order; ``stats`` gathers every process's event-loop lag. Ctrl-C
    stops the workers, hands what they measured to the sink and re-raises."""
    offsets = list(offsets)
    n = len(requests)
    processes = max(1, min(processes, n, cfg.max_concurrency or n))
    if processes == 1:
        return run_async(run_load(cfg, requests, offsets, sink, phase=phase, on_done=on_done, stats=stats))

    ctx = mp.get_context("fork")  # the workers inherit everything loaded; nothing is re-imported
    out, ready, go, start = ctx.Queue(), ctx.Barrier(processes + 1), ctx.Event(), ctx.Value("d", 0.0)
    shares = [list(range(w, n, processes)) for w in range(processes)]
    workers = [
        ctx.Process(target=_worker, daemon=True, name=f"attnbench-load-{w}", args=(
            replace(cfg, max_concurrency=limit), [requests[i] for i in share], [offsets[i] for i in share],
            share, phase, out, ready, go, start))
        for w, (share, limit) in enumerate(zip(shares, concurrency_shares(cfg.max_concurrency, processes)))]
    for w in workers:
        w.start()
    records: list[RequestRecord | None] = [None] * n

    def take(item) -> bool:
        if isinstance(item, tuple) and item[0] == _DONE:
            if stats is not None:
                stats.loop_lag_ms += item[1]
            return True
        records[item.index] = item
        sink(item)
        if on_done:
            on_done(item)
        return False

    finished = 0

    def drain(deadline: float = float("inf")) -> None:
        """Take records until every worker has said it is done (or ``deadline``, monotonic s)."""
        nonlocal finished
        while finished < processes and time.monotonic() < deadline:
            try:
                finished += take(out.get(timeout=0.5))
            except queue_mod.Empty:
                if not any(w.is_alive() for w in workers):
                    return  # a worker died without its last message

    try:
        ready.wait()  # every worker is up: start the schedule on one clock
        start.value = time.perf_counter() + _START_MARGIN_S
        go.set()
        drain()
    except KeyboardInterrupt:
        for w in workers:
            if w.is_alive():
                os.kill(w.pid, signal.SIGINT)
        drain(time.monotonic() + _DRAIN_AFTER_INTERRUPT_S)
        raise
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
                w.join()
    for i, r in enumerate(records):
        if r is None:  # its worker died before reporting it
            records[i] = RequestRecord(i, phase, requests[i].prompt_len, requests[i].output_len,
                                       scheduled_s=offsets[i], status="error", error="client process died")
    return records
