"""`attnbench calibrate`: how much does the load generator itself add?

A zero-work OpenAI-compatible SSE server (`stub_app`) runs in child processes, each on
its own CPU (one by default; several share one port through SO_REUSEPORT, the kernel
spreading connections over them, when one stub process would be the bottleneck: 1,024
paced streams ask ~51k chunks/s, about what one Python process writes); the load
generator runs here, pinned to one CPU, against it. The stub answers
``/v1/completions`` with ``max_tokens`` one-token chunks (per-chunk usage), the first one
at once; under ``/pace/<ms>/v1/completions`` it waits ``ms`` between chunks. Two phases:

* overhead: paced streams at the given concurrency (steady state, below the capacity of
  both sides). The stub's TTFT is 0 and its ITL is exactly the pace, so the client's
  measured TTFT, and ITL minus the pace, are what the client (plus loopback) adds.
  Request lengths vary (uniformly from half to 1.5x ``tokens``), so streams end and new
  ones start spread over time instead of in synchronized waves of ``concurrency``
  (a wave is a burst, not a steady state). TTFT percentiles skip the first wave: the
  requests sent before any request finished (connection set-up, all at once).
* throughput: unpaced streams; chunks/s is the most this client ingests on one core (or
  on ``client_processes`` processes, which then share every CPU but the stub's).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from .datasets import BenchRequest
from .loadgen import LoadConfig, arrival_offsets
from .loadpool import run_load_processes
from .server import free_port

STUB_MODEL = "stub"
STUB_PID_HEADER = "X-Stub-Pid"  # which stub process answered (several share a port)
READY_LINE = "stub ready"  # printed by a stub process once it listens
STUB_START_TIMEOUT_S = 30


def stub_app() -> web.Application:
    """An aiohttp app that streams completions instantly (no model)."""

    def chunk(i: int, n: int, prompt_tokens: int) -> bytes:
        body = {"id": "stub", "object": "text_completion", "model": STUB_MODEL,
                "choices": [{"index": 0, "text": " x", "finish_reason": "length" if i == n else None}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i,
                          "total_tokens": prompt_tokens + i}}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        pace = float(request.match_info.get("ms", 0)) / 1e3
        prompt_tokens = max(1, len(str(body.get("prompt", "")).split()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", STUB_PID_HEADER: str(os.getpid())})
        await resp.prepare(request)
        for i in range(1, n + 1):
            await resp.write(chunk(i, n, prompt_tokens))
            if pace and i < n:
                await asyncio.sleep(pace)
        final = {"id": "stub", "object": "text_completion", "model": STUB_MODEL, "choices": [],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                           "total_tokens": prompt_tokens + n}}
        await resp.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_):
        return web.json_response({"object": "list", "data": [{"id": STUB_MODEL, "object": "model"}]})

    async def health(_):
        return web.Response(text="")

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions),
                    web.post("/pace/{ms}/v1/completions", completions),
                    web.get("/v1/models", models), web.get("/pace/{ms}/v1/models", models),
                    web.get("/health", health)])
    return app


def serve_stub(port: int, reuse_port: bool = False) -> None:
    """Run the stub in the foreground (the body of `attnbench stub-server`); prints
    READY_LINE once it listens. ``reuse_port``: share the port with other stub processes."""
    try:  # optional: the stub must not be the bottleneck, so uvloop when it is installed
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    # a deep accept backlog: hundreds of streams connect at once, and a dropped SYN costs 1 s
    web.run_app(stub_app(), host="127.0.0.1", port=port, access_log=None, backlog=4096,
                reuse_port=reuse_port or None, print=lambda *_: print(READY_LINE, flush=True))


class StubServer:
    """The stub as child processes (`attnbench stub-server`), one per CPU of ``cpus``
    (None: one process, unpinned), all on one port: ``with StubServer() as url: ...``."""

    def __init__(self, port: int | None = None, cpus: list[int | None] | None = None):
        self.port = port or free_port()
        self.cpus = cpus or [None]
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> str:
        argv = [sys.executable, "-m", "attnbench.cli", "stub-server", "--port", str(self.port)]
        if len(self.cpus) > 1:
            argv.append("--reuse-port")
        try:
            for cpu in self.cpus:
                def pin(cpu=cpu):
                    if cpu is not None and hasattr(os, "sched_setaffinity"):
                        os.sched_setaffinity(0, {cpu})

                proc = subprocess.Popen(argv, preexec_fn=pin, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
                self.procs.append(proc)
                # each one listens before the next starts (a SYN must never find a half-started set)
                ready, _, _ = select.select([proc.stdout], [], [], STUB_START_TIMEOUT_S)
                if not ready or proc.stdout.readline().strip() != READY_LINE:
                    raise RuntimeError(f"stub server process {len(self.procs)} of {len(self.cpus)} "
                                       f"did not start within {STUB_START_TIMEOUT_S} s (port {self.port})")
                proc.stdout.close()
        except BaseException:
            self.__exit__()
            raise
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


@dataclass
class Calibration:
    concurrency: int
    requests: int
    tokens_per_request: int  # the mean; each request draws from half to 1.5x this
    pace_ms: float
    added_ttft_ms: dict  # p50/p90/p99 over steady-state requests (sent after the first one finished)
    added_ttft_all_ms: dict  # over every request, first wave included (as vllm bench serve reports)
    added_itl_ms: dict   # p50/p90/p99 of |ITL - pace|
    schedule_lag_ms: dict
    chunks_per_s: float  # unpaced phase
    client_processes: int = 1
    stub_processes: int = 1

    def lines(self) -> list[str]:
        def fmt(d, nd=3):
            return "  ".join(f"{k} {v:.{nd}f}" for k, v in d.items())
        return [
            f"{self.concurrency} concurrent streams, {self.requests} requests x {self.tokens_per_request // 2}-"
            f"{self.tokens_per_request * 3 // 2} chunks, stub pace {self.pace_ms:g} ms"
            + ("" if self.stub_processes == 1 else f", {self.stub_processes} stub processes"),
            f"added TTFT ms (steady state): {fmt(self.added_ttft_ms)}",
            f"added TTFT ms (all requests): {fmt(self.added_ttft_all_ms)}",
            f"added ITL ms  |ITL - pace|:   {fmt(self.added_itl_ms, 4)}",
            f"schedule lag ms:              {fmt(self.schedule_lag_ms)}",
            f"client throughput (unpaced):  {self.chunks_per_s:,.0f} chunks/s on "
            + ("one core" if self.client_processes == 1 else f"{self.client_processes} client processes"),
        ]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _pcts(values) -> dict:
    v = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 99)}


def calibrate(concurrency: int = 256, requests: int = 2048, tokens: int = 64, pace_ms: float = 20.0,
              url: str | None = None, client_processes: int = 1, stub_processes: int = 1) -> Calibration:
    """Measure the client against the stub (started here unless ``url`` is given).

    CPUs: the stub's processes get CPUs 1 .. ``stub_processes``; one client process gets
    CPU 0, several share every CPU the stub does not have. With fewer CPUs than that, the
    stub runs unpinned."""
    ncpu = os.cpu_count() or 1
    stub_cpus = list(range(1, 1 + stub_processes)) if ncpu > stub_processes else [None] * stub_processes
    if hasattr(os, "sched_setaffinity"):
        if client_processes == 1:
            os.sched_setaffinity(0, {0})
        elif ncpu > stub_processes + 1 and stub_cpus[0] is not None:
            os.sched_setaffinity(0, set(range(ncpu)) - set(stub_cpus))
    rng = random.Random(0)
    reqs = [BenchRequest("hello " * 8, 8, rng.randint(max(1, tokens // 2), tokens * 3 // 2))
            for _ in range(requests)]

    def load(base_url: str):
        cfg = LoadConfig(base_url, STUB_MODEL, max_concurrency=concurrency)
        records = run_load_processes(cfg, reqs, arrival_offsets(requests, float("inf"), "constant", 1.0, 0),
                                     lambda r: None, client_processes)
        failed = [r for r in records if r.status != "ok"]
        if failed:
            raise RuntimeError(f"{len(failed)} stub requests failed: {failed[0].error}")
        return records

    def measure(base_url: str) -> Calibration:
        paced = load(f"{base_url}/pace/{pace_ms:g}")
        # the first wave: requests sent before any request finished (all opening connections
        # at t = 0); told apart by time, since several client processes interleave indices
        first_done = min(r.end_s for r in paced)
        steady = [r for r in paced if r.sent_s >= first_done] or paced
        ttft = [(r.chunk_s[0] - r.sent_s) * 1e3 for r in steady]
        ttft_all = [(r.chunk_s[0] - r.sent_s) * 1e3 for r in paced]
        itl = [abs((b - a) * 1e3 - pace_ms) for r in paced for a, b in zip(r.chunk_s, r.chunk_s[1:])]
        lag = [(r.dispatch_s - r.scheduled_s) * 1e3 for r in steady]
        unpaced = load(base_url)
        chunks = sum(len(r.chunk_s) for r in unpaced)
        duration = max(r.end_s for r in unpaced)
        return Calibration(concurrency, requests, tokens, pace_ms, _pcts(ttft), _pcts(ttft_all), _pcts(itl), _pcts(lag),
                           chunks / duration, client_processes, stub_processes)

    if url:
        return measure(url.rstrip("/"))
    with StubServer(cpus=stub_cpus) as base_url:
        return measure(base_url)
