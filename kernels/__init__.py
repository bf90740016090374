"""attnbench.kernels: Triton paged-attention kernels, one per step of the paper.

    steps/      the paper's steps, one module each, and the Triton blocks they share
    dispatch/   which step and config runs a batch (heuristics, split_kv, short_queries, trees),
                and the API (api)
    bench/      the harness: fp32 reference, PagedBatch, comparators, microbenchmark, tuner
    plugin/     the vLLM attention backend (CUSTOM) serving these kernels
    variants.py the steps by name; config.py KernelConfig and platform facts; schema.py the
                microbenchmark CSV's columns

Importing this package is free: torch and triton load only when a kernel symbol is used,
so `variants`, `schema` and `config` can be read by hosts without a GPU stack.
"""

import importlib

_LAZY = {
    "paged_attention": "dispatch.api",
    "paged_attention_reference": "bench.reference",
    "PagedBatch": "bench.batch",
    "KernelConfig": "config",
    "choose_config": "dispatch.heuristics",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
