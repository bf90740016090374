"""Shared test setup.

Kernel tests run on a CUDA/ROCm GPU when one is visible (``make test-gpu``) and otherwise
under Triton's CPU interpreter (``TRITON_INTERPRET=1``, set here before any kernel module
is imported, because ``triton.jit`` reads it at decoration time).
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("TRITON_INTERPRET") != "1":
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:
        pass

if os.environ.get("TRITON_INTERPRET") == "1":
    from interpreter_fixes import patch_bf16_dot

    patch_bf16_dot()


def pytest_collection_modifyitems(config, items):
    """GPU-only tests are deselected (not skipped) when kernels run in the interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    keep = [i for i in items if "gpu" not in i.keywords]
    dropped = [i for i in items if "gpu" in i.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny local model folder (config, random weights, a tokenizer), built once per module."""
    from attnbench.runner.models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def tok(tiny):
    """The tiny model's tokenizer."""
    from attnbench.runner.datasets import LocalTokenizer

    return LocalTokenizer(tiny)
