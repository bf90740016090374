"""`measure_repeat`: one measured load against a running server, the same for `attnbench
run` (each repeat of a suite) and `attnbench load` (a server someone else started).

Around the load it reads the server's own metrics (`witness`: TTFT, ITL, E2EL as vLLM
timed them) and, when the server's log is known, the kernel compiles it logged meanwhile
(`serverlog`); the client's event-loop lag comes from the load itself, and the CPU its
machine lost meanwhile from the kernel's counters (`host`), and, given a meter, the energy
the server's GPUs used (`energy`). All of it lands in the summary next to the client-side
metrics (`summary.summarize_repeat`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .datasets import BenchRequest
from .energy import EnergyMeter
from .host import host_between, host_counters
from .loadgen import ClientStats, LoadConfig, RequestRecord, run_async
from .loadpool import run_load_processes
from .multiturn import ConversationLoad, run_conversations
from .serverlog import LogWindow, jit_compiles
from .slo import Slo
from .store import RecordWriter
from .summary import RepeatHeader, RepeatSummary, Witnesses, summarize_repeat, utc_now
from .witness import between, scrape


@dataclass
class Repeat:
    records: list[RequestRecord]
    summary: RepeatSummary


def measure_repeat(cfg: LoadConfig, requests: list[BenchRequest], offsets: list[float], writer: RecordWriter,
                   header: RepeatHeader, *, desc: str, phase: str = "measure", processes: int = 1,
                   slo_ms: dict[str, float] | None = None, slo: Slo | None = None, server_log: Path | None = None,
                   meter: EnergyMeter | None = None, conversations: ConversationLoad | None = None,
                   shared_server: bool = False) -> Repeat:
    """Send ``requests`` at ``offsets`` to ``cfg.base_url`` (every finished record to
    ``writer``, as it finishes) and summarize them under ``header``, with the load's start
    and end times (and ``meter``'s reading of the GPUs' energy over the load, its idle
    power sampled first). ``conversations`` replaces ``requests`` and ``offsets`` with a
    multi-turn load (runner/multiturn.py, in this process). ``shared_server``: other
    clients load the server meanwhile on purpose, so its metrics may count more work than
    this load's (otherwise that makes the repeat degraded: `summary.summarize_repeat`).
    Ctrl-C propagates after the writer has every record measured so far."""
    window = LogWindow(server_log) if server_log is not None else None
    before = scrape(cfg.base_url)
    host_before = host_counters()
    stats = ClientStats()
    started = utc_now()
    bar = tqdm(total=conversations.turns if conversations else len(requests), desc=desc, unit="req", leave=False,
               dynamic_ncols=True)
    try:
        with meter if meter is not None else nullcontext():
            if conversations is not None:
                processes = 1
                records = run_async(run_conversations(
                    cfg, conversations.conversations, writer, concurrent=conversations.concurrent,
                    think_time_s=conversations.think_time_s, phase=phase, on_done=lambda _: bar.update(1), stats=stats))
            else:
                records = run_load_processes(cfg, requests, offsets, writer, processes, phase=phase,
                                             on_done=lambda _: bar.update(1), stats=stats)
    finally:
        bar.close()
    after = scrape(cfg.base_url) if before is not None else None
    witnesses = Witnesses(server_metrics=between(before, after) if after is not None else None,
                          jit_compiles=jit_compiles(window.lines()) if window is not None else None,
                          client_processes=processes,
                          client_host=host_between(host_before, host_counters()) or None,
                          energy=meter.reading() if meter is not None else None)
    header = header.model_copy(update={"started_at": started, "finished_at": utc_now()})
    return Repeat(records, summarize_repeat(records, header, witnesses=witnesses, digest=writer.digest(),
                                            slo_ms=slo_ms, slo=slo, loop_lag_ms=stats.loop_lag_ms,
                                            shared_server=shared_server))
