"""Images and make targets, without a Docker engine: the Dockerfiles through a real parser,
`make -n` for the docker argv of the GPU suites."""

from __future__ import annotations

import fnmatch
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[1]


def parsed(name: str) -> DockerfileParser:
    import io

    return DockerfileParser(fileobj=io.BytesIO((ROOT / "docker" / name).read_bytes()), env_replace=False)


@pytest.mark.parametrize("name, arg, base", [
    ("Dockerfile.cuda", "VLLM_TAG", "vllm/vllm-openai:"),
    ("Dockerfile.rocm", "ROCM_VLLM_TAG", "rocm/vllm:"),
])
def test_dockerfile_structure(name, arg, base):
    df = parsed(name)
    instructions = [(i["instruction"], i["value"]) for i in df.structure]
    # the base tag is a build argument with a pinned default, declared before FROM
    first_from = next(n for n, (ins, _) in enumerate(instructions) if ins == "FROM")
    pre_args = [v for ins, v in instructions[:first_from] if ins == "ARG"]
    assert any(v.startswith(f"{arg}=") and len(v) > len(arg) + 1 for v in pre_args)
    assert instructions[first_from][1] == f"{base}${{{arg}}}"
    # every COPY source exists in the build context (the repository root)
    for ins, value in instructions:
        if ins == "COPY":
            *sources, _dest = shlex.split(value)
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY source {src} missing"
    # runs as a non-root user, attnbench is the entrypoint, labels carry code and base
    users = [v for ins, v in instructions if ins == "USER"]
    assert users and users[-1] not in ("root", "0")
    entry = [v for ins, v in instructions if ins == "ENTRYPOINT"]
    assert json.loads(entry[-1]) == ["attnbench"]
    labels = df.labels
    assert labels["org.opencontainers.image.revision"] == "${GIT_SHA}"
    assert labels["org.opencontainers.image.base.name"] == f"{base}${{{arg}}}"
    # the image's torch / vLLM are pinned while attnbench installs
    assert any("--constraint" in v and "pip install" in v for ins, v in instructions if ins == "RUN")


def test_dockerignore_keeps_results_venvs_and_caches_out():
    patterns = [ln.strip() for ln in (ROOT / "docker" / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    for path in ("results/h100/x.json", ".venv/bin/python", "kernels/__pycache__/a.pyc", ".models/tiny/config.json",
                 ".git/HEAD", ".vllm-bundle/part1/x"):
        assert any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p + "/*") or path.startswith(p.lstrip("*/") + "/")
                   for p in patterns), path
    for name in ("Dockerfile.cuda", "Dockerfile.rocm"):  # BuildKit reads <Dockerfile>.dockerignore
        link = ROOT / "docker" / f"{name}.dockerignore"
        assert link.resolve() == (ROOT / "docker" / ".dockerignore").resolve()


def make(*args: str) -> str:
    """Output of a top-level make (a `make test` parent must not leak its MAKEFLAGS in)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout


def make_n(*args: str) -> list[list[str]]:
    out = make("-n", *args, "RESULTS=/data/results", "HF_CACHE=/data/hf")
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


def test_bench_h100_docker_argv():
    commands = make_n("bench-h100", "ONLY=backends-flex blog-v1-default", "RESUME=1")
    docker = next(c for c in commands if c[:2] == ["docker", "run"])
    assert docker[docker.index("--gpus") + 1] == "all" and "--ipc=host" in docker
    assert "/data/results:/results" in docker and "/data/hf:/hf-cache" in docker
    image = docker.index("attnbench:cuda-v0.26.0")
    assert docker[image + 1:image + 3] == ["run", "/opt/attnbench/recipes/h100.yaml"]
    tail = docker[image + 3:]
    assert tail[tail.index("--out") + 1] == "/results"
    assert ["--only", "backends-flex"] == tail[tail.index("--only"):tail.index("--only") + 2]
    assert "blog-v1-default" in tail and "--resume" in tail
    assert tail[tail.index("--models") + 1] == "dummy"


def test_bench_mi300x_docker_argv_has_rocm_devices():
    docker = next(c for c in make_n("bench-mi300x", "MODELS=real") if c[:2] == ["docker", "run"])
    for flag in (["--device", "/dev/kfd"], ["--device", "/dev/dri"], ["--group-add", "video"],
                 ["--security-opt", "seccomp=unconfined"]):
        assert any(docker[i:i + 2] == flag for i in range(len(docker) - 1)), flag
    assert "--gpus" not in docker
    assert docker[docker.index("--models") + 1] == "as-written"
    assert any(a.startswith("attnbench:rocm-") for a in docker)


def test_native_runtime_runs_the_same_suite_without_docker():
    commands = make_n("bench-h100", "RUNTIME=native", "SHAREGPT=/data/sg.json")
    assert commands[0][:3] == ["attnbench", "run", "recipes/h100.yaml"]
    # the V0 runs need a vLLM <= 0.10 next to it: skipped with a message without ATTNBENCH_V0
    assert commands[1][0] == "echo" and "V0 runs skipped" in commands[1][1]
    # then the paper's Fig. 6-8 microbenchmarks, into the suite's results folder
    assert [c[:3] for c in commands[2:]] == [["attnbench", "microbench", f"recipes/microbench/paper-fig{n}.yaml"]
                                             for n in (6, 7, 8)]
    assert commands[3][commands[3].index("--out") + 1] == "/data/results/h100/paper-fig7.csv"
    only = make_n("bench-h100", "RUNTIME=native", "ONLY=fig9-flash-10")
    assert len(only) == 2, "a partial suite (ONLY=) runs no microbenchmarks"
    cmd = commands[0]
    assert cmd[cmd.index("--out") + 1] == "/data/results"
    assert cmd[cmd.index("--sharegpt") + 1] == "/data/sg.json"


def test_make_help_lists_every_user_target():
    out = make("help")
    for target in ("demo", "test", "test-gpu", "test-gpu-plugin", "plots", "bench-h100", "bench-mi300x", "image-cuda", "image-rocm"):
        assert f"  {target} " in out
