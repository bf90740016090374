"""`measure_repeat`: one measured load against a running server, the same for `attnbench
run` (each repeat of a suite) and `attnbench load` (a server someone else started).

Around the load it reads the server's own metrics (`witness`: TTFT, ITL, E2EL as vLLM
timed them) and, when the server's log is known, the kernel compiles it logged meanwhile
(`serverlog`); the client's event-loop lag comes from the load itself, and the CPU its
machine lost meanwhile from the kernel's counters (`host`). All of it lands in the summary
next to the client-side metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .datasets import BenchRequest
from .host import host_between, host_counters
from .loadgen import ClientStats, LoadConfig, RequestRecord
from .loadpool import run_load_processes
from .metrics import summarize
from .serverlog import LogWindow, jit_compiles
from .summary import RepeatSummary
from .witness import between, scrape


@dataclass
class Repeat:
    records: list[RequestRecord]
    summary: RepeatSummary  # metrics and witnesses; the caller adds what was measured (run or URL)


def measure_repeat(cfg: LoadConfig, requests: list[BenchRequest], offsets: list[float],
                   sink: Callable[[RequestRecord], None], *, desc: str, phase: str = "measure",
                   processes: int = 1, slo_ms: dict[str, float] | None = None,
                   server_log: Path | None = None) -> Repeat:
    """Send ``requests`` at ``offsets`` to ``cfg.base_url`` (every finished record to
    ``sink``, as it finishes) and summarize them, status included (failed when no request
    completed). Ctrl-C propagates after the sink has every record measured so far."""
    window = LogWindow(server_log) if server_log is not None else None
    before = scrape(cfg.base_url)
    host_before = host_counters()
    stats = ClientStats()
    bar = tqdm(total=len(requests), desc=desc, unit="req", leave=False, dynamic_ncols=True)
    try:
        records = run_load_processes(cfg, requests, offsets, sink, processes, phase=phase,
                                     on_done=lambda _: bar.update(1), stats=stats)
    finally:
        bar.close()
    summary = summarize(records, slo_ms, stats)
    summary["client_processes"] = processes
    summary["client_host"] = host_between(host_before, host_counters()) or None
    after = scrape(cfg.base_url) if before is not None else None
    if after is not None:
        summary["server_metrics"] = between(before, after)
    if window is not None:
        summary["jit_compiles"] = jit_compiles(window.lines())
    return Repeat(records, RepeatSummary(**summary).settled())
