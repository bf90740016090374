"""`attnbench calibrate`: how much does the load generator itself add?

A zero-work OpenAI-compatible SSE server (`stub_app`: answers /v1/completions by streaming
``max_tokens`` one-token chunks at once, with per-chunk usage) runs in a child process on
its own CPU; the load generator runs here, pinned to one CPU, against it. Since the server
does no work, the TTFT and ITL the client measures are the client's (plus loopback's) own
overhead, and chunks/s is the most this client can ingest on one core.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

from aiohttp import web

from .datasets import BenchRequest
from .loadgen import LoadConfig, arrival_offsets, run_load
from .metrics import summarize
from .server import free_port

STUB_MODEL = "stub"


def stub_app() -> web.Application:
    """An aiohttp app that streams completions instantly (no model)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        prompt_tokens = max(1, len(str(body.get("prompt", "")).split()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(1, n + 1):
            chunk = {"id": "stub", "object": "text_completion", "model": STUB_MODEL,
                     "choices": [{"index": 0, "text": " x", "finish_reason": "length" if i == n else None}],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i,
                               "total_tokens": prompt_tokens + i}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
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
    app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models),
                    web.get("/health", health)])
    return app


def _serve_stub(port: int, cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    web.run_app(stub_app(), host="127.0.0.1", port=port, print=None, access_log=None)


class StubServer:
    """The stub in a child process: ``with StubServer() as url: ...``."""

    def __init__(self, port: int | None = None, cpu: int | None = None):
        self.port = port or free_port()
        self.cpu = cpu
        self.proc: mp.Process | None = None

    def __enter__(self) -> str:
        self.proc = mp.get_context("spawn").Process(target=_serve_stub, args=(self.port, self.cpu), daemon=True)
        self.proc.start()
        import urllib.request

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return f"http://127.0.0.1:{self.port}"
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("stub server did not start")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
            self.proc = None


@dataclass
class Calibration:
    concurrency: int
    requests: int
    tokens_per_request: int
    chunks_per_s: float
    summary: dict

    def lines(self) -> list[str]:
        s = self.summary
        return [
            f"concurrent streams {self.concurrency}, {self.requests} requests x {self.tokens_per_request} chunks",
            f"client throughput: {self.chunks_per_s:,.0f} chunks/s",
            f"added TTFT ms: p50 {s['median_ttft_ms']:.3f}  p90 {s['p90_ttft_ms']:.3f}  p99 {s['p99_ttft_ms']:.3f}",
            f"added ITL  ms: p50 {s['median_itl_ms']:.4f}  p90 {s['p90_itl_ms']:.4f}  p99 {s['p99_itl_ms']:.4f}",
            f"schedule lag ms: p50 {s['median_schedule_lag_ms']:.3f}  p99 {s['p99_schedule_lag_ms']:.3f}",
        ]


def calibrate(concurrency: int = 256, requests: int = 1024, tokens: int = 128,
              client_cpu: int | None = 0, server_cpu: int | None = 1, url: str | None = None) -> Calibration:
    """Measure the client against the stub (started here unless ``url`` is given)."""
    if client_cpu is not None and hasattr(os, "sched_setaffinity") and client_cpu < os.cpu_count():
        os.sched_setaffinity(0, {client_cpu})
    reqs = [BenchRequest("hello " * 8, 8, tokens) for _ in range(requests)]

    def measure(base_url: str) -> Calibration:
        cfg = LoadConfig(base_url, STUB_MODEL, max_concurrency=concurrency)
        records = asyncio.run(run_load(cfg, reqs, arrival_offsets(requests, float("inf"), "constant", 1.0, 0),
                                       sink=lambda r: None))
        s = summarize(records)
        if s["failed"]:
            raise RuntimeError(f"{s['failed']} stub requests failed: {s['errors']}")
        chunks = sum(len(r.chunk_s) for r in records)
        return Calibration(concurrency, requests, tokens, chunks / s["duration"], s)

    if url:
        return measure(url)
    server_cpu = server_cpu if (server_cpu is not None and server_cpu < (os.cpu_count() or 1)) else None
    with StubServer(cpu=server_cpu) as base_url:
        return measure(base_url)
