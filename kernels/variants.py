"""The paper's kernel steps by name: the one list that every table of variants derives from.

Each step is one module of `steps/` that declares ``STEP = config.Step(name, paper, launch,
default_config)`` beside its kernels. This registry only maps names to those modules, so it
loads neither torch nor triton: recipes check ``serve.kernel_variant`` against it on hosts
without a GPU stack. A new step is one new file in `steps/` and one line below.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

# name -> module in attnbench.kernels.steps, in the paper's order
STEP_MODULES = {
    "naive": "naive",  # sec. 4.3, Listing 3
    "qblock": "qblock",  # sec. 4.4 + 4.6, Listing 4
    "parallel_tiled": "parallel_tiled",  # sec. 4.5, Listing 5
    "static_grid": "static_grid",  # sec. 4.7
}
VARIANTS: tuple[str, ...] = tuple(STEP_MODULES)
AUTO = "auto"  # the heuristics pick the step and its config per batch
CHOICES: tuple[str, ...] = (AUTO, *VARIANTS)  # what a caller or a recipe may name


def check_variant(name: str, what: str = "variant") -> str:
    """``name`` if it is 'auto' or a step; else ValueError naming ``what`` and the choices."""
    if name not in CHOICES:
        raise ValueError(f"{what}: expected {AUTO!r} or one of {list(VARIANTS)}, got {name!r}")
    return name


@lru_cache(maxsize=None)  # on every kernel call's path: a dict lookup, not an import
def step(name: str):
    """The `config.Step` of a variant (imports its module, and with it torch and triton)."""
    if name not in STEP_MODULES:
        raise ValueError(f"variant: expected one of {list(VARIANTS)}, got {name!r}")
    return importlib.import_module(f"{__package__}.steps.{STEP_MODULES[name]}").STEP
