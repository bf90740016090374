"""What is checked before any server starts: bad datasets and options are one line, results
are never mixed or silently overwritten, no GPU work starts without its GPU, and `make demo`
keeps each run in its own folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.runner.preflight import PreflightError, check_accelerator, check_results_folder
from attnbench.runner.recipe import load_suite
from attnbench.runner.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def one_line_error(result, exit_code: int) -> str:
    """The command failed with ``exit_code`` and said why in exactly one 'Error:' line,
    without a traceback."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.parametrize("content,expected", [
    (None, "ShareGPT file not found"),
    ("{not json", "not JSON"),
    ("", "not JSON"),
    ("[]", "no conversation with at least two turns"),
    ('{"a": 1}', "expected a JSON list of conversations"),
])
def test_run_with_a_bad_sharegpt_file_is_one_line(tmp_path, content, expected):
    path = tmp_path / "sharegpt.json"
    if content is not None:
        path.write_text(content)
    result = invoke("run", str(ROOT / "recipes/cpu-demo.yaml"), "--sharegpt", str(path), "--out", str(tmp_path / "r"))
    line = one_line_error(result, 1)
    assert str(path) in line and expected in line and "benchmark.dataset.path" in line
    assert not (tmp_path / "r").exists(), "nothing may start before the check"


def test_recipes_validate_checks_the_dataset_file(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "defaults": {
        "model": {"path": "m"}, "serve": {"gpu_vendor": "none"},
        "benchmark": {"dataset": {"kind": "sharegpt", "path": str(tmp_path / "missing.json")}}},
        "runs": [{"name": "a"}]}))
    result = invoke("recipes", "validate", str(suite))
    assert result.exit_code == 1 and "missing.json: ShareGPT file not found" in result.output
    assert "ok " not in result.output


def test_load_options_name_what_is_missing(tiny, tmp_path):
    result = invoke("load", "--url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", str(tiny),
                    "--dataset", "sharegpt", "--out", str(tmp_path / "o"))
    line = one_line_error(result, 2)
    assert "--dataset 'sharegpt' needs --dataset-path (the ShareGPT JSON file)" in line
    assert "pydantic" not in result.output and "http" not in line


def test_export_shortfall_names_the_number_asked_for(tiny, tmp_path):
    few = tmp_path / "few.json"
    few.write_text(json.dumps([{"conversations": [{"from": "human", "value": "word " * 20},
                                                   {"from": "gpt", "value": "word " * 30}]}] * 3))
    result = invoke("dataset", "export", "--tokenizer", str(tiny), "--dataset", "sharegpt", "--dataset-path",
                    str(few), "--num-prompts", "5", str(tmp_path / "out.json"))
    line = one_line_error(result, 2)
    assert "only 3 conversations pass vLLM's ShareGPT filter, 5 requested" in line


def test_microbench_without_a_gpu_is_one_line(tmp_path):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("this machine has a GPU")
    result = invoke("microbench", str(ROOT / "recipes/microbench/smoke.yaml"), "--out", str(tmp_path / "x.csv"))
    line = one_line_error(result, 1)
    assert "no CUDA/ROCm GPU" in line and "--device cpu" in line
    assert not (tmp_path / "x.csv").exists()


def test_gpu_suites_refuse_a_machine_without_that_gpu(tmp_path):
    suite = load_suite(ROOT / "recipes/h100.yaml")
    with pytest.raises(PreflightError, match="need an NVIDIA GPU .*this machine has no GPU"):
        check_accelerator(suite, suite.runs, facts={"vendor": "none"})
    with pytest.raises(PreflightError, match="need an AMD GPU .* has an NVIDIA GPU"):
        mi = load_suite(ROOT / "recipes/mi300x.yaml")
        check_accelerator(mi, mi.runs, facts={"vendor": "nvidia"})
    check_accelerator(suite, suite.runs, facts={"vendor": "nvidia"})  # the right GPU: no error
    demo = load_suite(ROOT / "recipes/cpu-demo.yaml")
    check_accelerator(demo, demo.runs, facts={"vendor": "none"})  # the CPU demo needs none
    if not Path("/dev/nvidiactl").exists():
        result = invoke("run", str(ROOT / "recipes/h100.yaml"), "--out", str(tmp_path / "r"))
        assert "need an NVIDIA GPU" in one_line_error(result, 1)


@pytest.mark.parametrize("target,args,expected", [
    ("test-gpu", ["GPU_PYTHON=/bin/false"], "test-gpu: GPU_PYTHON=/bin/false cannot import torch and attnbench"),
    ("microbench-gpu", ["GPU_PYTHON=/bin/false"], "cannot import torch and attnbench"),
    ("bench-h100", [], "bench-h100: no NVIDIA GPU on this machine"),
    ("bench-mi300x", [], "bench-mi300x: no AMD GPU on this machine"),
])
def test_gpu_make_targets_stop_in_one_line(target, args, expected):
    if target.startswith("bench") and (Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists()):
        pytest.skip("this machine has a GPU")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "--no-print-directory", target, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode != 0
    messages = [line for line in out.stderr.splitlines() if not line.startswith("make:")]
    assert messages == [messages[0]] and expected in messages[0], out.stderr


def test_results_folder_is_never_mixed(tmp_path):
    suite = load_suite(ROOT / "recipes/cpu-demo.yaml")
    store = ResultsStore(tmp_path, suite.name)
    check_results_folder(store, suite.runs, resume=False, overwrite=False)  # empty: fine
    run_dir = store.run_dir("v1")
    store.write_run_meta("v1", suite.runs[1].model_dump(mode="json"), {})
    with pytest.raises(PreflightError, match="already holds results of v1; add --resume .* --overwrite"):
        check_results_folder(store, suite.runs, resume=False, overwrite=False)
    check_results_folder(store, suite.runs, resume=True, overwrite=False)  # same recipe: resumable
    changed = [r.model_copy(update={"benchmark": r.benchmark.model_copy(update={"num_prompts": 7})})
               for r in suite.runs]
    with pytest.raises(PreflightError, match="measured with another recipe"):
        check_results_folder(store, changed, resume=True, overwrite=False)
    store.write_run_meta("v0-style", suite.runs[0].model_dump(mode="json"), {})
    check_results_folder(store, changed[1:], resume=False, overwrite=True)  # overwrite v1: allowed, nothing deleted yet
    assert (run_dir / "recipe.yaml").exists()
    store.clear_run("v1", keep=".lock")  # what `run --overwrite` does once it holds v1's lock
    assert list(run_dir.iterdir()) == [] and (store.run_dir("v0-style") / "recipe.yaml").exists()


def test_run_refuses_a_folder_with_results(tmp_path):
    (tmp_path / "cpu-demo" / "v1").mkdir(parents=True)
    (tmp_path / "cpu-demo" / "v1" / "recipe.yaml").write_text("name: v1\n")
    result = invoke("run", str(ROOT / "recipes/cpu-demo.yaml"), "--out", str(tmp_path))
    assert "already holds results of v1" in one_line_error(result, 1)
    both = invoke("run", str(ROOT / "recipes/cpu-demo.yaml"), "--out", str(tmp_path), "--resume", "--overwrite")
    assert both.exit_code == 2 and "exclude each other" in both.output


def test_a_resumed_run_keeps_the_files_of_its_kept_repeats(tmp_path):
    store = ResultsStore(tmp_path, "s")
    first = store.write_run_meta("a", {"name": "a"}, {"gpus": ["first"]}, "2026-11-23T10:00:00+00:00")
    store.write_summary("a", 1, {"status": "ok"})
    second = store.write_run_meta("a", {"name": "a"}, {"gpus": ["second"]}, "2026-11-23T11:00:00+00:00")
    assert first == "provenance.json" and second == "provenance-20261123T110000.json"
    assert json.loads((store.run_dir("a") / "provenance.json").read_text()) == {"gpus": ["first"]}


def test_demo_writes_a_new_folder_each_time_and_resumes_the_latest(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    root = tmp_path / "demo"
    common = ["make", "--no-print-directory", "-o", ".venv/.attnbench-installed", "demo", f"DEMO_ROOT={root}",
              "VPY=echo"]  # echo stands in for the Python: the commands show, nothing runs
    first = subprocess.run(common, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    folder = os.readlink(root / "latest")
    assert (root / folder).is_dir() and f"--out {root}/{folder}" in first and "--resume" not in first
    resumed = subprocess.run(common + ["RESUME=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout
    assert f"--out {root}/{folder} --resume" in resumed
    fresh = subprocess.run(common[:-2] + [f"DEMO_ROOT={tmp_path / 'none'}", "VPY=echo", "RESUME=1"], cwd=ROOT,
                           env=env, capture_output=True, text=True)
    assert fresh.returncode != 0 and "no " in fresh.stderr and "to resume" in fresh.stderr


def test_run_with_a_half_written_model_folder_is_one_line(tmp_path):
    """A model folder that exists without its config.json (a build stopped half way, or
    someone's files) is named in one line before anything starts, and left as it is."""
    half = tmp_path / "tiny"
    half.mkdir()
    (half / "tokenizer.json").write_text("{}")
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "defaults": {
        "model": {"path": str(half), "build": "tiny"}, "serve": {"gpu_vendor": "none"},
        "benchmark": {"dataset": {"kind": "random", "input_len": 8, "output_len": 4}, "num_prompts": 2}},
        "runs": [{"name": "a"}]}))
    line = one_line_error(invoke("run", str(suite), "--out", str(tmp_path / "r")), 1)
    assert f"model.path: {half} exists but holds no config.json" in line
    assert not (tmp_path / "r").exists(), "nothing may start before the check"
    assert sorted(p.name for p in half.iterdir()) == ["tokenizer.json"]
