"""The registered kernels by name: the one list that every table of variants derives from.

Each kernel is one module that declares ``STEP = config.Step(name, paper, launch,
default_config)`` beside its code: the paper's steps in `steps/`, and kernels written for one
GPU generation in `hopper/`. This registry only maps names to those modules, so it loads
neither torch nor triton: recipes check ``serve.kernel_variant`` against it on hosts without
a GPU stack. A new kernel is one new file and one line below.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

# name -> module under attnbench.kernels: the paper's steps in its order, then the rest
KERNEL_MODULES = {
    "naive": "steps.naive",  # sec. 4.3, Listing 3
    "qblock": "steps.qblock",  # sec. 4.4 + 4.6, Listing 4
    "parallel_tiled": "steps.parallel_tiled",  # sec. 4.5, Listing 5
    "static_grid": "steps.static_grid",  # sec. 4.7
    "qblock_ws": "hopper.qblock_ws",  # the Q-block step in Gluon for Hopper, warp-specialized (sm_90)
}
VARIANTS: tuple[str, ...] = tuple(KERNEL_MODULES)
STEPS: tuple[str, ...] = tuple(n for n, module in KERNEL_MODULES.items() if module.startswith("steps."))
AUTO = "auto"  # the heuristics pick the kernel and its config per batch
CHOICES: tuple[str, ...] = (AUTO, *VARIANTS)  # what a caller or a recipe may name


def check_variant(name: str, what: str = "variant") -> str:
    """``name`` if it is 'auto' or a registered kernel; else ValueError naming ``what`` and the choices."""
    if name not in CHOICES:
        raise ValueError(f"{what}: expected {AUTO!r} or one of {list(VARIANTS)}, got {name!r}")
    return name


@lru_cache(maxsize=None)  # on every kernel call's path: a dict lookup, not an import
def step(name: str):
    """The `config.Step` of a registered kernel (imports its module, and with it torch and
    triton); ValueError where this Triton cannot load it (Gluon's Hopper API missing)."""
    if name not in KERNEL_MODULES:
        raise ValueError(f"variant: expected one of {list(VARIANTS)}, got {name!r}")
    try:
        return importlib.import_module(f"{__package__}.{KERNEL_MODULES[name]}").STEP
    except ImportError as e:
        raise ValueError(f"variant {name!r} cannot load with this Triton: {e}") from None
