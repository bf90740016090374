"""The variant registry (kernels/variants.py) is the one list of the paper's steps: each
step's module declares itself, and every table of variants is derived from the registry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnbench.kernels.config import BatchShape, Platform
from attnbench.kernels.variants import AUTO, CHOICES, VARIANTS, check_variant, step

H100 = Platform("cuda", 132, "test")
SHAPES = [BatchShape(1, 1, 1, 13000, 32, 8, 128), BatchShape(64, 64, 1, 4096, 32, 8, 128),
          BatchShape(4, 8192, 2048, 2048, 32, 8, 128), BatchShape(32, 528, 512, 2048, 64, 8, 128)]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_step_declares_itself_beside_its_code(name):
    from attnbench.kernels.dispatch.heuristics import choose_config

    s = step(name)
    assert s.name == name and s.paper.startswith("sec. 4.") and callable(s.launch)
    for shape in SHAPES:
        config = s.default_config(shape, H100)
        assert config.variant == name and choose_config(shape, H100, name) == config


def test_every_table_of_variants_comes_from_the_registry():
    from attnbench.kernels.bench import implementations, spec
    from attnbench.kernels.bench.aot import representative_launches
    from attnbench.kernels.schema import COMPARATORS, HOPPER_KERNELS

    assert CHOICES == (AUTO, *VARIANTS)
    assert list(implementations.REGISTRY) == [*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS]
    assert spec.IMPLEMENTATIONS == (*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS)
    assert list(representative_launches()) == list(VARIANTS)
    with pytest.raises(ValueError, match=r"variant: expected 'auto' or one of \['naive', 'qblock', "
                                         r"'parallel_tiled', 'static_grid'\], got 'flash'"):
        check_variant("flash")


def test_the_registry_loads_without_torch():
    """Recipes check serve.kernel_variant against it on hosts without a GPU stack."""
    code = ("import sys, attnbench.kernels.variants, attnbench.kernels.config\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-1000:]
