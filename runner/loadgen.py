"""The load generator: an asyncio + aiohttp client for OpenAI-compatible /v1/completions.

Requests stream (``stream: true``) with ``stream_options.include_usage``, as `vllm bench
serve` sends them. With ``per_chunk_usage`` they also ask for ``continuous_usage_stats``
(vLLM's usage in every chunk), so that a chunk carrying several tokens is counted exactly;
that is off by default because it is not free: serializing usage into every chunk loads
vLLM's API-server process, and at hundreds of streams on a fast GPU that process becomes
the bottleneck, merges tokens into late chunks and so changes the latencies being measured
(docs/crosscheck.md). Requests are released on an arrival schedule
(all at once, constant rate, Poisson or gamma gaps), in schedule order, and gated by an
optional concurrency limit; the requests due at the start get their connections before the
clock starts, so that a burst reaches the server at once and in order. Each request
becomes one `RequestRecord` handed to a sink as soon as it finishes (one JSONL line), so
an interrupted run keeps everything already measured.

Times are seconds from the load's start (``time.perf_counter``), recorded raw; metrics are
derived later (`metrics.py`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Literal

import aiohttp
import numpy as np

from .datasets import BenchRequest

try:  # orjson parses a chunk several times faster; the client's overhead is part of what we measure
    from orjson import dumps as _dumps
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the host
    from json import loads as _loads
    _dumps = None

LOOP_WATCH_PERIOD_S = 0.005
READ_TO_END_TIMEOUT_S = 1.0  # how long a finished stream's end may lag its [DONE] (_read_to_end)


@dataclass
class ClientStats:
    """The client's own health during a load: ``loop_lag_ms`` holds, every 5 ms, how late
    the event loop woke a timer (ms). A loop that lags delays every chunk it has not read
    yet, so its TTFT and ITL samples grow by up to that much."""

    loop_lag_ms: list[float] = field(default_factory=list)


async def watch_loop(stats: ClientStats) -> None:
    clock = time.perf_counter
    while True:
        due = clock() + LOOP_WATCH_PERIOD_S
        await asyncio.sleep(LOOP_WATCH_PERIOD_S)
        stats.loop_lag_ms.append(max(0.0, clock() - due) * 1e3)


@dataclass
class RequestRecord:
    """Everything measured about one request (times in s from the load's start).

    scheduled_s   when the arrival schedule said to send it
    dispatch_s    when the client's scheduler released it (schedule lag = dispatch - scheduled)
    sent_s        when it passed the concurrency gate and the HTTP request started (its TTFT
                  clock's start, as `vllm bench serve` starts its own)
    written_s     when its headers were on the socket (aiohttp's trace): ``written_s - sent_s``
                  is what the client spent before the server could see it (taking or opening a
                  connection, the event loop getting to the write); None if never written
    chunk_s       arrival time of every streamed chunk that carried choices
    chunk_tokens  tokens each of those chunks carried: from per-chunk usage when the server
                  sends it; else 1 each when the final usage equals the number of chunks,
                  and empty (unknown) when it does not
    coalesced     chunks that arrived in the same socket read as the chunk before them
                  (the client read late, or the server wrote them together): they share
                  one arrival time
    end_s         when the stream finished (or failed)
    prompt_tokens / completion_tokens   the server's final usage
    request_id    the ``X-Request-Id`` it was sent with (`LoadConfig.request_id_prefix`)
    conversation, turn
                  of a multi-turn load (runner/multiturn.py): which conversation, and which
                  of its user turns (1, 2, ...); None otherwise
    """

    index: int
    phase: Literal["warmup", "measure"]
    prompt_len: int
    output_len: int
    scheduled_s: float
    dispatch_s: float = 0.0
    sent_s: float = 0.0
    written_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    coalesced: int = 0
    end_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status: Literal["ok", "error", "timeout"] = "ok"  # timeout: `LoadConfig`'s limits ran out
    http_status: int | None = None
    error: str = ""
    request_id: str = ""
    conversation: int | None = None
    turn: int | None = None

    def to_json(self) -> str:
        """One JSON line; orjson serializes the dataclass directly (~20x faster than
        json + asdict), which matters because records are written from the event loop."""
        if _dumps is not None:
            return _dumps(self).decode()
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        return cls(**d)


def run_async(coro):
    """Run a coroutine to completion on uvloop when installed (vLLM installs it; ~20% more
    chunks/s for this client), else on asyncio's default loop. The garbage collector is
    paused meanwhile: its pauses would show up as client-made latency."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            import uvloop  # optional: vLLM installs it; plain asyncio otherwise
        except ImportError:
            return asyncio.run(coro)
        return uvloop.run(coro)
    finally:
        if was_enabled:
            gc.enable()


def arrival_offsets(n: int, rate: float, arrival: str, burstiness: float, seed: int) -> list[float]:
    """Scheduled send times (s after the start) of ``n`` requests at ``rate`` requests/s,
    drawn exactly as `vllm bench serve` draws them, so that with the same seed both clients
    send on the same schedule.

    ``inf`` sends all at time 0. Otherwise each request waits one gap after the one before
    (the first one too): ``constant`` gaps of 1/rate, ``poisson`` exponential gaps, ``gamma``
    gamma gaps of shape ``burstiness`` and mean 1/rate (vLLM's ``--burstiness``; 1 is
    Poisson, < 1 burstier), from NumPy's legacy generator seeded with ``seed`` as vLLM seeds
    it; the cumulative times are then rescaled so that the last one falls at n / rate.
    """
    if rate == float("inf"):
        return [0.0] * n
    if arrival == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        shape = 1.0 if arrival == "poisson" else burstiness
        gaps = np.random.RandomState(seed).gamma(shape, 1.0 / (rate * shape), size=n)
    times = np.cumsum(gaps)
    return (times * ((n / rate) / times[-1])).tolist()


@dataclass
class LoadConfig:
    base_url: str
    model: str
    ignore_eos: bool = True
    max_concurrency: int | None = None
    request_timeout_s: float = 600.0  # the most a request may take, first byte to last (s)
    idle_timeout_s: float = 60.0  # the most the server may send nothing while requests are in flight (s)
    temperature: float = 0.0
    per_chunk_usage: bool = False  # ask for usage in every chunk (module docstring: its cost)
    # Each request is sent with ``X-Request-Id: <prefix><index>`` (``<prefix>warmup-<index>``
    # in a warm-up), which vLLM takes as its request id, so its logs and traces name the
    # record's request. One fresh prefix per config, like `vllm bench serve`'s per run: two
    # loads on one server never share an id (vLLM's V0 engine refuses an id in flight).
    request_id_prefix: str = field(default_factory=lambda: f"attnbench-{secrets.token_hex(4)}-")
    # When the schedule's clock starts, as a wall-clock time (Unix epoch s; None: as soon as
    # the client is ready). Several clients given one start send as one load: e.g. two
    # clients side by side on one server, or clients on several hosts.
    start_at: float | None = None


# A load that waits for ``start_at`` opens its burst's connections this long before it
# (s): late enough that the server has not closed them as idle (uvicorn's keep-alive
# timeout, which vLLM sets to 5 s), early enough to open hundreds on one host.
CONNECT_LEAD_S = 2.0
# How long an idle kept-alive connection stays in the client's pool (s): under the server's
# own keep-alive timeout (vLLM's uvicorn: 5 s, VLLM_HTTP_TIMEOUT_KEEP_ALIVE), so that a
# request never takes a connection the server is closing. (aiohttp keeps them 15 s; a
# request that raced the server's close was lost: "Can not write request body".)
IDLE_CONNECTION_S = 4.0


def clock_start(ready: float, start_at: float | None) -> float:
    """The schedule's start on ``time.perf_counter``'s clock: ``ready`` (a perf_counter
    value), or ``start_at`` (Unix epoch s) if that is later."""
    if start_at is None:
        return ready
    due = time.perf_counter() + (start_at - time.time())
    if ready > due + 0.01:
        print(f"warning: ready {ready - due:.2f} s after --start-at; the schedule starts now", file=sys.stderr)
    return max(ready, due)


def _payload(cfg: LoadConfig, req: BenchRequest) -> dict:
    stream_options = {"include_usage": True}
    if cfg.per_chunk_usage:
        stream_options["continuous_usage_stats"] = True
    return {
        "model": cfg.model, "prompt": req.prompt, "max_tokens": req.output_len,
        "temperature": cfg.temperature, "stream": True, "ignore_eos": cfg.ignore_eos,
        "stream_options": stream_options,
    }


async def http_error(resp: aiohttp.ClientResponse) -> str:
    """One line for an answer other than 200: its status and reason, and what the body says
    where it is a message: vLLM's JSON error (``{"error": {"message": ...}}`` or
    ``{"message": ...}``) or short plain text. An HTML page is not repeated."""
    line = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
    try:
        text = (await resp.text(errors="replace")).strip()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return line
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
    else:
        message = None if text.startswith("<") else text
    return f"{line}: {' '.join(str(message).split())[:300]}" if message else line


class IdleWatch:
    """The load's read-idle timeout: the time of the last byte any stream received. When
    requests are in flight and the server has sent nothing for ``limit_s``, the server is
    taken for hung (stopped, deadlocked, its GPU gone): `run_load` stops the load and records
    the requests in flight as timed out. One clock for the whole load, because a healthy
    server sends nothing to a request that waits in its queue, sometimes for minutes, while
    it streams to the others."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.last = time.perf_counter()
        self.expired = False

    def heard(self) -> None:
        self.last = time.perf_counter()

    def silent_s(self) -> float:
        return time.perf_counter() - self.last

    def message(self) -> str:
        return (f"read-idle timeout: the server sent nothing for {self.limit_s:g} s while requests were in "
                "flight (benchmark.idle_timeout_s); the load was stopped")


async def stream_one(session: aiohttp.ClientSession, cfg: LoadConfig, req: BenchRequest,
                     rec: RequestRecord, t0: float, idle: IdleWatch | None = None,
                     text: list[str] | None = None) -> None:
    """Send one request and fill ``rec`` from its SSE stream (errors are recorded, not
    raised); every read tells ``idle`` that the server is alive; ``text`` gets the text of
    every chunk (the answer, for a conversation's history)."""
    clock = time.perf_counter
    rec.sent_s = clock() - t0
    seen_tokens = 0
    counted = True  # every chunk's tokens came from per-chunk usage
    done = False
    done_s = None  # when the read that brought [DONE] returned
    try:
        async with session.post(cfg.base_url + "/v1/completions", json=_payload(cfg, req),
                                headers={"X-Request-Id": rec.request_id}, trace_request_ctx=(rec, t0)) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                rec.status, rec.error = "error", await http_error(resp)
                return
            buffer = b""
            async for data in resp.content.iter_any():
                now = clock() - t0  # every event completed by this read arrived now
                if idle is not None:
                    idle.heard()
                buffer += data
                *events, buffer = buffer.split(b"\n\n")  # SSE events end with a blank line
                first_in_read = True
                for event in events:
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        done, done_s = True, now
                        break
                    chunk = _loads(payload)
                    usage = chunk.get("usage")
                    if chunk.get("choices"):
                        if text is not None:
                            text.append(chunk["choices"][0].get("text") or "")
                        rec.coalesced += not first_in_read
                        first_in_read = False
                        rec.chunk_s.append(now)
                        if usage and usage.get("completion_tokens") is not None:
                            rec.chunk_tokens.append(usage["completion_tokens"] - seen_tokens)
                            seen_tokens = usage["completion_tokens"]
                        else:
                            rec.chunk_tokens.append(1)
                            seen_tokens += 1
                            counted = False
                    if usage:
                        rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                        rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)
                if done:
                    break
            if not done:
                rec.status, rec.error = "error", "stream ended before [DONE]"
            elif not counted and rec.completion_tokens not in (None, len(rec.chunk_tokens)):
                rec.chunk_tokens = []  # some chunk carried several tokens; which, is unknown
            if done:
                await _read_to_end(resp)
    except asyncio.CancelledError:
        if done:  # a stream that brought [DONE] is complete while its end is read
            pass
        elif idle is not None and idle.expired:
            rec.status, rec.error = "timeout", idle.message()
        else:
            rec.status, rec.error = "error", "cancelled"
        raise
    except asyncio.TimeoutError:  # aiohttp's total timeout
        rec.status = "timeout"
        rec.error = (f"request timeout: no complete answer within {cfg.request_timeout_s:g} s "
                     "(benchmark.request_timeout_s)")
    except (aiohttp.ClientError, ValueError, ConnectionError) as e:
        rec.status, rec.error = "error", f"{type(e).__name__}: {e}"[:500]
    finally:
        rec.end_s = done_s if done_s is not None else clock() - t0


async def _read_to_end(resp: aiohttp.ClientResponse) -> None:
    """Read what is left of a stream after its [DONE] event.

    That is only the chunked body's closing empty chunk, but vLLM often sends it in a packet
    of its own, after [DONE]. aiohttp puts a connection back in the pool only when its
    response was read to the end, and closes it otherwise: without this read most requests
    of a load at a finite rate paid for a new connection (and the server for accepting
    it), where `vllm bench serve`, which reads every stream to its end, reuses one. A
    server that keeps the stream open after [DONE] gets its connection closed instead.
    """
    try:
        await asyncio.wait_for(resp.content.read(), READ_TO_END_TIMEOUT_S)
    except (asyncio.TimeoutError, aiohttp.ClientError):
        pass


def write_times() -> aiohttp.TraceConfig:
    """aiohttp's trace, setting each record's ``written_s`` when its request's headers are
    written (requests posted with ``trace_request_ctx=(record, t0)``)."""
    trace = aiohttp.TraceConfig()

    async def headers_sent(_session, ctx, _params) -> None:
        if isinstance(ctx.trace_request_ctx, tuple):
            rec, t0 = ctx.trace_request_ctx
            rec.written_s = time.perf_counter() - t0

    trace.on_request_headers_sent.append(headers_sent)
    return trace


async def open_connections(session: aiohttp.ClientSession, base_url: str, count: int) -> None:
    """Open ``count`` keep-alive connections to the server and leave them in ``session``'s
    pool: that many concurrent ``GET /v1/models``. A server that does not answer is left for
    the load's own requests to report."""
    async def one() -> None:
        try:
            async with session.get(base_url + "/v1/models") as resp:
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            pass

    await asyncio.gather(*(one() for _ in range(count)))


async def run_load(cfg: LoadConfig, requests: list[BenchRequest], offsets: Iterable[float],
                   sink: Callable[[RequestRecord], None], phase: str = "measure",
                   on_done: Callable[[RequestRecord], None] | None = None, *,
                   start: Callable[[], float] | None = None,
                   indices: list[int] | None = None,
                   stats: ClientStats | None = None) -> list[RequestRecord]:
    """Send ``requests`` at ``offsets`` (s after the start); every finished record goes to
    ``sink``. The start is now, or what ``start`` returns (a ``time.perf_counter()`` value):
    a function that blocks until a shared start, called once the HTTP session is open, so
    a client process is ready to send when the start arrives; ``cfg.start_at`` (wall
    clock) postpones either.

    Returns the records in request order; ``indices`` numbers them (default 0..n-1; a share
    of a larger load keeps its global numbers). ``stats`` collects the event loop's lag
    while the load runs. Cancelling the task records the requests in flight as errors
    ("cancelled") and still hands them to the sink.
    """
    offsets = list(offsets)
    if len(offsets) != len(requests):
        raise ValueError(f"offsets: expected {len(requests)} send times, got {len(offsets)}")
    indices = list(range(len(requests))) if indices is None else list(indices)
    gate = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0, force_close=False,
                                     keepalive_timeout=IDLE_CONNECTION_S)
    id_prefix = cfg.request_id_prefix + ("" if phase == "measure" else f"{phase}-")
    records = [RequestRecord(i, phase, r.prompt_len, r.output_len, scheduled_s=o, request_id=f"{id_prefix}{i}")
               for i, r, o in zip(indices, requests, offsets)]
    idle = IdleWatch(cfg.idle_timeout_s)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trace_configs=[write_times()]) as session:
        # The requests due at the start (a burst) get their connections now, before the
        # clock starts, so that at the start each one only has to be written. (Connecting
        # at the start made each client process connect all of its share before it wrote
        # any of it, and that time was counted in every request's TTFT.)
        first = min(offsets, default=0.0)
        due_at_start = sum(o <= first for o in offsets)
        if cfg.start_at is not None:
            await asyncio.sleep(max(0.0, cfg.start_at - CONNECT_LEAD_S - time.time()))
        await open_connections(session, cfg.base_url, min(due_at_start, cfg.max_concurrency or due_at_start))
        # a future t0 is fine: the releaser below sleeps until each request is due
        t0 = clock_start(time.perf_counter() if start is None else start(), cfg.start_at)

        sunk: set[int] = set()  # positions in ``records`` of the requests handed to the sink

        async def one(i: int, req: BenchRequest, rec: RequestRecord):
            if gate is not None:
                await gate.acquire()  # FIFO: requests released together are sent in order
            try:
                await stream_one(session, cfg, req, rec, t0, idle)
            finally:
                if gate is not None:
                    gate.release()
                sink(rec)  # only requests that were actually sent are recorded
                sunk.add(i)
                if on_done:
                    on_done(rec)

        tasks: list[asyncio.Task] = []

        async def dispatch():
            # One releaser walks the schedule in order, as `vllm bench serve`'s request
            # generator does. (A timer per request woke in arbitrary order when all were due
            # at once, e.g. at a start shared by several client processes, so the
            # concurrency gate admitted them out of order.) After each release it yields to
            # the loop, so the request is written before the next one is released: a burst
            # leaves in schedule order, and a request's ``sent_s`` is when it left. (Without
            # that, each client process started all of its share before writing any of it,
            # even on open connections, and the server took one process's share before
            # another's.) A request that finds the concurrency limit reached waits at the
            # gate, in release order, anyway: then the releaser goes on without yielding, so
            # that it never falls behind the gate. (Yielding for each of 1,024 requests queued
            # behind 1,024 busy streams took seconds, and slots freed meanwhile stood idle.)
            for i in sorted(range(len(records)), key=lambda i: records[i].scheduled_s):
                rec = records[i]
                await sleep_until(t0, rec.scheduled_s)
                rec.dispatch_s = time.perf_counter() - t0
                tasks.append(asyncio.create_task(one(i, requests[i], rec)))
                if gate is None or not gate.locked():
                    await asyncio.sleep(0)  # it can start now: let it send before the next one

        releaser = asyncio.create_task(dispatch())
        watch = asyncio.create_task(watch_loop(stats)) if stats is not None else None
        watchdog = asyncio.create_task(watch_idle(idle, lambda: [t for t in tasks if not t.done()], releaser))
        try:
            await releaser
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            if not idle.expired:  # cancelled from outside: Ctrl-C, or the caller's own cancel
                raise
        finally:
            pending = [releaser, *tasks, watchdog, *([watch] if watch else [])]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    if idle.expired:  # the requests the stopped load never sent: recorded, so the counts add up
        for i, rec in enumerate(records):
            if i not in sunk:
                rec.status, rec.error = "error", f"not sent: {idle.message()}"
                sink(rec)
                if on_done:
                    on_done(rec)
    return records


async def sleep_until(t0: float, due_s: float) -> None:
    """Sleep until ``due_s`` seconds after ``t0`` (a `time.perf_counter` reading), never
    less: the event loop may wake a timer up to a millisecond early, so it sleeps again."""
    while (delay := t0 + due_s - time.perf_counter()) > 0:
        await asyncio.sleep(delay)


async def watch_idle(idle: IdleWatch, in_flight: Callable[[], list[asyncio.Task]],
                     releaser: asyncio.Task | None = None) -> None:
    """Stop the load when the server has been silent for ``idle.limit_s`` with requests in
    flight (`IdleWatch`): the releaser and every request in flight are cancelled, and the
    requests record the timeout. A load with nothing in flight (between Poisson arrivals)
    is not idle: the clock restarts."""
    period = min(1.0, idle.limit_s / 10)
    while True:
        await asyncio.sleep(period)
        flying = in_flight()
        if not flying:
            idle.heard()
        elif idle.silent_s() > idle.limit_s:
            idle.expired = True
            for t in ([releaser] if releaser is not None else []) + flying:
                t.cancel()
            return
