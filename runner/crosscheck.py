"""`attnbench crosscheck run`: attnbench's load client beside `vllm bench serve` on one
server, so that a user can check that the two clients read the same numbers off it.

One server (started here from a suite's run, or one already listening at ``url``), one
prompt set (synthetic ShareGPT-shaped prompts exported as ShareGPT JSON, or the user's
ShareGPT file) read by both clients, temperature 0, ``ignore_eos``, and for each load (a
burst: every request at once; Poisson arrivals at ``rate`` req/s) ``pairs`` pairs of
client runs. Both clients draw arrivals from the same seed with the same generator, so
they send identical requests on an identical schedule.

* Alternating pairs (the default) run the clients one after the other in ABBA order:
  attnbench first in odd pairs, vllm bench first in even ones, so that a drift of the
  server over the campaign weighs on both alike. ``fixed_processes`` adds to every pair a
  run of `attnbench load --client-processes N` for each N.
* Side by side (``side_by_side``) runs both clients at once, each on half of the prompts
  (the even- and odd-numbered ones) at half the rate, from one wall-clock start
  (``--start-at``): two Poisson streams of rate/2 add up to one of the rate, so the server
  sees the same load, and within each run both clients meet the same server on the same
  host. The halves are swapped from one run to the next, so a pair of runs sends each
  client every prompt.

Around every client run, the witnesses (``<load>/witness/<client>-r<i>.json``): what the
server itself measured (vLLM's /metrics before and after: the third witness), the CPU
seconds of every server process (when its pid is known) and of the client, the host's
stolen and stalled CPU; through the whole campaign a probe samples the host's speed
(`host.HostProbe`). Each load gets one unrecorded run first (the server's first run after
a change of load was the slowest of its kind, whichever client sent it). Client runs whose
results exist are not run again, so a campaign cut short resumes where it stopped.

The verdict is `attnbench.analysis.crosscheck` (``attnbench crosscheck compare``).

Layout under ``out``: ``campaign.json`` (how it ran), ``prompts.json`` (and its halves),
``host-probe.jsonl``, ``server.log`` when the server was started here, and per load
(``burst``, ``poisson``; ``-side`` appended side by side) ``attnbench[-p<N>]/r<i>/``
(`attnbench load`'s requests.jsonl and summary.json), ``vllm-bench/r<i>.json`` (its
``--save-result --save-detailed``) with ``r<i>.sent.jsonl`` (when its requests were
written), ``witness/`` and ``log/``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .datasets import LocalTokenizer, build_requests, to_sharegpt
from .host import HostProbe, host_counters, process_tree_cpu
from .recipe import DatasetSpec
from .store import SUMMARY_FILE, atomic_write_json
from .witness import Snapshot, between, scrape_text

# `vllm bench serve` through vLLM's own CLI in this Python, with `--start-at` and
# `--trace-sends` (attnbench.kernels.plugin.vllm_cli; named, never imported here)
VLLM_CLI_MODULE = "attnbench.kernels.plugin.vllm_cli"
LOADS = ("burst", "poisson")
CLIENTS = ("attnbench", "vllm-bench")
FIXED_PREFIX = "attnbench-p"  # attnbench-p<N>/: `attnbench load --client-processes N`
CAMPAIGN_FILE = "campaign.json"
PROMPTS_FILE = "prompts.json"
PROBE_FILE = "host-probe.jsonl"
WARMUP_PROMPTS = 16


class CrossCheckError(RuntimeError):
    """A campaign that cannot go on; the message says why in one line."""


@dataclass
class CrossCheck:
    """One campaign (module doc). ``server_pid``: the server's process, for its CPU time."""

    url: str
    model: str
    tokenizer: Path
    out: Path
    prompts: int = 500
    pairs: int = 5
    rate: float = 20.0  # req/s of the Poisson load (all clients together)
    loads: tuple[str, ...] = LOADS
    side_by_side: bool = False
    fixed_processes: tuple[int, ...] = ()
    dataset_path: Path | None = None  # ShareGPT JSON to send instead of synthetic prompts
    server_pid: int | None = None
    lead_s: float = 30.0  # side by side: from launching both clients to their shared start
    python: str = sys.executable
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def __post_init__(self):
        if self.side_by_side and self.prompts % 2:
            raise CrossCheckError(f"--prompts {self.prompts}: side by side needs an even count (two equal halves)")
        unknown = sorted(set(self.loads) - set(LOADS))
        if unknown:
            raise CrossCheckError(f"--load {unknown[0]!r}: expected one of {list(LOADS)}")

    def load_dir(self, load: str) -> Path:
        return self.out / (load + ("-side" if self.side_by_side else ""))

    def load_rate(self, load: str) -> float:
        return math.inf if load == "burst" else self.rate


def run_crosscheck(plan: CrossCheck, log=print) -> Path:
    """Run (or finish) the campaign into ``plan.out``; returns the folder."""
    plan.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan.out / CAMPAIGN_FILE, {**asdict(plan), "out": str(plan.out), "tokenizer": str(plan.tokenizer),
                                                 "dataset_path": str(plan.dataset_path or "")})
    prompts = export_prompts(plan)
    with HostProbe(plan.out / PROBE_FILE):
        _attnbench_load(plan, prompts, min(WARMUP_PROMPTS, plan.prompts), math.inf, plan.out / "warmup")
        for load in plan.loads:
            folder = plan.load_dir(load)
            warmed = folder / "warmed-up"
            if not warmed.exists():  # one unrecorded run of this load first
                log(f"{load}: warm-up run")
                _attnbench_load(plan, prompts, plan.prompts, plan.load_rate(load), folder / "warmup")
                warmed.parent.mkdir(parents=True, exist_ok=True)
                warmed.touch()
            if plan.side_by_side:
                halves = split_prompts(prompts)
                for i in range(1, 2 * plan.pairs + 1):
                    log(f"{load}: side-by-side run {i} of {2 * plan.pairs}")
                    _side_by_side(plan, load, halves, i)
                continue
            for i in range(1, plan.pairs + 1):
                log(f"{load}: pair {i} of {plan.pairs}")
                order = [_run_attnbench, _run_fixed, _run_vllm_bench]
                for measure in (order if i % 2 else order[::-1]):
                    measure(plan, load, prompts, i)
    return plan.out


def export_prompts(plan: CrossCheck) -> Path:
    """The prompt file both clients read: the user's ShareGPT file, or ``plan.prompts``
    synthetic prompts (seed 0) that pass vLLM's ShareGPT filter, written once."""
    if plan.dataset_path is not None:
        return plan.dataset_path
    path = plan.out / PROMPTS_FILE
    if not path.exists():
        drawn = build_requests(DatasetSpec(kind="synthetic"), 2 * plan.prompts + 10, plan.tokenizer, 0)
        conversations = to_sharegpt(drawn, LocalTokenizer(plan.tokenizer), 0, limit=plan.prompts)
        if len(conversations) < plan.prompts:
            raise CrossCheckError(f"only {len(conversations)} synthetic prompts pass vLLM's ShareGPT filter; "
                                  "ask for fewer (--prompts)")
        atomic_write_json(path, conversations)
    return path


def split_prompts(prompts: Path) -> dict[str, Path]:
    """The even- and odd-numbered conversations of ``prompts`` as two files (a, b)."""
    rows = json.loads(prompts.read_text())
    halves = {}
    for half, share in (("a", rows[0::2]), ("b", rows[1::2])):
        path = prompts.with_name(f"{prompts.stem}-{half}.json")
        if not path.exists():
            atomic_write_json(path, share)
        halves[half] = path
    return halves


def _side_by_side(plan: CrossCheck, load: str, halves: dict[str, Path], i: int) -> None:
    """Run ``i`` side by side: attnbench on half a (seed 1) in odd runs, b (seed 2) in even
    ones, vllm bench on the other, both at half the rate from one start."""
    ours, theirs = ("a", "b") if i % 2 else ("b", "a")
    seed = {"a": 1, "b": 2}
    folder, rate, count = plan.load_dir(load), plan.load_rate(load) / 2, plan.prompts // 2
    start_at = time.time() + plan.lead_s  # time for vllm bench's imports, tokenizer and test request
    jobs = [job for job in (
        _attnbench_job(plan, folder, "attnbench", i, halves[ours], count, rate, seed[ours], start_at=start_at),
        _vllm_bench_job(plan, folder, i, halves[theirs], count, rate, seed[theirs], start_at=start_at)) if job]
    _measure(plan, folder, jobs)


def _run_attnbench(plan: CrossCheck, load: str, prompts: Path, i: int) -> None:
    folder = plan.load_dir(load)
    _measure(plan, folder, [_attnbench_job(plan, folder, "attnbench", i, prompts, plan.prompts,
                                           plan.load_rate(load), 0)])


def _run_fixed(plan: CrossCheck, load: str, prompts: Path, i: int) -> None:
    folder = plan.load_dir(load)
    for n in plan.fixed_processes:
        _measure(plan, folder, [_attnbench_job(plan, folder, f"{FIXED_PREFIX}{n}", i, prompts, plan.prompts,
                                               plan.load_rate(load), 0, processes=n)])


def _run_vllm_bench(plan: CrossCheck, load: str, prompts: Path, i: int) -> None:
    folder = plan.load_dir(load)
    _measure(plan, folder, [_vllm_bench_job(plan, folder, i, prompts, plan.prompts, plan.load_rate(load), 0)])


@dataclass
class _Job:
    client: str
    repeat: int
    argv: list[str]


def _load_argv(plan: CrossCheck, prompts: Path, count: int, rate: float, seed: int, out: Path, *,
               processes: int | str = "auto", start_at: float | None = None) -> list[str]:
    return [plan.python, "-m", "attnbench.cli", "load", "--url", plan.url, "--model", plan.model,
            "--tokenizer", str(plan.tokenizer), "--dataset", "sharegpt", "--dataset-path", str(prompts),
            "--num-prompts", str(count), "--seed", str(seed), "--request-rate", str(rate), "--arrival", "poisson",
            "--client-processes", str(processes), "--out", str(out),
            *(["--start-at", f"{start_at:.3f}", "--shared-server"] if start_at is not None else [])]


def _attnbench_load(plan: CrossCheck, prompts: Path, count: int, rate: float, out: Path) -> None:
    """An unrecorded `attnbench load` (a warm-up; seed 0): its results are kept, not compared."""
    if (out / SUMMARY_FILE).exists():
        return
    argv = _load_argv(plan, prompts, count, rate, 0, out)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: some requests failed, said in its summary
        raise CrossCheckError(f"warm-up `attnbench load` failed ({done.returncode}): "
                              f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")


def _attnbench_job(plan: CrossCheck, folder: Path, client: str, i: int, prompts: Path, count: int, rate: float,
                   seed: int, *, processes: int | str = "auto", start_at: float | None = None) -> _Job | None:
    out = folder / client / f"r{i}"
    if (out / SUMMARY_FILE).exists():
        return None
    return _Job(client, i, _load_argv(plan, prompts, count, rate, seed, out, processes=processes, start_at=start_at))


def _vllm_bench_job(plan: CrossCheck, folder: Path, i: int, prompts: Path, count: int, rate: float, seed: int, *,
                    start_at: float | None = None) -> _Job | None:
    out = folder / "vllm-bench"
    if (out / f"r{i}.json").exists():
        return None
    out.mkdir(parents=True, exist_ok=True)
    return _Job("vllm-bench", i, [
        plan.python, "-m", VLLM_CLI_MODULE, "bench", "serve", "--backend", "vllm", "--base-url", plan.url,
        "--model", plan.model, "--tokenizer", str(plan.tokenizer), "--dataset-name", "sharegpt",
        "--dataset-path", str(prompts), "--num-prompts", str(count), "--ignore-eos", "--temperature", "0",
        "--request-rate", str(rate), "--burstiness", "1.0", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed",
        "--result-dir", str(out), "--result-filename", f"r{i}.json", "--trace-sends", str(out / f"r{i}.sent.jsonl"),
        *(["--start-at", f"{start_at:.3f}"] if start_at is not None else [])])


def _snapshot(plan: CrossCheck) -> dict:
    """The witnesses' state now: vLLM's /metrics text, the server's processes' CPU, the host's counters."""
    return {"time": time.time(), "metrics": scrape_text(plan.url),
            "processes": process_tree_cpu(plan.server_pid) if plan.server_pid else {}, "host": host_counters()}


def _measure(plan: CrossCheck, folder: Path, jobs: list[_Job]) -> None:
    """Run the jobs' clients at once (one, or two side by side), each to its end, and write
    each one's witnesses: the server's own metrics, its processes' and the client's CPU
    seconds, the host's counters, over the client's run."""
    if not jobs:
        return
    (folder / "witness").mkdir(parents=True, exist_ok=True)
    (folder / "log").mkdir(parents=True, exist_ok=True)
    before = _snapshot(plan)
    running = []
    try:
        for job in jobs:
            log = open(folder / "log" / f"{job.client}-r{job.repeat}.log", "w")
            running.append((job, subprocess.Popen(job.argv, stdout=log, stderr=subprocess.STDOUT), log,
                            time.perf_counter()))
        failures = []
        for job, proc, log, started in running:
            _, status, usage = os.wait4(proc.pid, 0)  # the client's own rusage, its children included
            proc.returncode = os.waitstatus_to_exitcode(status)
            log.close()
            after = _snapshot(plan)
            witness = {"rc": proc.returncode, "wall_s": time.perf_counter() - started,
                       "client_cpu_s": usage.ru_utime + usage.ru_stime, "client_max_rss_mib": usage.ru_maxrss / 1024,
                       "before": {k: v for k, v in before.items() if k != "metrics"},
                       "after": {k: v for k, v in after.items() if k != "metrics"},
                       "server": between(Snapshot.parse(before["metrics"]), Snapshot.parse(after["metrics"]))
                       if before["metrics"] and after["metrics"] else {}}
            atomic_write_json(folder / "witness" / f"{job.client}-r{job.repeat}.json", witness)
            if proc.returncode not in (0, 1):  # 1: some requests failed, said in its results
                path = folder / "log" / f"{job.client}-r{job.repeat}.log"
                tail = path.read_text(errors="replace").strip().splitlines() or ["(no output)"]
                failures.append(f"{job.client} r{job.repeat} exited with {proc.returncode}: {tail[-1][:300]} "
                                f"(log: {path})")
        if failures:
            raise CrossCheckError("; ".join(failures))
    finally:  # Ctrl-C or an error: no client is left running
        for _, proc, log, _ in running:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            log.close()
