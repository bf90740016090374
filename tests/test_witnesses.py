"""What a repeat records besides the client's own timings: the server's metrics (vLLM's
/metrics page as a third witness), kernel compiles in the server log, the client's event
loop lag and coalesced reads; and what `attnbench load` does when requests fail."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from pathlib import Path

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

    from attnbench.runner.loadgen import _watch_loop

    stats = ClientStats()

    async def main():
        watch = asyncio.create_task(_watch_loop(stats))
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


H100_DOCS = Path(__file__).parents[1] / "docs/results/h100"


def _docs_script(name: str):
    """A script of docs/results/h100 as a module (they import each other by file name)."""
    import importlib.util
    import sys

    sys.path.insert(0, str(H100_DOCS))
    try:
        spec = importlib.util.spec_from_file_location(name, H100_DOCS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(H100_DOCS))
    return module


def _cross_check_tree(root):
    """A burst/ load as cross-check.sh leaves it: attnbench, attnbench-p1 and vllm bench
    serve, two runs each, every server scrape reading the same /metrics pages (600 ms mean
    TTFT); attnbench's runs with gzipped per-request records (3 + 2 chunks, the second
    request answered first), vllm bench's with --save-detailed results (2 + 3 chunks, in
    order)."""
    load = root / "burst"
    server = between(Snapshot.parse(METRICS_BEFORE), Snapshot.parse(METRICS_AFTER))
    for client, i, ttft in (("attnbench", 1, 640.0), ("attnbench", 2, 660.0),
                            ("attnbench-p1", 1, 780.0), ("attnbench-p1", 2, 800.0)):
        run = load / client / f"r{i}"
        run.mkdir(parents=True)
        run.joinpath("summary.json").write_text(json.dumps({
            "request_rate": "inf", "output_throughput": 1000.0, "median_ttft_ms": ttft, "mean_ttft_ms": ttft,
            "median_itl_ms": 20.0, "mean_itl_ms": 20.0, "mean_tpot_ms": 20.0, "server_metrics": server}))
        records = "".join(json.dumps({"index": i, "phase": "measure", "chunk_s": c}) + "\n"
                          for i, c in enumerate(([0.1, 0.2, 0.3], [0.05, 0.2])))  # the second answered first
        run.joinpath("requests.jsonl.gz").write_bytes(gzip.compress(records.encode()))
    bench = load / "vllm-bench"
    bench.mkdir()
    for i, ttft in ((1, 800.0), (2, 820.0)):
        bench.joinpath(f"r{i}.json").write_text(json.dumps({
            "output_throughput": 1010.0, "median_ttft_ms": ttft, "mean_ttft_ms": ttft, "median_itl_ms": 20.2,
            "mean_itl_ms": 20.2, "mean_tpot_ms": 20.2, "ttfts": [0.8, 0.8], "itls": [[0.02], [0.02, 0.02]],
            "start_times": [10.0, 10.1]}))
        bench.joinpath(f"r{i}.before.prom").write_text(METRICS_BEFORE)
        bench.joinpath(f"r{i}.after.prom").write_text(METRICS_AFTER)
    (root / "prompts.json").write_text("[]")
    return load


def test_cross_check_verdict_sets_each_client_beside_the_server(tmp_path):
    """docs/results/h100/compare_clients.py on a tree of attnbench, attnbench held to one
    client process, and vllm bench serve: the criteria (medians within 5%, spread) for each
    attnbench beside vllm bench, and the third witness: each client's mean TTFT minus the
    server's own (600 ms here for every run, from the same /metrics pages)."""
    _cross_check_tree(tmp_path)
    text = "\n".join(_docs_script("compare_clients").report(tmp_path))
    assert "| output_throughput | 1,000.0 | 1,010.0 | -1.0% | 0.0% | 0.0% | pass" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% |" in text and "FAIL (|diff| 19.8% <= 5" in text
    # 650 and 810 ms over the server's 600; these pages have no ITL histogram: "-"
    assert "| attnbench | 600.0 | 0.0% | 50.0 | - |" in text and "| vllm-bench | 600.0 | 0.0% | 210.0 | - |" in text
    assert "| median_ttft_ms | 790.0 | 810.0 | -2.5% |" in text and "| attnbench-p1 | 600.0 | 0.0% | 190.0 | - |" in text
    # 3 + 2 chunks; first tokens against request order: reversed (-1) and in order (1)
    assert "| attnbench | r2 | 1,000 | 660.0 | 20.00 | 600.0 | - | 5 | -1.00 |" in text
    assert "| vllm-bench | r2 | 1,010 | 820.0 | 20.20 | 600.0 | - | 5 | 1.00 |" in text


def test_campaigns_on_several_hosts_are_read_apart_then_pooled(tmp_path):
    """compare_clients.py given two campaigns: each load under its campaign's name, then the
    rate both ran at pooled, with each load's own difference of the medians per criterion
    (attnbench's 640/660 ms against vllm bench's 800/820 ms: -19.8% in both)."""
    for host in ("host-a", "host-b"):
        _cross_check_tree(tmp_path / host)
    text = "\n".join(_docs_script("compare_clients").report(tmp_path / "host-a", tmp_path / "host-b"))
    assert "## host-a/burst (request rate inf req/s; 2 attnbench" in text and "## host-b/burst (" in text
    assert "pooled (host-a/burst/, host-b/burst/: 4 attnbench and 4 vllm bench serve runs)" in text
    assert "| host-a/burst | 2 | -1.0% | -19.8% | -1.0% | -1.0% |" in text
    assert "| host-b/burst | 2 | -1.0% | -19.8% | -1.0% | -1.0% |" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% |" in text.split("pooled")[-1]


def test_archived_cross_check_keeps_the_verdict(tmp_path):
    """archive_cross_check.py keeps r1's per-request records, only the chunk count of later
    runs, gzips the scrapes, drops prompts.json; compare_clients reads the same verdict."""
    _cross_check_tree(tmp_path / "full")
    _docs_script("archive_cross_check").archive(tmp_path / "full", tmp_path / "kept")
    kept = tmp_path / "kept" / "burst"
    assert (kept / "attnbench/r1/requests.jsonl.gz").exists() and not (kept / "attnbench/r2/requests.jsonl.gz").exists()
    assert (kept / "attnbench-p1/r2/chunks.txt").read_text() == "5\n"
    assert "itls" not in json.loads((kept / "vllm-bench/r2.json").read_text())
    assert (kept / "vllm-bench/r2.after.prom.gz").exists() and not (tmp_path / "kept/prompts.json").exists()
    compare = _docs_script("compare_clients")
    assert compare.report(tmp_path / "kept") == compare.report(tmp_path / "full")
    # --no-records, from the archived copy: no per-request file left, the same verdict
    _docs_script("archive_cross_check").archive(tmp_path / "kept", tmp_path / "lean", records=False)
    assert not list((tmp_path / "lean").rglob("requests.jsonl*")) and "itls" not in (tmp_path / "lean/burst/vllm-bench/r1.json").read_text()
    assert compare.report(tmp_path / "lean") == compare.report(tmp_path / "full")


def test_side_by_side_runs_are_compared_within_each_run_and_pair(tmp_path):
    """A load cross-check.sh ran side by side (SIDE_BY_SIDE=1, the marker file): besides the
    criteria over runs, each criterion's difference within each run, and the criteria over
    pairs of runs (a client's value for a pair: the mean of its two runs). The tree's r1 and
    r2 make one pair: attnbench 640 and 660 ms against vllm bench's 800 and 820 ms."""
    full = tmp_path / "full"
    side = _cross_check_tree(full).rename(full / "poisson-side")
    (side / "side-by-side").touch()
    (full / "prompts-a.json").write_text("[]")
    text = "\n".join(_docs_script("compare_clients").report(full))
    assert "## poisson-side (request rate inf req/s per client; 2 attnbench and 2 vllm bench serve runs, side by side)" in text
    assert "| r1 | -1.0 | -20.0 | -1.0 | -1.0 | - |" in text and "| r2 | -1.0 | -19.5 | -1.0 | -1.0 | - |" in text
    assert "| median over 1 pairs | -1.0 | -19.8 | -1.0 | -1.0 | - |" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% | 0.0% | 0.0% | FAIL" in text.split("criteria over the pairs")[1]
    _docs_script("archive_cross_check").archive(full, tmp_path / "kept")
    assert not list((tmp_path / "kept").glob("prompts*")) and (tmp_path / "kept/poisson-side/side-by-side").exists()


def _trace_sends(load):
    """send_trace.py's files for attnbench's and vllm bench's runs of a `_cross_check_tree`
    load: attnbench writes at once on open connections (0.2 ms wait; TTFTs 100 and 50 ms;
    its load started at 4.0 s on the trace's clock), vllm bench's first request waits 0.5 ms
    for aiohttp to start it and 300 ms to be written, its second 250 ms (TTFTs 800 ms each).
    Rows without an id (a GET /v1/models) or that match no request of the result are left
    out."""
    for i in (1, 2):
        run = load / "attnbench" / f"r{i}"
        records = "".join(json.dumps({"index": j, "phase": "measure", "sent_s": 1.0 + j, "chunk_s": c,
                                      "request_id": f"attnbench-5eed-{j}"}) + "\n"
                          for j, c in enumerate(([1.1, 1.2, 1.3], [2.05, 2.2])))
        run.joinpath("requests.jsonl.gz").write_bytes(gzip.compress(records.encode()))
    rows = {"attnbench": [{"id": f"attnbench-5eed-{j}", "start": 5.0 + j, "new_conn": False, "headers": 5.0002 + j,
                           "response": 5.01 + j} for j in (0, 1)]
            + [{"id": None, "start": 4.0, "new_conn": True, "headers": 4.1, "response": 4.2}],
            "vllm-bench": [{"id": "bench-ab12-0", "start": 10.0005, "new_conn": True, "headers": 10.3005,
                            "response": 10.32},
                           {"id": "bench-ab12-1", "start": 10.1, "new_conn": True, "headers": 10.35, "response": 10.36},
                           {"id": "bench-ab12-7", "start": 10.2, "new_conn": True, "headers": 10.4, "response": 10.5}]}
    warmup = load / "warmup"  # the load's unrecorded warm-up run: records, no repeat number, no trace
    warmup.mkdir()
    warmup.joinpath("requests.jsonl.gz").write_bytes(gzip.compress(records.encode()))
    (load / "sent").mkdir()
    for client, lines in rows.items():
        for i in (1, 2):
            text = "".join(json.dumps(r) + "\n" for r in lines)
            (load / "sent" / f"{client}-r{i}.4242.jsonl.gz").write_bytes(gzip.compress(text.encode()))


def test_traced_sends_count_ttft_from_the_write(tmp_path):
    """With send_trace.py's rows, each client's TTFT is also counted from its request's write:
    vllm bench's 800 ms less its 300.5/250 ms of connecting is 499.5/550 ms, attnbench's
    100/50 ms less 0.2 ms; the criterion is judged on those, and an archived copy
    (per-request records of r1 only) reads the same."""
    _trace_sends(_cross_check_tree(tmp_path / "full"))
    compare = _docs_script("compare_clients")
    text = "\n".join(compare.report(tmp_path / "full"))
    assert "| attnbench | r1 | 2 | 0% | 0.2 | 0.2 | 9.8 | 75.0 | 74.8 | 74.8 |" in text
    assert "| vllm-bench | r2 | 2 | 100% | 275.2 | 300.5 | 14.8 | 800.0 | 524.8 | 524.8 |" in text
    assert "| attnbench-p1 | r1 |" not in text.split("Where each client's TTFT clock starts")[1]
    assert "| vllm-bench | 524.8 | | | 0.0% | |" in text
    assert "| attnbench | 74.8 | -85.7% | 0.0% | 0.0% | FAIL (|diff| 85.7% <= 5; spread 0.0 <= 2.0) |" in text
    _docs_script("archive_cross_check").archive(tmp_path / "full", tmp_path / "kept")
    assert (tmp_path / "kept/burst/attnbench/r2/wire.json").exists()
    assert compare.report(tmp_path / "kept") == compare.report(tmp_path / "full")


def test_send_trace_times_each_request_of_a_real_client(tmp_path, monkeypatch):
    """send_trace.py on attnbench's own client against a small SSE server: one row per
    request with its id, in order start <= headers written <= response; the burst's
    requests found connections opened before the clock (GET /v1/models, rows without id)."""
    import aiohttp
    from aiohttp import web

    async def completions(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
                         b'data: {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}\n\n'
                         b"data: [DONE]\n\n")
        return resp

    async def models(_request):
        return web.json_response({"data": []})

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", aiohttp.ClientSession.__init__)  # undone after
    _docs_script("send_trace").SendTrace(str(tmp_path / "r1")).install()
    records = load_against({"/v1/completions": completions, "/v1/models": models},
                           [BenchRequest(f"p{i}", 1, 1) for i in range(3)])
    (trace,) = tmp_path.glob("r1.*.jsonl")
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    sent = {r["id"]: r for r in rows if r["id"]}
    assert sorted(sent) == sorted(r.request_id for r in records) and len(sent) == 3
    assert all(r["start"] <= r["conn"] <= r["headers"] <= r["body"] <= r["response"] for r in sent.values())
    assert not any(r["new_conn"] for r in sent.values())
    assert len(rows) - len(sent) == 3 and all(r["new_conn"] for r in rows if not r["id"])


def test_permutation_p_tells_a_client_difference_from_run_noise():
    """5 + 5 runs, every split enumerated: fully separated groups have medians 3 and 8, and
    only the 12 of the 252 splits that put 1-3 on one side and 8-10 on the other are as far
    apart (the smallest p five runs a side can give); interleaved ones are typical. Too many
    splits are sampled instead, with a fixed seed."""
    p = _docs_script("compare_clients").permutation_p
    assert p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(12 / 252)
    assert p([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) > 0.5
    assert p([1.0], [2.0, 3.0]) is None
    many = p([float(i) for i in range(18)], [i + 17.5 for i in range(18)], draws=2000)
    assert many == p([float(i) for i in range(18)], [i + 17.5 for i in range(18)], draws=2000) and many < 0.01


def test_pooled_burst_takes_the_servers_merging_out():
    """Two campaigns at one rate are pooled, and each criterion is fitted over the chunk count
    the client saw: here every run's TPOT is 100 ms - 2 ms per 1,000 chunks, +1 ms for
    attnbench and -1 ms for vllm bench, so the fit must give a slope of -2 and a difference
    of +2 ms net of the chunks with nothing left over, though the raw medians differ by less
    (the clients' runs saw different chunk counts)."""
    def run(chunks, offset):
        return {"chunks": chunks, "mean_tpot_ms": 100 - 2 * chunks / 1000 + offset,
                "median_itl_ms": 30.0 + offset, "median_ttft_ms": 2000.0, "output_throughput": 6000.0}

    ours = [run(c, +1) for c in (95_000, 99_000, 104_000)]
    theirs = [run(c, -1) for c in (96_000, 98_000, 103_000)]
    compare = _docs_script("compare_clients")
    text = "\n".join(compare._pooled("inf", [("burst", ours[:2], theirs[:2]),
                                                                     ("burst-2", ours[2:], theirs[2:])]))
    assert "pooled (burst/, burst-2/: 3 attnbench and 3 vllm bench serve runs)" in text
    assert "| mean_tpot_ms | -2.00 | " in text and "| +2.00 | -2.1% | 0.00 |" in text
    assert "| median_itl_ms | +0.00 | " in text  # a constant offset, no slope
    assert "| output_throughput | 6,000.0 | 6,000.0 | 0.0% |" in text
    # one burst alone gets the same fit; runs that all saw as many chunks give nothing to fit
    assert "| mean_tpot_ms | -2.00 | " in "\n".join(compare._net_of_merging(ours, theirs))
    assert compare._net_of_merging([run(95_000, 1)] * 2, [run(95_000, -1)] * 2) == []


def test_self_agreement_deals_one_clients_runs_into_halves():
    """A client's runs against themselves: steady runs always pass; with one outlier among
    six runs, each deal has it in one half (spread 200%, against 0% in the other), so the
    criterion holds exactly when the clean half is "ours": half the deals. Bimodal runs
    (3 at 20 ms, 3 at 40 ms) never give two halves with medians within 5%. Fewer than 6 runs:
    no verdict. The table names each client with runs enough."""
    compare = _docs_script("compare_clients")
    assert compare.self_agreement([100.0, 101.0] * 3) == 1.0
    assert compare.self_agreement([10.0] * 5 + [30.0]) == 0.5
    assert compare.self_agreement([20.0, 40.0] * 3) == 0.0
    assert compare.self_agreement([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    runs = [{"median_itl_ms": v, "output_throughput": 6000.0} for v in [10.0] * 5 + [30.0]]
    text = "\n".join(compare._self_agreement_table([("attnbench", runs), ("vllm-bench", runs[:5])]))
    assert "| metric | attnbench vs attnbench |" in text and "vllm-bench vs" not in text
    assert "| median_itl_ms | 0.50 |" in text and "| output_throughput | 1.00 |" in text
    assert "| median_ttft_ms | - |" in text


def test_host_witness_ranks_the_servers_ttft_against_the_hosts_speed(tmp_path):
    """compare_clients' "what moved the server": over the runs of a load, Spearman's rho of
    the server's mean TTFT with the server processes' CPU seconds, each client's CPU time
    per chunk, and the host's stolen seconds, all differenced from proc_cpu.py's real
    snapshot format. Here attnbench's CPU per chunk rises with the server's TTFT (rho 1),
    vllm bench's falls (rho -1), the host's steal and the probe's time rise with it
    everywhere (the probe's samples outside a run's snapshots are not its own); a client
    with under 5 runs gets no row."""
    compare, proc_cpu = _docs_script("compare_clients"), _docs_script("proc_cpu")
    snapshot = proc_cpu.descendants(__import__("os").getpid())
    assert snapshot and all({"comm", "cpu_s"} <= set(p) for p in snapshot.values())
    assert "steal_s" in proc_cpu.host()  # Linux /proc/stat always has the column
    load = tmp_path / "poisson"
    (load / "cpu").mkdir(parents=True)
    probe = [{"t": 1000.0 * i + 1, "ms": 2.0 + i} for i in range(1, 6)] + [{"t": 1000.0 * i + 500, "ms": 99.0}
                                                                         for i in range(1, 6)]
    (tmp_path / "host-probe.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in probe).encode()))
    clients = []
    for client, n, sign in (("attnbench", 5, 1), ("vllm-bench", 5, -1), ("attnbench-p1", 3, 1)):
        runs = []
        for i in range(1, n + 1):
            ttft = 40.0 + 5 * i
            before = {"host": {"time": 1000.0 * i, "steal_s": 100.0, "cpu_stall_s": 7.0},
                      "42": {"comm": "VLLM::EngineCor", "cpu_s": 10.0}}
            after = {"host": {"time": 1000.0 * i + 10, "steal_s": 100.0 + i},
                     "42": {"comm": "VLLM::EngineCor", "cpu_s": 30.0 + i}}
            for when, snap in (("before", before), ("after", after)):
                (load / "cpu" / f"{client}-r{i}.{when}.json").write_text(json.dumps(snap))
            own = {"cpu_s": 10.0 + sign * i, "wall_s": 30.0}
            (load / "cpu" / f"{client}-r{i}.client.json").write_text(json.dumps(own))
            runs.append({"repeat": i, "chunks": 900 if i == 5 else 1000, "server": {"mean_ttft_ms": ttft}})
        clients.append((client, runs))
    cpu = compare._cpu(load, "attnbench", 3)
    assert cpu == {"client": 13.0, "client_wall": 30.0, "steal_s": 3.0, "probe_ms": 5.0,
                   "VLLM::EngineCor": 23.0}  # no stall after: no stall
    text = "\n".join(compare._host_witness(load, clients))
    # every run saw 1,000 chunks but each client's r5 900: the more steal, the more merging;
    # with the ties the chunks rank at rho -0.64 (pandas' spearman agrees)
    assert "| the server's processes' CPU s | 1.00 | -0.64 | 13 |" in text
    assert "| attnbench's CPU us per chunk | 1.00 | - | 5 |" in text
    assert "| vllm-bench's CPU us per chunk | -1.00 | - | 5 |" in text
    assert "| host steal s | 1.00 | -0.64 | 13 |" in text and "attnbench-p1" not in text and "stall" not in text
    assert "| host probe ms (median in the run) | 1.00 | -0.64 | 13 |" in text
    assert compare._host_witness(load, [clients[2]]) == []  # 3 runs: nothing to rank
    # ties share a rank; two first tokens read at one instant give no order rather than an error
    assert compare.spearman([1, 2, 2, 3], [5, 7, 7, 9]) == 1.0 and compare._rank_correlation([0.5, 0.5]) is None


def test_net_of_server_takes_the_hosts_drift_out_of_both_clients():
    """Each latency criterion fitted over the server's own value in the same run: here the
    server's mean TTFT drifts 40-70 ms between runs and each client reads it + 8 ms
    (attnbench) or + 10 ms (vllm bench), TPOT = the server's ITL + 0.5 ms for both. The
    drift fell mostly on vllm bench's runs, so the raw medians differ by far more than the
    2 ms the fit finds at equal server timing, with nothing left over; a client with one
    run gives no fit."""
    def run(server_ttft, offset):
        return {"median_ttft_ms": server_ttft + offset, "mean_tpot_ms": server_ttft / 5 + 0.5,
                "server": {"mean_ttft_ms": server_ttft, "mean_itl_ms": server_ttft / 5}}

    ours = [run(t, 8.0) for t in (40.0, 42.0, 45.0)]
    theirs = [run(t, 10.0) for t in (50.0, 60.0, 70.0)]
    compare = _docs_script("compare_clients")
    text = "\n".join(compare._net_of_server(ours, theirs))
    assert "| median_ttft_ms | +1.00 | +1.00 | -2.00 | -2.9% | 0.00 |" in text  # of vllm bench's median, 60 + 10 ms
    assert "| mean_tpot_ms | +1.00 | +1.00 | +0.00 | +0.0% | 0.00 |" in text and "median_itl_ms" not in text
    assert compare._net_of_server(ours[:1], theirs) == []


def test_host_counters_difference_what_the_machine_lost():
    """`host_counters` reads the kernel's cumulative counters (this machine is Linux: steal
    from /proc/stat, in seconds, growing); `host_between` differences those read both times
    and leaves out the others."""
    from attnbench.runner.host import host_between, host_counters

    first = host_counters()
    assert first["steal_s"] >= 0.0 and host_counters()["steal_s"] >= first["steal_s"]
    assert host_between({"steal_s": 1.0, "cpu_stall_s": 2.0}, {"steal_s": 1.25}) == {"steal_s": 0.25}
    assert host_between({}, first) == {}
