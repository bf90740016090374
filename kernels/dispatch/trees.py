"""The fitted decision trees `auto` follows where one exists. `attnbench tune` measures a
config sweep and writes a tree next to this file (``tuned_<device>.py``, reading the batch
through `features`); when one exists for the current device it takes precedence over the
hand-written tree (`heuristics`). ``ATTNBENCH_TUNED_TREE`` overrides that choice: ``off``
runs the hand-written tree on every device (what a GPU without a fitted tree gets), a path
runs the tree in that file (one `attnbench tune --emit` just wrote)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from functools import lru_cache
from pathlib import Path


def _tuned_module(device_name: str) -> str:
    """Module name of a device's fitted tree: "NVIDIA H100 80GB HBM3" -> tuned_nvidia_h100_80gb_hbm3."""
    return "tuned_" + re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def tuned_tree_path(device_name: str) -> Path:
    """Where the package looks for the tree fitted for ``device_name`` (it may not exist)."""
    return Path(__file__).with_name(_tuned_module(device_name) + ".py")


TREE_ENV = "ATTNBENCH_TUNED_TREE"  # "off" | a fitted tree's .py file | unset: the device's own (module doc)


class TreeError(ValueError):
    """A file that is not a tree `attnbench tune --emit` wrote."""


def load_tree(path: str | Path):
    """The ``choose(shape, platform)`` of a fitted tree's file (`attnbench tune --emit`)."""
    path = Path(path)
    expected = "expected a tree written by `attnbench tune --emit` (a .py file with choose(shape, platform))"
    if not path.is_file():
        raise TreeError(f"{path}: no such file; {expected}")
    spec = importlib.util.spec_from_file_location(f"attnbench_tree_{path.stem}", path) if path.suffix == ".py" else None
    if spec is None:
        raise TreeError(f"{path}: not a Python file; {expected}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "choose", None)):
        raise TreeError(f"{path}: has no choose(shape, platform); {expected}")
    return module.choose


def tuned_tree(device_name: str):
    """The fitted tree ``auto`` follows here: ``ATTNBENCH_TUNED_TREE``'s, else the one that
    ships for this device, if any."""
    chosen = os.environ.get(TREE_ENV, "")
    if chosen == "off":
        return None
    return _tree_file(chosen) if chosen else _device_tree(device_name)


@lru_cache(maxsize=None)
def _tree_file(path: str):
    return load_tree(path)


@lru_cache(maxsize=None)
def _device_tree(device_name: str):
    """The tree `attnbench tune` fitted for this device, if one ships with the package."""
    if not device_name:
        return None
    try:
        module = importlib.import_module(f"{__package__}.{_tuned_module(device_name)}")
    except ModuleNotFoundError:
        return None
    return module.choose


def tree_name(device_name: str) -> str:
    """The fitted tree `tuned_tree` follows, as the ``why`` of a decision names it: the
    file ``ATTNBENCH_TUNED_TREE`` names, else the device's module."""
    return os.environ.get(TREE_ENV) or _tuned_module(device_name)
