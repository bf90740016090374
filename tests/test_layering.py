"""DESIGN.md layering: runner and analysis never import torch/triton/vllm; kernels never
import runner or analysis, and only its vLLM plugin and comparator import vllm. Checked statically (every import statement) and at run time
(importing every runner/analysis module leaves torch unloaded)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"runner": {"torch", "triton", "vllm"}, "analysis": {"torch", "triton", "vllm"},
             "kernels": {"attnbench.runner", "attnbench.analysis"}}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names.add(node.module)
            elif node.level == 2 and node.module:  # from ..runner import x
                names.add(f"attnbench.{node.module}")
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_static_imports(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, bad


def test_vllm_is_imported_only_by_the_plugin_and_the_comparator():
    allowed = {"vllm_backend.py", "vllm_plugin.py", "implementations.py"}  # DESIGN.md
    users = sorted(p.name for p in (ROOT / "kernels").glob("*.py")
                   if any(n == "vllm" or n.startswith("vllm.") for n in imported_modules(p)))
    assert set(users) <= allowed and "vllm_backend.py" in users, users


def test_runtime_imports_stay_light():
    modules = [f"attnbench.{pkg}.{p.stem}" for pkg in ("runner", "analysis")
               for p in sorted((ROOT / pkg).glob("*.py")) if p.stem != "__init__"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "import attnbench.kernels.schema\n"
            "heavy = sorted(m for m in ('torch', 'triton', 'vllm') if m in sys.modules)\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"importing runner/analysis loaded {out.stdout.strip()}"
