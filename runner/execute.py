"""`attnbench run`: for each run of a suite, start its server, warm up, measure the repeats,
stop the server.

Consecutive runs whose model and serve settings are equal (the points of a matrix over
benchmark settings, e.g. the Fig. 9 output lengths) share one server: its start-up (about
100 s on a GPU: weights, torch.compile, CUDA-graph capture) is paid once. Each run still
does its own warm-up; its provenance names the run whose folder holds the server log.
A knee run (``benchmark.knee``) measures the probes of its search instead of repeats, each
after its own warm-up, on one server start (`run_knee`, runner/knee.py).

Failure rules: a server that does not start marks that run's pending repeats failed (with
the log tail) and the suite goes on; a server that dies mid-repeat marks that repeat and
the run's later repeats failed, keeps the earlier ones, and the suite goes on; a server
that hangs is found by the load's read-idle timeout (the repeat is ``degraded``) and by
``/health`` before the next repeat (the rest fail, and the next run starts a new server);
Ctrl-C stops the server, marks the repeat ``interrupted`` with what was measured so far,
and exits. Every request record is on disk the moment it finishes.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import provenance
from .catalogue import (COALESCED_HEADLINE_LIMIT, ITL, OUTPUT_THROUGHPUT, REQUEST_THROUGHPUT,
                        TOTAL_TOKEN_THROUGHPUT, TPOT, TTFT)
from .datasets import DatasetError, build_requests
from .energy import EnergyMeter, server_gpus
from .knee import KNEE_FILE, KneeResult, Probe, next_rate
from .loadgen import LoadConfig
from .loadpool import resolve_processes
from .models import ModelFolderError, ensure_model
from .recipe import Recipe, Suite
from .server import ServerError, ServerProcess, build_launch, log_tail
from .repeat import measure_repeat
from .serverlog import cuda_graph_modes, engine_mismatch
from .store import ResultsStore, atomic_write_json, read_records
from .summary import RepeatHeader, RepeatSummary, summarize_repeat, unmeasured_repeat, utc_now
from .tasks import LOCK_FILE, RunLock, launch_key
from .workload import Workload


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
    """What a suite's repeat measures: its run, the model and the load of its recipe
    (``more`` adds to it or overrides it: a knee probe's own ``request_rate``)."""
    b = recipe.benchmark
    fields = dict(suite=suite.name, run=recipe.name, repeat=repeat, session=session, model_id=recipe.model.name,
                  tokenizer_id=recipe.model.tokenizer_path, num_prompts=b.num_prompts, request_rate=b.request_rate,
                  burstiness=b.burstiness, max_concurrency=b.max_concurrency, recipe_hash=recipe.digest())
    return RepeatHeader(**{**fields, **more})


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


class Serving:
    """One run's server up and its load built (`open`): measures its repeats one by one,
    each after the run's warm-up or its own (`warm_up`). ``with`` it to close its meter."""

    def __init__(self, suite: Suite, recipe: Recipe, store: ResultsStore, console: Console, session: str,
                 server: ServerProcess, workload: Workload, prov: dict, prov_file: str):
        self.suite, self.recipe, self.store, self.console, self.session = suite, recipe, store, console, session
        self.server, self.workload, self.prov, self.prov_file = server, workload, prov, prov_file
        b, s = recipe.benchmark, recipe.serve
        self.cfg = LoadConfig(server.plan.base_url, recipe.model.name, b.ignore_eos, b.max_concurrency,
                              b.request_timeout_s, b.idle_timeout_s, per_chunk_usage=b.per_chunk_usage)
        self.meter = EnergyMeter.open(s.gpu_vendor, server_gpus(s.gpu_vendor, s.tensor_parallel_size, s.env))
        if self.meter.reader is None:
            console.print(f"[{'dim' if s.gpu_vendor == 'none' else 'yellow'}]{recipe.name}: {self.meter.why}; "
                          "every other metric as usual[/]")

    @classmethod
    def open(cls, suite: Suite, recipe: Recipe, store: ResultsStore, console: Console, servers: SharedServer,
             session: str) -> "Serving | str":
        """The run served from ``servers`` (maybe a neighbouring run's server; the caller
        closes it), its provenance written; or one line saying why it cannot be."""
        b = recipe.benchmark
        try:
            ensure_model(recipe.model.path, recipe.model.build)
            workload = Workload.of(b, recipe.model.tokenizer_path)
        except (DatasetError, ModelFolderError) as e:
            console.print(f"[red]{recipe.name}: {e}[/]")
            return str(e)
        try:
            server = servers.acquire(recipe, store.server_log(recipe.name), console)
        except ServerError as e:
            console.print(f"[red]{recipe.name}: server failed to start[/]\n{e}")
            return str(e)
        version, log_text = server.version(), server.log_text()
        mismatch = engine_mismatch(recipe.serve.engine, version, log_text)
        if mismatch:
            console.print(f"[red]{recipe.name}: {mismatch}[/]")
            return mismatch
        prov = provenance.collect(recipe, suite_source=suite.source, server_version=version,
                                  image=recipe.serve.image, argv=server.plan.argv)
        prov["server_log"] = str(server.log_path.relative_to(store.suite_dir)) \
            if server.log_path.is_relative_to(store.suite_dir) else str(server.log_path)
        prov["cuda_graphs"] = cuda_graph_modes(log_text)
        prov["load_timing"] = workload.timing(b, b.request_rate)  # a knee's probes: each in its summary
        prov_file = store.write_run_meta(recipe.name, recipe.model_dump(mode="json"), prov, session)
        return cls(suite, recipe, store, console, session, server, workload, prov, prov_file)

    def __enter__(self) -> "Serving":
        return self

    def __exit__(self, *exc) -> None:
        self.meter.close()

    def header(self, repeat: int, **more) -> RepeatHeader:
        return repeat_header(self.suite, self.recipe, repeat, self.session, **more)

    def warm_up(self) -> None:
        """``warmup_requests`` at once, not measured (warmup.jsonl); the kernels the server
        compiled meanwhile go into the provenance."""
        b = self.recipe.benchmark
        if not b.warmup_requests:
            return
        warm = build_requests(b.warmup_dataset(), b.warmup_requests, self.recipe.model.tokenizer_path, b.seed + 1)
        with self.store.warmup_writer(self.recipe.name) as w:
            warmup = measure_repeat(self.cfg, warm, [0.0] * len(warm), w, self.header(0),
                                    desc=f"{self.recipe.name} warm-up", phase="warmup", server_log=self.server.log_path)
        self.prov["jit_compiles_in_warmup"] = warmup.summary.jit_compiles
        atomic_write_json(self.store.run_dir(self.recipe.name) / self.prov_file, self.prov)

    def unwell(self, repeat: int) -> str:
        """Why the server cannot take repeat ``repeat`` (printed), "" when it can."""
        why = server_unwell(self.server)
        if why:
            self.console.print(f"[red]{self.recipe.name} r{repeat}: {why}[/]")
        return why

    def load(self, count: int) -> Workload:
        """The run's load with ``count`` requests (more than ``num_prompts`` for a knee probe
        at a high rate: built again, longer; raises DatasetError)."""
        if count <= len(self.workload.requests):  # a knee's load: on the schedule's clock
            return Workload(self.workload.requests[:count])
        self.workload = Workload.of(self.recipe.benchmark, self.recipe.model.tokenizer_path, count)
        return self.workload

    def measure(self, repeat: int, rate: float | None = None, workload: Workload | None = None) -> RepeatOutcome:
        """Repeat ``repeat`` at the recipe's request rate (or ``rate``, req/s) with its
        load (or ``workload``), its summary written; what needs a second look said on the
        console."""
        name, b = self.recipe.name, self.recipe.benchmark
        rate = b.request_rate if rate is None else rate
        workload = self.workload if workload is None else workload
        requests = workload.requests
        cache = {}
        if self.recipe.serve.enable_prefix_caching:  # each repeat from an empty cache: no earlier prompt in it
            why = self.server.reset_prefix_cache()
            cache["prefix_cache_reset"] = not why
            if why:
                self.console.print(f"[yellow]warning: {name} r{repeat}: prefix cache not emptied ({why}); what "
                                   "earlier repeats and the warm-up sent may be found in it[/]")
        header = self.header(repeat, provenance_file=self.prov_file, request_rate=rate, num_prompts=len(requests),
                             load_timing=workload.timing(b, rate), **cache)
        processes = resolve_processes(b.client_processes, workload.size, b.max_concurrency)
        with self.store.requests_writer(name, repeat) as writer:
            try:
                measured = measure_repeat(self.cfg, requests, workload.offsets(b, rate), writer, header,
                                          desc=f"{name} r{repeat}", conversations=workload.conversations,
                                          processes=processes, slo_ms=b.goodput_slo_ms, slo=b.slo,
                                          server_log=self.server.log_path, meter=self.meter)
            except KeyboardInterrupt:
                summary = summarize_repeat(read_records(writer.path), header, digest=writer.digest(),
                                           slo_ms=b.goodput_slo_ms, slo=b.slo, status="interrupted",
                                           error="interrupted (Ctrl-C)")
                self.store.write_summary(name, repeat, summary)
                raise
        summary = self._verdict(repeat, measured.summary)
        self.store.write_summary(name, repeat, summary)
        return RepeatOutcome.of(summary)

    def _verdict(self, repeat: int, summary: RepeatSummary) -> RepeatSummary:
        """The summary as the server's fate has it (failed if it died meanwhile), with a
        console line for whatever needs a second look."""
        name, server, print_ = self.recipe.name, self.server, self.console.print
        if not server.alive() or (summary.failed > 0 and server.exits_within(2.0)):
            summary = summary.model_copy(update={"status": "failed", "error": (
                f"vLLM server exited during the repeat (code {server.proc.returncode}); "
                f"last log lines:\n{log_tail(server.log_path, 15)}")})
            print_(f"[red]{name} r{repeat}: server died[/]")
        elif summary.status == "degraded":
            print_(f"[red]{name} r{repeat}: degraded, left out of the means and measured again by "
                   f"--resume: {summary.error}[/]")
        elif summary.failed:
            print_(f"[yellow]warning: {name} r{repeat}: {summary.failed} of {summary.failed + summary.completed} "
                   f"requests failed (metrics cover the {summary.completed} that completed); first error: "
                   f"{summary.first_error}[/]")
        if summary.jit_compiles:
            print_(f"[yellow]warning: {name} r{repeat}: the server compiled kernels during the measurement "
                   f"(a latency spike): {summary.jit_compiles[0]}[/]")
        if self.meter.reader is not None and summary.energy is not None and not summary.energy.valid:
            print_(f"[yellow]warning: {name} r{repeat}: its energy is not valid (the other metrics are): "
                   f"{summary.energy.note}[/]")
        return summary


def run_recipe(suite: Suite, recipe: Recipe, store: ResultsStore, repeats: list[int],
               console: Console, servers: SharedServer, session: str = "") -> list[RepeatOutcome]:
    """Serve one recipe, warm up once and measure the given repeats; returns one outcome
    per repeat. ``session`` (the invocation's start time) is written into every summary."""
    serving = Serving.open(suite, recipe, store, console, servers, session)
    if isinstance(serving, str):
        return [_unmeasured(store, repeat_header(suite, recipe, r, session), "failed", serving) for r in repeats]
    with serving:
        serving.warm_up()
        outcomes: list[RepeatOutcome] = []
        for i, repeat in enumerate(repeats):
            unwell = serving.unwell(repeat)
            if unwell:
                outcomes += [_unmeasured(store, serving.header(r), "failed", unwell) for r in repeats[i:]]
                break
            outcomes.append(serving.measure(repeat))
        return outcomes


def run_knee(suite: Suite, recipe: Recipe, store: ResultsStore, console: Console, servers: SharedServer,
             session: str = "", resume: bool = False) -> list[RepeatOutcome]:
    """Search a knee run's rates (runner/knee.py) on one server start, each probe a
    repeat after its own warm-up; ``resume`` keeps a probe already measured at the rate
    the search asks for, of this very recipe (its SLO included). Writes the run's
    knee.json; returns one outcome per probe."""
    b = recipe.benchmark
    serving: Serving | str | None = None  # opened at the first probe to measure (none, if all are kept)
    probes: list[Probe] = []
    outcomes: list[RepeatOutcome] = []
    with ExitStack() as open_serving:
        while (rate := next_rate(probes, b.knee)) is not None:
            repeat, count = len(probes) + 1, b.knee.requests_at(rate, b.num_prompts)
            kept, _ = store.kept(recipe.name, repeat) if resume else (None, "")
            if kept is not None and (kept.request_rate, kept.num_prompts, kept.recipe_hash) == (
                    rate, count, recipe.digest()):
                outcome = RepeatOutcome.of(kept, "kept (resume)")
            else:
                if serving is None:
                    serving = Serving.open(suite, recipe, store, console, servers, session)
                    if isinstance(serving, Serving):
                        open_serving.enter_context(serving)
                why = serving if isinstance(serving, str) else serving.unwell(repeat)
                try:
                    workload = None if why else serving.load(count)
                except DatasetError as e:
                    why = f"{count} requests for {rate:.3g} req/s x {b.knee.probe_s:g} s: {e}"
                if why:
                    outcome = _unmeasured(store, repeat_header(suite, recipe, repeat, session, request_rate=rate,
                                                               num_prompts=count), "failed", why)
                else:
                    serving.warm_up()
                    outcome = serving.measure(repeat, rate, workload)
            outcomes.append(outcome)
            probes.append(Probe.of(outcome.summary, b.knee.keep_up))
            p = probes[-1]
            console.print(f"{recipe.name} r{repeat}: {'burst' if math.isinf(rate) else f'{rate:.3g} req/s'} ({count} requests): "
                          f"SLO attainment {p.attainment or 0:.1%}{_kept_up(p)} ({'holds' if p.holds else 'does not hold'})")
    for stale in range(len(probes) + 1, b.knee.max_probes + 1):  # probes of an earlier, longer search
        store.clear_repeat(recipe.name, stale)
    result = KneeResult.of(recipe.name, probes, b.knee, [str(o) for o in b.slo.objectives], b.slo.attainment_target)
    atomic_write_json(store.run_dir(recipe.name) / KNEE_FILE, json.loads(result.model_dump_json()))  # inf: "Infinity"
    console.print(f"[bold]{recipe.name}[/]: {result.verdict}")
    return outcomes


def _kept_up(p: Probe) -> str:
    """", kept up 98%": what the probe's line says of `metrics.keep_up`, where it was judged."""
    return "" if p.keep_up is None else f", kept up {p.keep_up:.0%}"


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
                if recipe.benchmark.knee is not None:
                    outcomes += run_knee(suite, recipe, store, console, servers, session, resume)
                    continue
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
    share a prefix stay apart in 80 columns); the numbers wrap instead. An ITL that reads
    low because most chunk gaps were coalesced (`COALESCED_HEADLINE_LIMIT`) is marked, and
    the caption gives the repeat's median TPOT beside it."""
    table = Table(title=f"attnbench: {suite}")
    coalesced = []  # "run rK: share, TPOT" of the repeats whose ITL is marked
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
        cells = [f(getattr(s, m.key("median")), fmt) for m, fmt in shown]
        share = s.client_coalesced_chunks
        if share is not None and share >= COALESCED_HEADLINE_LIMIT and getattr(s, ITL.key()) is not None:
            cells[shown.index((ITL, "{:.2f}"))] += "*"
            tpot = f(getattr(s, TPOT.key()), "{:.2f}")
            coalesced.append(f"{o.run} r{o.repeat}: {share:.0%}, median {TPOT.short} {tpot} ms")
        table.add_row(o.run, str(o.repeat), status, *cells,
                      str(s.failed), "-" if s.jit_compiles is None else str(len(s.jit_compiles)))
    if coalesced:
        table.caption = ("* ITL reads low: these shares of the chunk gaps were coalesced (read together, a 0 ms gap "
                         "by vLLM's definition): " + "; ".join(coalesced))
    return table
