"""The layering of docs/design.md: runner and analysis (and the package's root modules, which serve all
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
    allowed = {"plugin/backend.py", "plugin/register.py", "plugin/vllm_cli.py",  # docs/design.md
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


PACKAGES = ("runner", "analysis", "kernels")
ORDER = {"runner": 0, "analysis": 1}  # analysis may import runner; runner never imports analysis


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(["attnbench", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _top_level_imports(path: Path) -> set[str]:
    """What ``path`` imports at module level (a cycle is a problem only there), resolved."""
    tree = ast.parse(path.read_text())
    package = ["attnbench", *path.parent.relative_to(ROOT).parts]
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
            else:
                base = ".".join(package[:len(package) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module else base
                names.update([module] + [f"{module}.{a.name}" for a in node.names])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(package):
    modules = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph = {m: {n for n in _top_level_imports(p) if n in modules and n != m} for m, p in modules.items()}
    state: dict[str, str] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(trail[trail.index(n):] + [n])}")
            if n not in state:
                visit(n, trail + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_runner_never_imports_the_analysis_above_it():
    bad = [f"{p.relative_to(ROOT)}: {n}" for p in (ROOT / "runner").rglob("*.py")
           for n in imported_modules(p) if n.startswith("attnbench.analysis")]
    assert not bad, bad


def test_an_import_inside_a_function_says_why_it_is_there():
    """Imports belong at the top of a module; one inside a function stays only to keep a
    heavy or optional import out of the module's import (torch, triton, vLLM, matplotlib,
    Gluon, uvloop), and a comment on its line or on the line above says so ("lazy" or
    "optional")."""
    bare = []
    for path in [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")] + _sources("."):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    first = sub.lineno - 1  # the block of imports it belongs to, and the line above it
                    while first > 0 and lines[first - 1].strip().startswith(("from ", "import ", "#", ")")) \
                            or (first > 0 and not lines[first - 1].strip()):
                        first -= 1
                    around = " ".join(lines[max(first - 1, 0):sub.lineno])
                    if "lazy" not in around and "optional" not in around:
                        bare.append(f"{path.relative_to(ROOT)}:{sub.lineno}: {lines[sub.lineno - 1].strip()}")
    assert not bare, bare
