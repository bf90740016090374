"""The host cost of the public API: what the default `paged_attention` call adds, on the
host, over launching the same kernel configuration through its step's launcher directly.

Both are called back to back ``calls`` times and timed before the device is synchronized.
The batches are small (their kernels take less time than a launch), so the device never
falls behind and the time per call is the host's: Python, argument checks, the config
choice, Triton's launcher. Rounds alternate between the two; medians are reported.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from ..config import Platform
from ..dispatch.api import paged_attention
from ..dispatch.heuristics import choose_config
from ..variants import AUTO, step
from .batch import PagedBatch
from .microbench import environment

# Llama-3-8B heads; a decode step and small mixed batches (kernels of a few microseconds):
# queries of at most 16 tokens (Triton's Q-block kernel), and a 32-token chunk (on an H100
# `auto` runs the Gluon kernel there)
CASES = {"decode-b1-ctx1k": [(1, 1023)], "mixed-b4": [(1, 300), (1, 700), (16, 0), (5, 60)],
         "mixed-b4-chunk32": [(1, 300), (1, 700), (32, 0), (5, 60)]}


@dataclass
class Overhead:
    case: str
    variant: str
    api_us: float  # host time per default `paged_attention` call
    bare_us: float  # host time per direct launch of the same config
    device: str

    @property
    def added_us(self) -> float:
        return self.api_us - self.bare_us

    def as_dict(self) -> dict:
        return {**asdict(self), "added_us": self.added_us}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_time_us(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Host microseconds per call of ``fn`` (module doc)."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    _sync(device)
    return elapsed / calls * 1e6


def _calls(case: str, variant: str, dev: torch.device) -> tuple[Callable[[], None], Callable[[], None]]:
    """The default API call and the bare launch of the same config, on one batch, compiled."""
    batch = PagedBatch.build(CASES[case], num_q_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                             dtype=torch.bfloat16, device=dev, seed=0)
    kwargs = batch.attention_kwargs()
    out = torch.empty_like(batch.q)
    config = choose_config(batch.shape, Platform.detect(dev), variant)
    launch = step(config.variant).launch
    args = (out, batch.q, batch.k_cache, batch.v_cache, batch.block_table, batch.cu_seqlens_q, batch.seq_lens)
    scale = batch.head_size ** -0.5

    def api():
        paged_attention(**kwargs, out=out, variant=variant)

    def bare():
        launch(*args, scale=scale, sliding_window=None, softcap=0.0, config=config,
               max_seqlen_q=batch.max_seqlen_q, max_seqlen_k=batch.max_seqlen_k)

    api(), bare()  # compile both before timing
    _sync(dev)
    return api, bare


def measure(case: str, variant: str = AUTO, *, device: str = "cuda", calls: int = 2000,
            rounds: int = 7) -> Overhead:
    dev = torch.device(device)
    api, bare = _calls(case, variant, dev)
    api_us, bare_us = [], []
    for _ in range(rounds):
        api_us.append(host_time_us(api, calls, dev))
        bare_us.append(host_time_us(bare, calls, dev))
    return Overhead(case, variant, statistics.median(api_us), statistics.median(bare_us), environment(dev)["device"])


def profile(case: str, variant: str = AUTO, *, device: str = "cuda", calls: int = 2000,
            top: int = 15) -> str:
    """Where the default call's host time goes: cProfile over ``calls`` calls, the ``top``
    functions by own time (profiling inflates every entry; read the ranking, not the
    absolute times)."""
    dev = torch.device(device)
    api, _ = _calls(case, variant, dev)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        api()
    profiler.disable()
    _sync(dev)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()
