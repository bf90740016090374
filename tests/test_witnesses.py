"""What a repeat records besides the client's own timings: the server's metrics (vLLM's
/metrics page as a third witness), kernel compiles in the server log, the client's event
loop lag and coalesced reads; and what `attnbench load` does when requests fail."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from attnbench.runner.datasets import BenchRequest
from attnbench.runner.loadgen import ClientStats, LoadConfig, RequestRecord, run_load
from attnbench.runner.metrics import first_error, summarize
from attnbench.runner.serverlog import LogWindow, cuda_graph_modes, jit_compiles
from attnbench.runner.witness import Snapshot, between

def metrics_page(ttft_buckets: dict[str, float], ttft_sum_s: float, generation_tokens: float) -> str:
    """A vLLM /metrics page with a TTFT histogram (cumulative counts by bucket bound) and
    the generated-tokens counter."""
    lines = ["# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {n}'
              for le, n in ttft_buckets.items()]
    lines += [f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft_buckets["+Inf"]}',
              f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum_s}',
              "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
              "# TYPE vllm:generation_tokens_total counter",
              f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {generation_tokens}']
    return "\n".join(lines) + "\n"


METRICS_BEFORE = metrics_page({"0.1": 2.0, "0.5": 2.0, "1.0": 2.0, "+Inf": 2.0}, 0.1, 100.0)
METRICS_AFTER = metrics_page({"0.1": 2.0, "0.5": 4.0, "1.0": 6.0, "+Inf": 6.0}, 2.5, 1100.0)


def test_server_metrics_between_two_scrapes():
    got = between(Snapshot.parse(METRICS_BEFORE), Snapshot.parse(METRICS_AFTER))
    assert got["ttft_count"] == 4
    assert got["mean_ttft_ms"] == pytest.approx(600.0)  # (2.5 - 0.1) s / 4 requests
    # 2 new requests in (0.1, 0.5], 2 in (0.5, 1.0]: the median sits at the 0.5 s edge
    assert got["median_ttft_ms"] == pytest.approx(500.0)
    assert got["generation_tokens"] == 1000


LOG = """\
(EngineCore pid=1) INFO [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: model='m', \
compilation_config={'level': 3, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'x': 1}
(EngineCore pid=1) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##| 51/51
(EngineCore pid=1) Capturing CUDA graphs (decode, FULL): 100%|##| 35/35
"""
COMPILE = ("(EngineCore pid=1) WARNING 11-23 10:00:00 [jit_monitor.py:140] Triton kernel JIT compilation "
           "during inference: qblock_attention_kernel. This causes a latency spike; consider extending warmup")


@contextmanager
def loopback(handler: type[BaseHTTPRequestHandler]):
    """An HTTP server on a free loopback port answering with ``handler``, in a thread, for
    the ``with`` block: yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def metrics_answers(answers: list[tuple[int, str]], hits: list[str]) -> type[BaseHTTPRequestHandler]:
    """A handler whose GETs give ``answers`` (status, body) in turn, the last one from then
    on, each path it was asked for appended to ``hits``."""

    class Handler(QuietHandler):
        def do_GET(self):
            status, body = answers[min(len(hits), len(answers) - 1)]
            hits.append(self.path)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

    return Handler


@pytest.mark.parametrize("answers, parsed, gets", [
    # vLLM with several API servers answers 500 while a process creates its metrics file
    ([(500, "struct.error"), (500, "struct.error"), (200, METRICS_AFTER)], True, 3),
    ([(500, "struct.error")], False, 3),  # failing every time: no page, after three tries
    ([(404, "Not Found")], False, 1),  # no such page: not tried again
    ([(200, "vllm:x{ not a metric")], False, 1),
])
def test_scrape_tries_a_failing_metrics_page_again(monkeypatch, answers, parsed, gets):
    from attnbench.runner import witness

    monkeypatch.setattr(witness, "SCRAPE_RETRY_S", 0.01)
    hits = []
    with loopback(metrics_answers(answers, hits)) as url:
        snap = witness.scrape(url)
    assert (snap is not None) == parsed and len(hits) == gets and set(hits) == {"/metrics"}
    if parsed:
        assert snap.counters["generation_tokens"] == 1100.0


@pytest.mark.parametrize("server, sent, received, foreign", [
    ({"requests": 4.0, "generation_tokens": 64.0}, 4, 64, ""),
    ({"requests": 3.0, "generation_tokens": 48.0}, 4, None, ""),  # one failed before the server finished it
    ({"requests": 5.0, "generation_tokens": 80.0}, 4, 64, "the server finished 5 requests during the load, "
                                                          "which sent 4"),
    ({"requests": 4.0, "generation_tokens": 70.0}, 4, 64, "the server generated 70 tokens during the load, "
                                                          "which received 64"),  # another still running
    ({"requests": 4.0, "generation_tokens": 70.0}, 4, None, ""),  # counts unknown: only requests compared
    (None, 4, 64, ""),  # no /metrics: nothing to compare
])
def test_foreign_work_is_what_the_server_did_beyond_the_load(server, sent, received, foreign):
    from attnbench.runner.witness import foreign_work

    got = foreign_work(server, sent, received)
    assert got.startswith(foreign) and bool(got) == bool(foreign)


class ServedCounts:
    """What `counting_handler` served, and another client's ``extra`` work on its server."""

    def __init__(self, extra_requests: int = 0, extra_tokens: int = 0):
        self.extra_requests, self.extra_tokens = extra_requests, extra_tokens
        self.requests = self.tokens = 0
        self.lock = threading.Lock()


def counting_handler(counts: ServedCounts) -> type[BaseHTTPRequestHandler]:
    """An OpenAI completions server (streamed, one token per event, usage last) with a
    vLLM-style /metrics page that counts the requests and tokens it served, plus, once it
    has served one, ``counts``' extra of each: another client's work during the load."""

    class Handler(QuietHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["max_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(n):
                self.wfile.write(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n')
            usage = {"prompt_tokens": 8, "completion_tokens": n}
            with counts.lock:  # before the last event; the requests run in threads at once
                counts.requests, counts.tokens = counts.requests + 1, counts.tokens + n
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())

        def do_GET(self):
            during = counts.requests > 0  # the other client's work came during the load
            page = ("# TYPE vllm:request_success_total counter\n"
                    f"vllm:request_success_total{{finished_reason=\"length\"}} "
                    f"{counts.requests + during * counts.extra_requests}\n"
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total {counts.tokens + during * counts.extra_tokens}\n")
            self.send_response(200)
            self.end_headers()
            self.wfile.write(page.encode())

    return Handler


@pytest.mark.parametrize("extra_requests, extra_tokens, shared, degraded", [
    (0, 0, False, ""),
    (1, 16, False, "the server finished 5 requests during the load, which sent 4"),
    (0, 7, False, "the server generated 71 tokens during the load, which received 64"),
    (1, 16, True, ""),  # --shared-server: other clients on purpose
])
def test_a_load_the_server_served_beside_another_client_is_degraded(tmp_path, extra_requests, extra_tokens,
                                                                     shared, degraded):
    """`attnbench load` against a server whose /metrics count more work than the load sent:
    degraded (exit 1, said in one line, summary.json says why) unless --shared-server."""
    from attnbench.cli import main
    from attnbench.runner.models import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    with loopback(counting_handler(ServedCounts(extra_requests, extra_tokens))) as url:
        result = CliRunner().invoke(main, ["load", "--url", url, "--model", "m", "--tokenizer", str(tiny),
                                           "--num-prompts", "4", "--output-len", "16", "--out", str(tmp_path / "out"),
                                           *(["--shared-server"] if shared else [])])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 4 and summary["total_output_tokens"] == 64
    assert summary["server_metrics"]["requests"] == 4 + extra_requests
    if degraded:
        assert result.exit_code == 1 and summary["status"] == "degraded" and summary["error"].startswith(degraded)
        assert f"error: degraded load: {degraded}" in result.output
    else:
        assert result.exit_code == 0 and summary["status"] == "ok", result.output


def test_server_log_graph_modes_and_compiles_in_a_window(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG)
    assert cuda_graph_modes(log.read_text()) == {"configured": "FULL_AND_PIECEWISE", "captured": ["PIECEWISE", "FULL"]}
    assert cuda_graph_modes("INFO eager mode") == {"configured": None, "captured": []}
    window = LogWindow(log)
    assert jit_compiles(window.lines()) == []
    with log.open("a") as fh:
        fh.write("(APIServer pid=2) INFO 200 OK\n" + COMPILE + "\n")
    events = jit_compiles(window.lines())
    assert len(events) == 1 and events[0].startswith("WARNING") and "qblock_attention_kernel" in events[0]
    assert jit_compiles(LogWindow(log).lines()) == []  # a window opened now sees nothing yet


def _record(i, status="ok", error="", sent=0.0, chunks=(0.1, 0.2), coalesced=0):
    return RequestRecord(i, "measure", 5, 2, 0.0, sent_s=sent, chunk_s=list(chunks), chunk_tokens=[1, 1],
                         coalesced=coalesced, end_s=0.3, prompt_tokens=5, completion_tokens=2,
                         status=status, error=error)


def test_summary_keeps_failures_apart_and_names_the_first():
    recs = [_record(0), _record(1, "error", "ClientConnectorError: refused\n  at x", sent=0.2, chunks=()),
            _record(2, "error", "TimeoutError: 600 s", sent=0.1, chunks=()), _record(3, coalesced=1)]
    s = summarize(recs, loop_lag_ms=[0.1, 0.2, 5.0])
    assert s["completed"] == 2 and s["failed"] == 2 and s["total_output_tokens"] == 4
    assert s["first_error"] == first_error(recs) == "TimeoutError: 600 s"  # the earliest sent
    assert s["client_coalesced_chunks"] == pytest.approx(0.25)
    assert s["client_loop_lag_ms"]["max"] == 5.0 and s["client_loop_lag_ms"]["p50"] == pytest.approx(0.2)
    assert json.loads(_record(0, error="é").to_json())["error"] == "é"


def test_event_loop_lag_is_seen():
    """A blocking call inside the client's loop shows up as lag."""
    import time

    from attnbench.runner.loadgen import watch_loop

    stats = ClientStats()

    async def main():
        watch = asyncio.create_task(watch_loop(stats))
        await asyncio.sleep(0.03)
        time.sleep(0.05)  # the loop can run nothing else meanwhile
        await asyncio.sleep(0.02)
        watch.cancel()

    asyncio.run(main())
    assert max(stats.loop_lag_ms) > 30


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_load_against_nothing_fails_in_one_line(tmp_path):
    from attnbench.cli import main
    from attnbench.runner.models import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    url = f"http://127.0.0.1:{_closed_port()}"
    result = CliRunner().invoke(main, ["load", "--url", url, "--model", "m", "--tokenizer", str(tiny),
                                       "--num-prompts", "4", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and f"all 4 requests to {url} failed" in lines[0]
    assert "Cannot connect" in lines[0] or "refused" in lines[0].lower()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["completed"] == 0 and summary["failed"] == 4
    assert summary["client_processes"] == 1  # auto: 4 requests in flight at most
    # the CPU this (Linux) machine lost meanwhile: steal always counted, never negative
    assert summary["client_host"]["steal_s"] >= 0.0


def test_load_client_processes_must_be_a_count_or_auto(tmp_path):
    from attnbench.cli import main

    for bad in ("0", "65", "many"):
        result = CliRunner().invoke(main, ["load", "--url", "http://127.0.0.1:9", "--model", "m",
                                           "--tokenizer", str(tmp_path), "--client-processes", bad,
                                           "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and "--client-processes" in result.output, result.output
        assert "expected a count from 1 to 64 or 'auto'" in result.output


def load_against(routes: dict, requests: list[BenchRequest]) -> list[RequestRecord]:
    """`run_load` of ``requests``, all due at once, against a loopback aiohttp server with
    ``routes`` (path -> handler: POST for /v1/completions, GET otherwise)."""
    from aiohttp import web

    async def main():
        app = web.Application()
        for path, handler in routes.items():
            (app.router.add_post if path == "/v1/completions" else app.router.add_get)(path, handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            return await run_load(LoadConfig(url, "m"), requests, [0.0] * len(requests), lambda r: None)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_run_load_marks_reads_that_carry_several_chunks():
    from aiohttp import web

    async def burst(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
        await resp.write(chunk)
        await asyncio.sleep(0.05)
        await resp.write(chunk * 3)  # three events in one write: one read
        await resp.write(b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4}}\n\n'
                         b"data: [DONE]\n\n")
        return resp

    (rec,) = load_against({"/v1/completions": burst}, [BenchRequest("p", 1, 4)])
    assert rec.status == "ok" and len(rec.chunk_s) == 4
    assert rec.coalesced == 2 and rec.chunk_s[1] == rec.chunk_s[2] == rec.chunk_s[3]


def test_host_counters_difference_what_the_machine_lost():
    """`host_counters` reads the kernel's cumulative counters (this machine is Linux: steal
    from /proc/stat, in seconds, growing); `host_between` differences those read both times
    and leaves out the others."""
    from attnbench.runner.host import host_between, host_counters

    first = host_counters()
    assert first["steal_s"] >= 0.0 and host_counters()["steal_s"] >= first["steal_s"]
    assert host_between({"steal_s": 1.0, "cpu_stall_s": 2.0}, {"steal_s": 1.25}) == {"steal_s": 0.25}
    assert host_between({}, first) == {}
