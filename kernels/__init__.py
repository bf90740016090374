"""attnbench.kernels: Triton paged-attention kernels, one per step of the paper.

Importing this package is free: torch and triton load only when a kernel symbol is used,
so `attnbench.kernels.schema` can be read by hosts without a GPU stack.
"""

_LAZY = {
    "paged_attention": "api",
    "paged_attention_reference": "reference",
    "PagedBatch": "batch",
    "KernelConfig": "heuristics",
    "choose_config": "heuristics",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
