"""`attnbench run`: for each run of a suite, start its server, warm up, measure the repeats,
stop the server.

Consecutive runs whose model and serve settings are equal (the points of a matrix over
benchmark settings, e.g. the Fig. 9 output lengths) share one server: its start-up (about
100 s on a GPU: weights, torch.compile, CUDA-graph capture) is paid once. Each run still
does its own warm-up; its provenance names the run whose folder holds the server log.

Failure rules: a server that does not start marks that run's pending repeats failed (with
the log tail) and the suite goes on; a server that dies mid-repeat marks that repeat and
the run's later repeats failed, keeps the earlier ones, and the suite goes on; a server
that hangs is found by the load's read-idle timeout (the repeat is ``degraded``) and by
``/health`` before the next repeat (the rest fail, and the next run starts a new server);
Ctrl-C stops the server, marks the repeat ``interrupted`` with what was measured so far,
and exits. Every request record is on disk the moment it finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import provenance
from .catalogue import ITL, OUTPUT_THROUGHPUT, REQUEST_THROUGHPUT, TOTAL_TOKEN_THROUGHPUT, TTFT
from .datasets import DatasetError, build_requests
from .energy import EnergyMeter, server_gpus
from .loadgen import LoadConfig, arrival_offsets
from .loadpool import resolve_processes
from .models import ensure_model
from .recipe import Recipe, Suite
from .server import ServerError, ServerProcess, build_launch, log_tail
from .repeat import measure_repeat
from .serverlog import cuda_graph_modes, engine_mismatch
from .store import ResultsStore, atomic_write_json, read_records
from .summary import RepeatHeader, RepeatSummary, summarize_repeat, unmeasured_repeat, utc_now
from .tasks import LOCK_FILE, RunLock, launch_key


@dataclass
class RepeatOutcome:
    """What became of one repeat in this invocation."""

    run: str
    repeat: int
    status: str  # the summary's status, or "skipped" (another process is measuring the run)
    summary: RepeatSummary | None = None
    note: str = ""  # "kept (resume)", or why it was skipped

    @classmethod
    def of(cls, summary: RepeatSummary, note: str = "") -> "RepeatOutcome":
        return cls(summary.run or "", summary.repeat or 0, summary.status, summary, note)


def repeat_header(suite: Suite, recipe: Recipe, repeat: int, session: str = "", **more) -> RepeatHeader:
    """What a suite's repeat measures: its run, the model and the load of its recipe."""
    b = recipe.benchmark
    return RepeatHeader(suite=suite.name, run=recipe.name, repeat=repeat, session=session,
                        model_id=recipe.model.name, tokenizer_id=recipe.model.tokenizer_path,
                        num_prompts=b.num_prompts, request_rate=b.request_rate, burstiness=b.burstiness,
                        max_concurrency=b.max_concurrency, recipe_hash=recipe.digest(), **more)


def _unmeasured(store: ResultsStore, header: RepeatHeader, status: str, error: str) -> RepeatOutcome:
    summary = unmeasured_repeat(header, status, error)
    store.write_summary(header.run, header.repeat, summary)
    return RepeatOutcome.of(summary)


class SharedServer:
    """The one vLLM server a suite has up at a time, reused while runs ask for the same
    launch (model + serve settings) and replaced when they ask for another or it died."""

    def __init__(self) -> None:
        self.server: ServerProcess | None = None
        self.key: str | None = None
        self.owner: str | None = None  # the run whose folder holds the server log

    def acquire(self, recipe: Recipe, log: Path, console: Console) -> ServerProcess:
        """A healthy server for ``recipe``: the running one if it fits, else a new one
        (logging to ``log``). Raises ServerError if a new one does not start."""
        key = launch_key(recipe)
        if self.server is not None and key == self.key and not server_unwell(self.server):
            console.print(f"[bold]{recipe.name}[/]: reusing the server of {self.owner}")
            return self.server
        self.close()
        plan = build_launch(recipe)
        console.print(f"[bold]{recipe.name}[/]: starting vLLM ({plan.base_url}), log {log}")
        self.server = ServerProcess(plan, log, recipe.serve.startup_timeout_s).__enter__()
        self.key, self.owner = key, recipe.name
        return self.server

    def close(self) -> None:
        if self.server is not None:
            server, self.server, self.key, self.owner = self.server, None, None, None
            server.stop()


HEALTH_WAIT_S = 10.0  # how long a server between repeats may take to answer /health


def run_recipe(suite: Suite, recipe: Recipe, store: ResultsStore, repeats: list[int],
               console: Console, servers: SharedServer, session: str = "") -> list[RepeatOutcome]:
    """Serve one recipe from ``servers`` (maybe a neighbouring run's server; the caller
    closes it) and measure the given repeats; returns one outcome per repeat. ``session``
    (the invocation's start time) is written into every summary."""
    b = recipe.benchmark
    log = store.server_log(recipe.name)

    def header(repeat: int, **more) -> RepeatHeader:
        return repeat_header(suite, recipe, repeat, session, **more)

    try:
        ensure_model(recipe.model.path, recipe.model.build)
        requests = build_requests(b.dataset, b.num_prompts, recipe.model.tokenizer_path, b.seed)
    except DatasetError as e:
        console.print(f"[red]{recipe.name}: {e}[/]")
        return [_unmeasured(store, header(r), "failed", str(e)) for r in repeats]
    offsets = arrival_offsets(len(requests), b.request_rate, b.arrival, b.burstiness, b.seed)

    try:
        server = servers.acquire(recipe, log, console)
    except ServerError as e:
        console.print(f"[red]{recipe.name}: server failed to start[/]\n{e}")
        return [_unmeasured(store, header(r), "failed", str(e)) for r in repeats]
    version, log_text = server.version(), server.log_text()
    mismatch = engine_mismatch(recipe.serve.engine, version, log_text)
    if mismatch:
        console.print(f"[red]{recipe.name}: {mismatch}[/]")
        return [_unmeasured(store, header(r), "failed", mismatch) for r in repeats]
    cfg = LoadConfig(server.plan.base_url, recipe.model.name, b.ignore_eos, b.max_concurrency,
                     b.request_timeout_s, b.idle_timeout_s, per_chunk_usage=b.per_chunk_usage)
    prov = provenance.collect(recipe, suite_source=suite.source, server_version=version,
                              image=recipe.serve.image, argv=server.plan.argv)
    prov["server_log"] = str(server.log_path.relative_to(store.suite_dir)) \
        if server.log_path.is_relative_to(store.suite_dir) else str(server.log_path)
    prov["cuda_graphs"] = cuda_graph_modes(log_text)
    prov_file = store.write_run_meta(recipe.name, recipe.model_dump(mode="json"), prov, session)
    if b.warmup_requests:
        warm = build_requests(b.warmup_dataset(), b.warmup_requests, recipe.model.tokenizer_path, b.seed + 1)
        with store.warmup_writer(recipe.name) as w:
            warmup = measure_repeat(cfg, warm, [0.0] * len(warm), w, header(0), desc=f"{recipe.name} warm-up",
                                    phase="warmup", server_log=server.log_path)
        prov["jit_compiles_in_warmup"] = warmup.summary.jit_compiles
        atomic_write_json(store.run_dir(recipe.name) / prov_file, prov)
    processes = resolve_processes(b.client_processes, len(requests), b.max_concurrency)
    s = recipe.serve
    meter = EnergyMeter.open(s.gpu_vendor, server_gpus(s.gpu_vendor, s.tensor_parallel_size, s.env))
    if meter.reader is None:
        console.print(f"[{'dim' if s.gpu_vendor == 'none' else 'yellow'}]{recipe.name}: {meter.why}; "
                      "every other metric as usual[/]")
    try:
        outcomes: list[RepeatOutcome] = []
        for i, repeat in enumerate(repeats):
            unwell = server_unwell(server)
            if unwell:
                console.print(f"[red]{recipe.name} r{repeat}: {unwell}[/]")
                outcomes += [_unmeasured(store, header(r), "failed", unwell) for r in repeats[i:]]
                break
            with store.requests_writer(recipe.name, repeat) as writer:
                try:
                    measured = measure_repeat(cfg, requests, offsets, writer, header(repeat, provenance_file=prov_file),
                                              desc=f"{recipe.name} r{repeat}", processes=processes,
                                              slo_ms=b.goodput_slo_ms, slo=b.slo, server_log=server.log_path,
                                              meter=meter)
                except KeyboardInterrupt:
                    summary = summarize_repeat(read_records(writer.path), header(repeat, provenance_file=prov_file),
                                               digest=writer.digest(), slo_ms=b.goodput_slo_ms, slo=b.slo,
                                               status="interrupted", error="interrupted (Ctrl-C)")
                    store.write_summary(recipe.name, repeat, summary)
                    raise
            summary = measured.summary
            lost_requests = summary.failed > 0
            if not server.alive() or (lost_requests and server.exits_within(2.0)):
                summary = summary.model_copy(update={"status": "failed", "error": (
                    f"vLLM server exited during the repeat (code {server.proc.returncode}); "
                    f"last log lines:\n{log_tail(server.log_path, 15)}")})
                console.print(f"[red]{recipe.name} r{repeat}: server died[/]")
            elif summary.status == "degraded":
                console.print(f"[red]{recipe.name} r{repeat}: degraded, left out of the means and measured again by "
                              f"--resume: {summary.error}[/]")
            elif summary.failed:
                console.print(f"[yellow]warning: {recipe.name} r{repeat}: {summary.failed} of "
                              f"{summary.failed + summary.completed} requests failed (metrics cover the "
                              f"{summary.completed} that completed); first error: {summary.first_error}[/]")
            if summary.jit_compiles:
                console.print(f"[yellow]warning: {recipe.name} r{repeat}: the server compiled kernels during "
                              f"the measurement (a latency spike): {summary.jit_compiles[0]}[/]")
            if meter.reader is not None and summary.energy is not None and not summary.energy.valid:
                console.print(f"[yellow]warning: {recipe.name} r{repeat}: its energy is not valid (the other "
                              f"metrics are): {summary.energy.note}[/]")
            store.write_summary(recipe.name, repeat, summary)
            outcomes.append(RepeatOutcome.of(summary))
        return outcomes
    finally:
        meter.close()


def server_unwell(server: ServerProcess) -> str:
    """Why a server cannot take the next repeat: its process is gone, or it does not answer
    ``/health`` within `HEALTH_WAIT_S` (hung: stopped, deadlocked, its GPU lost); "" when well."""
    if not server.alive():
        return "vLLM server not running"
    deadline = time.monotonic() + HEALTH_WAIT_S
    while not server.healthy():
        if time.monotonic() > deadline or not server.alive():
            return f"vLLM server does not answer {server.plan.base_url}/health within {HEALTH_WAIT_S:g} s (hung)"
        time.sleep(0.5)
    return ""


def run_suite(suite: Suite, out_root: str | Path, *, only: list[str] | None = None,
              repeats: int | None = None, resume: bool = False, overwrite: bool = False,
              console: Console | None = None) -> list[RepeatOutcome]:
    """Run (part of) a suite into ``out_root/<suite>/...``; returns every repeat's outcome.
    ``overwrite`` clears each run's folder once its lock is held (never a run another
    process is measuring)."""
    console = console or Console(width=None if Console().is_terminal else 120)
    store = ResultsStore(out_root, suite.name)
    outcomes: list[RepeatOutcome] = []
    servers = SharedServer()
    session = utc_now()
    try:
        for recipe in suite.select(only):
            lock = RunLock(store.run_dir(recipe.name))
            if not lock.acquire():  # another task measures this run right now
                console.print(f"[yellow]{recipe.name}: skipped, another process is measuring it "
                              f"({store.run_dir(recipe.name) / '.lock'})[/]")
                outcomes.append(RepeatOutcome(recipe.name, 0, "skipped", note="locked by another process"))
                continue
            try:
                if overwrite:
                    store.clear_run(recipe.name, keep=LOCK_FILE)
                todo = []
                for r in range(1, (repeats or recipe.benchmark.repeats) + 1):
                    kept, why_not = store.kept(recipe.name, r) if resume else (None, "")
                    if kept is not None:
                        outcomes.append(RepeatOutcome.of(kept, "kept (resume)"))
                        continue
                    if why_not:
                        console.print(f"[yellow]{recipe.name}: {why_not}: measuring it again[/]")
                    todo.append(r)
                if todo:
                    outcomes += run_recipe(suite, recipe, store, todo, console, servers, session)
            finally:
                lock.release()
    finally:
        servers.close()
    console.print(summary_table(suite.name, outcomes))
    return outcomes


def summary_table(suite: str, outcomes: list[RepeatOutcome]) -> Table:
    """The console's table of a suite's repeats. Run names are never cut (two runs that
    share a prefix stay apart in 80 columns); the numbers wrap instead."""
    table = Table(title=f"attnbench: {suite}")
    shown = [(REQUEST_THROUGHPUT, "{:.2f}"), (OUTPUT_THROUGHPUT, "{:.1f}"), (TOTAL_TOKEN_THROUGHPUT, "{:.1f}"),
             (TTFT, "{:.1f}"), (ITL, "{:.2f}")]
    width = max([len(o.run) for o in outcomes] + [3])
    table.add_column("run", no_wrap=True, min_width=width)
    table.add_column("r", justify="right", no_wrap=True)
    table.add_column("status", overflow="fold")
    for m, _ in shown:
        table.add_column(("median " if m.is_latency else "") + m.heading, justify="right", overflow="fold")
    table.add_column("failed", justify="right")
    table.add_column("JIT compiles", justify="right", overflow="fold")

    def f(v, fmt):
        return "-" if v is None else fmt.format(v)

    for o in outcomes:
        s = o.summary
        status = o.status + (" (kept)" if o.note == "kept (resume)" else "")
        if s is None:
            table.add_row(o.run, str(o.repeat), status, *["-"] * (len(shown) + 2))
            continue
        table.add_row(o.run, str(o.repeat), status, *(f(getattr(s, m.key("median")), fmt) for m, fmt in shown),
                      str(s.failed), "-" if s.jit_compiles is None else str(len(s.jit_compiles)))
    return table
