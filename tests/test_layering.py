"""DESIGN.md layering: runner and analysis (and the package's root modules, which serve all
three towers) never import torch/triton/vllm; kernels never import runner or analysis, and
only its vLLM plugin and comparator import vllm. Checked statically (every import
statement) and at run time (importing every runner/analysis module, the root modules and
the torch-free kernel modules leaves torch unloaded)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"runner": {"torch", "triton", "vllm"}, "analysis": {"torch", "triton", "vllm"},
             "kernels": {"attnbench.runner", "attnbench.analysis"}, ".": {"torch", "triton", "vllm"}}
ROOT_MODULES = ("cli", "validation")  # attnbench.cli, attnbench.validation: at the repository root


def _sources(package: str) -> list[Path]:
    if package == ".":
        return [ROOT / f"{m}.py" for m in ROOT_MODULES]
    return sorted((ROOT / package).rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved by its place)."""
    tree = ast.parse(path.read_text())
    package = ["attnbench", *path.parent.relative_to(ROOT).parts]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.add(node.module)
            else:  # from ..runner import x, from . import y
                base = package[:len(package) - (node.level - 1)]
                names.update([".".join(base + [node.module])] if node.module
                             else [".".join(base + [a.name]) for a in node.names])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_static_imports(package):
    bad = []
    for path in _sources(package):
        for name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


def test_vllm_is_imported_only_by_the_plugin_and_the_comparator():
    allowed = {"plugin/backend.py", "plugin/register.py", "plugin/vllm_cli.py",  # DESIGN.md
               "bench/implementations.py"}
    users = sorted(str(p.relative_to(ROOT / "kernels")) for p in (ROOT / "kernels").rglob("*.py")
                   if any(n == "vllm" or n.startswith("vllm.") for n in imported_modules(p)))
    assert set(users) <= allowed and "plugin/backend.py" in users, users


def test_runtime_imports_stay_light():
    modules = [f"attnbench.{pkg}.{p.stem}" for pkg in ("runner", "analysis")
               for p in sorted((ROOT / pkg).glob("*.py")) if p.stem != "__init__"]
    modules += [f"attnbench.{m}" for m in ROOT_MODULES]
    modules += ["attnbench.kernels.schema", "attnbench.kernels.variants", "attnbench.kernels.config"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "heavy = sorted(m for m in ('torch', 'triton', 'vllm') if m in sys.modules)\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"importing runner/analysis loaded {out.stdout.strip()}"
