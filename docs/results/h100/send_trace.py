"""When each request of a load client really left: aiohttp's own trace events, per request.

    python3 send_trace.py PREFIX SCRIPT.py ARGS...      run a script as __main__, traced
    python3 send_trace.py PREFIX -m MODULE ARGS...      run a module as __main__, traced

e.g. `send_trace.py r1.sent -m attnbench.cli load ...` or `send_trace.py r1.sent
vllm_bench_serve.py ...`. Every aiohttp ClientSession the client opens gets a TraceConfig,
and every HTTP request it makes becomes one JSON line in PREFIX.PID.jsonl (one file per
process: attnbench's forked client processes inherit the patch), written when the
response's headers arrive, so a process that exits abruptly keeps what it had sent:

    id         the request's X-Request-Id (both clients send one: attnbench's
               <prefix><i>, kept in its record; vllm bench's <prefix><i>); null for requests without one (vllm bench's test
               prompt, attnbench's GET /v1/models that open connections)
    start      aiohttp began the request: usually the task step in which the client started
               its TTFT clock (attnbench's ``sent_s``, vllm bench's ``st``), but not always
               (one vllm bench request in 500 began 6 ms after its clock on the H100), so
               compare_clients.py counts the wait from each client's own clock
    conn       a connection was ready: taken from the pool or newly connected
    new_conn   true when it had to connect (TCP handshake with the server's API process)
    headers    the request's headers were written to the socket
    body       the request's body was written (aiohttp writes it from a task of its own)
    response   the response's headers arrived: vLLM's API server has taken the request in
               (parsed, tokenized, handed to the engine) and opened its stream

All are ``time.perf_counter()`` seconds (CLOCK_MONOTONIC: one clock for every process on
the host). A client's TTFT minus (headers - its clock's start) is its TTFT counted from the
moment the request was on the wire, the same point for both clients whatever each does
before it.
Tracing costs a few coroutine calls per request; the cross-check runs it on every client.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from types import SimpleNamespace

import aiohttp


class SendTrace:
    """Appends one JSON line per finished HTTP request to ``PREFIX.<pid>.jsonl``."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._pid = None
        self._file = None

    def _write(self, row: dict) -> None:
        if self._pid != os.getpid():  # a forked client process writes a file of its own
            self._pid = os.getpid()
            self._file = open(f"{self.prefix}.{self._pid}.jsonl", "a", buffering=1)
        self._file.write(json.dumps(row) + "\n")

    def config(self) -> aiohttp.TraceConfig:
        tc = aiohttp.TraceConfig()

        async def start(_session, ctx: SimpleNamespace, params):
            ctx.row = {"id": params.headers.get("X-Request-Id"), "start": time.perf_counter(),
                       "conn": None, "new_conn": False, "headers": None, "body": None}

        async def created(_session, ctx, _params):
            ctx.row["conn"], ctx.row["new_conn"] = time.perf_counter(), True

        async def reused(_session, ctx, _params):
            ctx.row["conn"] = time.perf_counter()

        async def headers(_session, ctx, _params):
            ctx.row["headers"] = time.perf_counter()

        async def body(_session, ctx, _params):
            ctx.row["body"] = time.perf_counter()  # the last chunk's time stays

        async def end(_session, ctx, _params):
            ctx.row["response"] = time.perf_counter()
            self._write(ctx.row)

        tc.on_request_start.append(start)
        tc.on_connection_create_end.append(created)
        tc.on_connection_reuseconn.append(reused)
        tc.on_request_headers_sent.append(headers)
        tc.on_request_chunk_sent.append(body)
        tc.on_request_end.append(end)
        return tc

    def install(self) -> None:
        """Give every ClientSession created from now on this trace as well as its own."""
        original = aiohttp.ClientSession.__init__
        trace = self

        def __init__(session, *args, trace_configs=None, **kwargs):
            original(session, *args, trace_configs=[*(trace_configs or []), trace.config()], **kwargs)

        aiohttp.ClientSession.__init__ = __init__


def main(argv: list[str]) -> None:
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        sys.exit("usage: send_trace.py PREFIX SCRIPT.py ARGS... | PREFIX -m MODULE ARGS...")
    SendTrace(argv[0]).install()
    if argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
