"""The streaming client against a fake OpenAI SSE server (unit tests of the client only)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import time

import numpy as np
import pytest
from aiohttp import web

from attnbench.runner.datasets import BenchRequest
from attnbench.runner.loadgen import LoadConfig, arrival_offsets, run_load
from attnbench.runner.metrics import summarize
from test_witnesses import load_against


def _chunk(text, completion_tokens=None, prompt_tokens=5):
    body = {"choices": [{"index": 0, "text": text}]}
    if completion_tokens is not None:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _final(n, prompt_tokens=5):
    return (b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                             "completion_tokens": n}}).encode()
            + b"\n\ndata: [DONE]\n\n")


class FakeServer:
    """Behaviour chosen by the prompt: ok | multi | multi-nousage | split | error500 | early |
    nousage | slow | paced (60 ms between chunks) | hang (one chunk, then silence) | late-end (the response ends 20 ms after
    [DONE], in a packet of its own, as vLLM's often does); "MODE#i" is MODE, told apart by i."""

    def __init__(self):
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies = []
        self.request_ids = []  # X-Request-Id of every completions request, in arrival order
        self.arrived = {}  # prompt -> time.perf_counter() when its request arrived
        self.connections_before = []  # per GET /v1/models: completions requests seen before it
        self.client_ports = []  # per completions request: the client's port (which connection)

    async def models(self, request):
        self.connections_before.append(len(self.bodies))
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        self.request_ids.append(request.headers.get("X-Request-Id"))
        self.client_ports.append(request.transport.get_extra_info("peername")[1])
        self.arrived[body["prompt"]] = time.perf_counter()
        mode, n = body["prompt"].split("#")[0], body["max_tokens"]  # "mode#i": the mode, told apart by i
        if mode == "error500":
            return web.Response(status=500, text="boom: engine dead")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if mode == "slow":
                await asyncio.sleep(0.05)
            if mode == "multi":  # 3 tokens per chunk, then 1
                done = 0
                while done < n:
                    step = min(3, n - done)
                    done += step
                    await resp.write(_chunk("abc"[:step], done))
                    await asyncio.sleep(0.002)
            elif mode == "split":
                for i in range(1, n + 1):
                    data = _chunk("x", i)
                    await resp.write(data[:7])
                    await asyncio.sleep(0.003)
                    await resp.write(data[7:])
            elif mode == "multi-nousage":  # 3 tokens per chunk, usage only at the end
                for done in range(0, n, 3):
                    await resp.write(_chunk("abc"[:min(3, n - done)]))
                    await asyncio.sleep(0.002)
            elif mode == "paced":
                for i in range(1, n + 1):
                    await resp.write(_chunk("p", i))
                    await asyncio.sleep(0.06)
            elif mode == "nousage":
                for _ in range(n):
                    await resp.write(_chunk("y"))
            elif mode == "hang":  # one token, then nothing: a server that stopped
                await resp.write(_chunk("h", 1))
                await asyncio.sleep(5)  # (the fake's cleanup waits for it)
            else:
                for i in range(1, n + 1):
                    await resp.write(_chunk("t", i))
                    await asyncio.sleep(0.001)
                    if mode == "early" and i == 2:
                        return resp  # connection closed without [DONE]
            await resp.write(_final(n))
            if mode == "late-end":
                await asyncio.sleep(0.02)
            return resp
        finally:
            self.in_flight -= 1


async def _start(fake: FakeServer) -> tuple[web.AppRunner, str]:
    """Serve ``fake`` on a free loopback port: (runner to clean up, base URL)."""
    app = web.Application()
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_get("/v1/models", fake.models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)  # a burst's SYNs must not overflow it (1 s retry)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _with_server(fn):
    fake = FakeServer()
    runner, url = await _start(fake)
    try:
        return fake, await fn(url)
    finally:
        await runner.cleanup()


def load(requests, offsets=None, **cfg):
    records = []

    async def go(url):
        return await run_load(LoadConfig(url, "m", **cfg), requests, offsets or [0.0] * len(requests),
                              sink=records.append)

    fake, returned = asyncio.run(_with_server(go))
    return fake, returned, records


def test_payload_asks_for_streamed_usage_and_ignore_eos():
    fake, recs, _ = load([BenchRequest("ok", 3, 4)], ignore_eos=True)
    body = fake.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 4
    assert body["stream_options"] == {"include_usage": True}  # as vllm bench serve asks
    r = recs[0]
    assert r.status == "ok" and r.completion_tokens == 4 and r.prompt_tokens == 5
    assert len(r.chunk_s) == 4 and r.chunk_tokens == [1, 1, 1, 1]
    assert r.sent_s <= r.chunk_s[0] <= r.chunk_s[-1] <= r.end_s


def test_each_request_carries_its_record_id():
    """The server is told each request's id (vLLM names the request by it in its logs): the
    config's prefix and the request's number, ``warmup-`` before it in a warm-up; another
    config (another load) gets another prefix."""
    records = []
    cfg = LoadConfig("", "m")

    async def go(url):
        cfg.base_url = url
        reqs = [BenchRequest(f"ok#{i}", 3, 2) for i in range(3)]
        await run_load(cfg, reqs[:1], [0.0], sink=records.append, phase="warmup")
        return await run_load(cfg, reqs, [0.0, 0.01, 0.02], sink=records.append, indices=[4, 5, 6])

    fake, _ = asyncio.run(_with_server(go))
    prefix = cfg.request_id_prefix
    assert re.fullmatch(r"attnbench-[0-9a-f]{8}-", prefix) and LoadConfig("", "m").request_id_prefix != prefix
    assert sorted(fake.request_ids) == sorted(r.request_id for r in records)
    assert sorted(fake.request_ids) == [f"{prefix}4", f"{prefix}5", f"{prefix}6", f"{prefix}warmup-0"]


def test_per_chunk_usage_is_asked_for_only_when_wanted():
    fake, _, _ = load([BenchRequest("ok", 3, 2)], per_chunk_usage=True)
    assert fake.bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_merged_chunks_without_per_chunk_usage_leave_counts_unknown():
    """3 tokens per chunk, usage only at the end: per-chunk ITL is still measured, the
    per-token split is not guessed."""
    _, recs, _ = load([BenchRequest("multi-nousage", 3, 7)])
    r = recs[0]
    assert r.status == "ok" and len(r.chunk_s) == 3 and r.completion_tokens == 7 and r.chunk_tokens == []
    s = summarize(recs)
    assert s["total_output_tokens"] == 7 and s["mean_itl_ms"] > 0 and s["mean_itl_per_token_ms"] is None


def test_multi_token_chunks_are_counted_per_token():
    _, recs, _ = load([BenchRequest("multi", 3, 7)])
    r = recs[0]
    assert r.chunk_tokens == [3, 3, 1] and r.completion_tokens == 7
    s = summarize(recs)
    assert s["max_chunk_tokens"] == 3
    # per-chunk ITL has 2 samples; per-token ITL spreads them over 3 + 1 tokens
    assert s["total_output_tokens"] == 7


def test_chunks_are_timed_as_they_arrive():
    """5 chunks sent 60 ms apart: the client's timestamps span most of the 240 ms between
    the first and the last (the in-process server leaves the client every gap to read in;
    the slack is for a loaded machine that stalls this process on one read)."""
    _, recs, _ = load([BenchRequest("paced", 3, 5)])
    r = recs[0]
    assert len(r.chunk_s) == 5 and r.chunk_s == sorted(r.chunk_s)
    assert r.chunk_s[-1] - r.chunk_s[0] >= 0.12, r.chunk_s


def test_chunk_split_across_reads_is_reassembled():
    _, recs, _ = load([BenchRequest("split", 3, 5)])
    r = recs[0]
    assert r.status == "ok" and len(r.chunk_s) == 5 and r.completion_tokens == 5


def test_http_500_is_recorded_with_the_body():
    _, recs, sunk = load([BenchRequest("error500", 3, 5), BenchRequest("ok", 3, 2)])
    bad = recs[0]
    assert bad.status == "error" and bad.http_status == 500 and "engine dead" in bad.error
    assert recs[1].status == "ok"
    assert len(sunk) == 2  # both reached the sink
    s = summarize(recs)
    assert s["completed"] == 1 and s["failed"] == 1 and "boom: engine dead" in s["errors"][0]


def test_stream_that_stops_early_is_an_error_but_keeps_its_chunks():
    _, recs, _ = load([BenchRequest("early", 3, 10)])
    r = recs[0]
    assert r.status == "error" and "before [DONE]" in r.error
    assert len(r.chunk_s) == 2


def test_without_per_chunk_usage_each_chunk_counts_one_token():
    _, recs, _ = load([BenchRequest("nousage", 3, 4)])
    assert recs[0].chunk_tokens == [1, 1, 1, 1] and recs[0].completion_tokens == 4


def test_max_concurrency_is_enforced():
    fake, recs, _ = load([BenchRequest("slow", 3, 2) for _ in range(12)], max_concurrency=3)
    assert fake.max_in_flight == 3
    assert all(r.status == "ok" for r in recs)


def test_schedule_is_followed_and_lag_recorded():
    offsets = [0.0, 0.05, 0.10, 0.15]
    _, recs, _ = load([BenchRequest("ok", 3, 1) for _ in offsets], offsets=offsets)
    lateness = [r.dispatch_s - due for r, due in zip(recs, offsets)]
    assert [r.scheduled_s for r in recs] == offsets
    # never early; late by little (the median: a loaded machine may stall any one request)
    assert min(lateness) >= 0 and statistics.median(lateness) < 0.05, lateness
    assert recs[-1].sent_s >= 0.15


@pytest.mark.parametrize("arrival", ["constant", "poisson", "gamma"])
def test_arrival_schedules(arrival):
    offs = arrival_offsets(2000, 10.0, arrival, 0.5, seed=3)
    assert offs == sorted(offs) and offs[0] > 0.0
    assert offs[-1] == pytest.approx(200.0)  # n / rate: mean rate 10 req/s exactly
    assert arrival_offsets(2000, 10.0, arrival, 0.5, seed=3) == offs  # seeded
    assert arrival_offsets(5, float("inf"), arrival, 1.0, 0) == [0.0] * 5


@pytest.mark.parametrize("rate,burstiness,arrival", [(20.0, 1.0, "poisson"), (7.5, 0.5, "gamma"),
                                                      (3.0, float("inf"), "constant")])
def test_arrival_schedule_equals_vllm_bench_serve(monkeypatch, rate, burstiness, arrival):
    """vLLM's own request generator (the installed vLLM's `vllm bench serve`), seeded as its
    main seeds it, sleeps exactly our gaps: both clients send on one schedule."""
    from vllm.benchmarks import serve

    now = [1000.0]
    slept = []

    async def fake_sleep(seconds):  # a clock that moves only when the generator sleeps
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(serve.time, "time", lambda: now[0])
    monkeypatch.setattr(serve.asyncio, "sleep", fake_sleep)

    async def drain():
        return [r async for r, _ in serve.get_request(list(range(40)), rate, burstiness)]

    np.random.seed(11)
    assert asyncio.run(drain()) == list(range(40))
    theirs = np.cumsum(slept)
    ours = arrival_offsets(40, rate, arrival, 1.0 if arrival == "constant" else burstiness, seed=11)
    assert len(slept) == 40 and np.allclose(theirs, ours, rtol=1e-9, atol=1e-9)


def test_gamma_burstiness_changes_the_spread():
    def cv(b):
        offs = arrival_offsets(4000, 10.0, "gamma", b, seed=1)
        gaps = [b - a for a, b in zip(offs, offs[1:])]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    assert cv(0.25) > 1.5 > cv(1.0) > 0.8 > cv(4.0)


class ThreadedFakeServer:
    """The fake server on its own thread and loop, for clients that block this thread."""

    def __enter__(self):
        import threading

        self.fake, self.loop = FakeServer(), asyncio.new_event_loop()
        started = threading.Event()

        async def serve():
            self.runner, self.url = await _start(self.fake)
            started.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(serve()),
                                                       self.loop.run_forever()), daemon=True)
        self.thread.start()
        started.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_client_processes_share_one_schedule_and_one_sink():
    from attnbench.runner.loadpool import concurrency_shares, run_load_processes

    assert concurrency_shares(10, 3) == [4, 3, 3] and concurrency_shares(None, 2) == [None, None]
    requests = [BenchRequest(f"ok-{i}", 3, 5) for i in range(30)]  # unknown prompts behave as "ok"
    offsets = [0.02 * i for i in range(30)]
    seen = []
    with ThreadedFakeServer() as srv:
        records = run_load_processes(LoadConfig(srv.url, "m", max_concurrency=7), requests, offsets,
                                     seen.append, processes=3)
        max_in_flight, arrived = srv.fake.max_in_flight, srv.fake.arrived
    assert [r.index for r in records] == list(range(30)) and sorted(r.index for r in seen) == list(range(30))
    assert all(r.status == "ok" and r.completion_tokens == 5 and len(r.chunk_s) == 5 for r in records)
    assert max_in_flight <= 7
    # Nobody leaves before its time, and each worker keeps to the schedule. Medians, not
    # maxima: a loaded CI machine may stall any one request for a while.
    lateness = [r.dispatch_s - r.scheduled_s for r in records]
    assert min(lateness) >= 0, lateness
    workers = [range(w, 30, 3) for w in range(3)]
    assert all(statistics.median(lateness[i] for i in share) < 0.05 for share in workers), lateness
    # One clock: seen from the server (this process), every worker's requests arrive at
    # the same time after their schedule, so no worker runs on a start of its own.
    behind = [statistics.median(arrived[f"ok-{i}"] - offsets[i] for i in share) for share in workers]
    assert max(behind) - min(behind) < 0.05, behind


@pytest.mark.parametrize("processes", [1, 2])
def test_a_load_given_a_start_waits_for_it_and_times_from_it(processes):
    """``start_at`` (wall clock) is the schedule's zero: no request leaves before it, the
    first leaves at it, and the records time from it, not from when the client was ready."""
    from attnbench.runner.loadpool import run_load_processes

    requests = [BenchRequest(f"ok-{i}", 3, 2) for i in range(6)]
    offsets = [0.0, 0.0, 0.05, 0.1, 0.15, 0.2]
    with ThreadedFakeServer() as srv:
        start_at = time.time() + 0.6
        start = time.perf_counter() + (start_at - time.time())  # the same instant on the server's clock
        records = run_load_processes(LoadConfig(srv.url, "m", start_at=start_at), requests, offsets,
                                     lambda _: None, processes=processes)
        arrived = [srv.fake.arrived[f"ok-{i}"] - start for i in range(6)]
    assert all(r.status == "ok" for r in records)
    assert min(arrived) >= 0, arrived  # nothing before the start
    assert arrived[0] < 0.1, arrived  # the burst at the start, not a wait later
    # the records' clock starts at start_at: they are late by little, not by the 0.6 s wait
    assert statistics.median(r.dispatch_s - r.scheduled_s for r in records) < 0.05


def test_a_start_in_the_past_is_refused(tmp_path):
    from click.testing import CliRunner

    from attnbench.cli import main

    result = CliRunner().invoke(main, ["load", "--url", "http://127.0.0.1:9", "--model", "m",
                                       "--tokenizer", str(tmp_path), "--start-at", str(time.time() - 30),
                                       "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--start-at" in result.output, result.output
    assert "s in the past" in result.output and not (tmp_path / "out").exists()


def test_auto_client_processes_follow_the_calibration():
    """One process per 128 requests in flight (the most the load can have: its concurrency
    limit, else its request count), at most 8 and at most half the CPUs; a count is kept."""
    from attnbench.runner.loadpool import auto_processes, resolve_processes

    assert [auto_processes(n, cpus=16) for n in (1, 128, 129, 256, 500, 1024, 5000)] == [1, 1, 2, 2, 4, 8, 8]
    assert auto_processes(1024, cpus=2) == 1 and auto_processes(1024, cpus=6) == 3
    assert resolve_processes("auto", 1000, 200) == auto_processes(200)
    assert resolve_processes("auto", 100, None) == auto_processes(100)
    assert resolve_processes(3, 1000, None) == 3


@pytest.mark.parametrize("processes", [1, 3])
def test_a_burst_is_admitted_in_request_order(processes):
    """All requests due at one (shared, future) start and a concurrency limit: the first
    wave is the first ``limit`` requests, as with `vllm bench serve`. (Timers woken in
    arbitrary order used to let later requests overtake earlier ones.)"""
    from attnbench.runner.loadpool import run_load_processes

    requests = [BenchRequest("slow", 3, 2) for _ in range(300)]
    with ThreadedFakeServer() as srv:
        records = run_load_processes(LoadConfig(srv.url, "m", max_concurrency=60), requests, [0.0] * 300,
                                     lambda r: None, processes=processes)
    first_done = min(r.end_s for r in records)
    assert sorted(r.index for r in records if r.sent_s < first_done) == list(range(60))
    for w in range(processes):  # and each client process sends its share in order
        share = records[w::processes]
        assert [r.sent_s for r in share] == sorted(r.sent_s for r in share)


def test_a_burst_goes_on_the_wire_one_request_at_a_time():
    """The releaser yields after each release, so a request is written (and the server
    has it) before the burst's last request is released, and the server takes them in
    order. (Each client process used to release its whole share before writing any of it,
    so on the H100 the server took one process's share of a burst before another's: from
    2 processes the first tokens came as 0, 2, 4, ..., 498, then 1, 3, ...) Client and
    server share one event loop here, so the server can only read what the client yields
    for: the check does not depend on the machine's load."""
    n = 50
    fake = FakeServer()

    async def go():
        runner, url = await _start(fake)
        try:
            t0 = time.perf_counter()
            return t0, await run_load(LoadConfig(url, "m"), [BenchRequest(f"ok-{i}", 3, 2) for i in range(n)],
                                      [0.0] * n, lambda r: None, start=lambda: t0)
        finally:
            await runner.cleanup()

    t0, records = asyncio.run(go())
    assert all(r.status == "ok" for r in records)
    first_arrival = min(fake.arrived.values()) - t0
    assert first_arrival < max(r.dispatch_s for r in records), (first_arrival, [r.dispatch_s for r in records])
    assert sorted(range(n), key=lambda i: fake.arrived[f"ok-{i}"]) == list(range(n))


def test_a_gated_burst_is_released_before_the_gate_opens_again():
    """Requests queued behind a full concurrency limit are all released at once and wait at
    the gate in order: the releaser never falls behind the gate. (It used to yield for
    every release, so behind 1,024 busy streams the last requests were released seconds
    late, `calibrate`'s schedule lag p99 was 7 s at 1,024 streams, and freed slots stood
    idle.) One event loop for client and server, so the count of loop turns is what decides,
    not the machine's load: the first request finishes a few turns after it is sent."""
    n, limit = 64, 2
    fake = FakeServer()

    async def go():
        runner, url = await _start(fake)
        try:
            return await run_load(LoadConfig(url, "m", max_concurrency=limit),
                                  [BenchRequest(f"nousage#{i}", 3, 2) for i in range(n)], [0.0] * n, lambda r: None)
        finally:
            await runner.cleanup()

    records = asyncio.run(go())
    assert all(r.status == "ok" for r in records)
    assert max(r.dispatch_s for r in records) < min(r.end_s for r in records)
    assert sorted(range(n), key=lambda i: fake.arrived[f"nousage#{i}"]) == list(range(n))
    assert fake.max_in_flight <= limit


@pytest.mark.parametrize("offsets,limit,opened", [([0.0] * 12, None, 12), ([0.0] * 12, 5, 5),
                                                  ([0.0, 0.0, 0.05, 0.1], None, 2)])
def test_requests_due_at_the_start_get_their_connections_first(offsets, limit, opened):
    """Before the clock starts, one connection per request due at the start (at most the
    concurrency limit) is opened and left in the pool, so at the start a burst is only
    written; later requests connect when they are sent."""
    fake, recs, _ = load([BenchRequest("ok", 3, 2) for _ in offsets], offsets, max_concurrency=limit)
    assert fake.connections_before == [0] * opened
    assert all(r.status == "ok" for r in recs)


def test_a_finished_stream_leaves_its_connection_for_the_next_request():
    """After [DONE] the client reads the response to its end, so the connection goes back to
    the pool: requests one after another use one keep-alive connection, as `vllm bench
    serve` does (a stream left unread at its end is closed, and every later request paid for
    a new connection and the server for accepting it)."""
    offsets = [0.0, 0.1, 0.2, 0.3, 0.4]
    fake, recs, _ = load([BenchRequest(f"late-end#{i}", 3, 6) for i in range(5)], offsets)
    assert all(r.status == "ok" and r.completion_tokens == 6 for r in recs)
    assert len(set(fake.client_ports)) == 1, fake.client_ports


def test_a_connection_idle_for_longer_than_the_server_keeps_it_is_not_reused():
    """A connection idle for `IDLE_CONNECTION_S` leaves the pool before the server's
    keep-alive timeout (vLLM: 5 s) closes it, so the next request connects anew instead of
    racing the server's close. (Here the server would keep it: two connections are the
    client's doing.)"""
    from attnbench.runner.loadgen import IDLE_CONNECTION_S

    offsets = [0.0, 0.1, 0.2 + IDLE_CONNECTION_S + 0.3]
    fake, recs, _ = load([BenchRequest(f"ok-{i}", 3, 2) for i in range(3)], offsets)
    assert all(r.status == "ok" for r in recs)
    assert IDLE_CONNECTION_S < 5.0  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    first, second, third = fake.client_ports
    assert first == second != third, fake.client_ports


def test_client_processes_ctrl_c_keeps_what_was_measured():
    import os
    import signal
    import threading

    from attnbench.runner.loadpool import run_load_processes

    requests = [BenchRequest("ok", 3, 4)] * 6 + [BenchRequest("ok", 3, 5000)] * 3  # short ones, then endless
    offsets = [0.0] * 6 + [0.2] * 3
    seen = []
    with ThreadedFakeServer() as srv:
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            run_load_processes(LoadConfig(srv.url, "m"), requests, offsets, seen.append, processes=3)
    done = {r.index: r for r in seen}
    assert all(done[i].status == "ok" for i in range(6))  # finished before Ctrl-C: kept
    assert {done[i].error for i in range(6, 9) if i in done} == {"cancelled"}
    assert len(done) == 9


@pytest.mark.parametrize("processes", [1, 2])
def test_calibrate_against_the_stub(processes):
    """The stub's TTFT is 0 and its ITL exactly the pace: what calibrate reports is the
    client's own cost, small on a quiet loopback, and every chunk is counted."""
    from attnbench.runner.calibrate import calibrate

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        c = calibrate(concurrency=8, requests=32, tokens=4, pace_ms=5.0, client_processes=processes)
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)  # calibrate pins this process; give the test worker its CPUs back
    assert c.client_processes == processes and c.chunks_per_s > 0
    assert 0 <= c.added_ttft_ms["p50"] < 1000 and 0 <= c.added_itl_ms["p50"] < 50
    assert "chunks/s on" in "\n".join(c.lines())


def test_several_stub_processes_share_one_port():
    """`calibrate --stub-processes N`: N stub processes on one port (SO_REUSEPORT), the
    kernel spreading connections over them, all gone afterwards."""
    import urllib.request

    from attnbench.runner.calibrate import STUB_PID_HEADER, StubServer

    stub = StubServer(cpus=[None, None])
    with stub as url:
        pids = {p.pid for p in stub.procs}
        seen = set()
        for _ in range(24):  # a new connection each: the kernel picks a process per connection
            request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps({"max_tokens": 1}).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                seen.add(int(response.headers[STUB_PID_HEADER]))
                assert b"[DONE]" in response.read()
    assert seen == pids, (seen, pids)
    assert stub.procs == [] and all(not os.path.exists(f"/proc/{pid}") for pid in pids)


def test_calibrate_with_two_stub_processes():
    from attnbench.runner.calibrate import calibrate

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        c = calibrate(concurrency=8, requests=32, tokens=4, pace_ms=5.0, stub_processes=2)
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
    assert c.stub_processes == 2 and c.chunks_per_s > 0 and "2 stub processes" in c.lines()[0]


def test_a_silent_server_stops_the_load_after_the_idle_timeout():
    """A server that stops sending: the load ends `idle_timeout_s` after the last byte,
    the requests in flight are recorded as timed out (the error names the timeout and its
    recipe field), the requests never sent as not sent, and every record reaches the sink."""
    _, recs, sunk = load([BenchRequest("hang", 3, 5), BenchRequest("ok", 3, 2)]
                         + [BenchRequest(f"hang#{i}", 3, 5) for i in range(4)],
                         max_concurrency=2, idle_timeout_s=0.6)
    assert max(r.end_s for r in recs) < 2.0  # s after the start: the timeout, not the 5 s hang
    statuses = [r.status for r in recs]
    assert statuses.count("timeout") >= 1 and "read-idle timeout" in recs[0].error
    assert "benchmark.idle_timeout_s" in recs[0].error
    assert any(r.error.startswith("not sent: read-idle timeout") for r in recs)
    assert len(sunk) == len(recs) == 6


def test_a_request_that_takes_too_long_times_out_by_name():
    """The total timeout (`request_timeout_s`): a stream that keeps sending, too slowly."""
    _, recs, _ = load([BenchRequest("paced", 3, 200)], request_timeout_s=0.3)
    assert recs[0].status == "timeout" and "request timeout" in recs[0].error
    assert "benchmark.request_timeout_s" in recs[0].error


def test_an_html_error_page_is_one_line_with_the_status():
    async def html(request):
        await request.read()
        return web.Response(status=501, text="<html><body><h1>501 Not Implemented</h1>...</body></html>",
                            content_type="text/html")

    (rec,) = load_against({"/v1/completions": html}, [BenchRequest("x", 1, 1)])
    assert rec.error == "HTTP 501 Not Implemented" and rec.http_status == 501
