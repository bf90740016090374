"""attnbench never harms a user's files: names from a recipe cannot become paths outside
the results root or lines in a generated script, `--overwrite` never deletes a run another
process is measuring, and secret values never reach a file or a printed command. One test
per attack that was found to work before."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attnbench.analysis.collect import CollectError, collect_results
from attnbench.cli import main
from attnbench.runner.names import UnsafePath, dns_label, inside
from attnbench.runner.recipe import RecipeError, load_suite
from attnbench.runner.server import build_launch
from attnbench.runner.store import ResultsStore
from attnbench.runner.submit import ScriptValueError, SlurmOptions, TaskWork, slurm_script
from attnbench.runner.tasks import RunLock

ROOT = Path(__file__).resolve().parents[1]


def suite_file(tmp_path: Path, name: str = "s", runs=None, defaults=None) -> Path:
    data = {"name": name, "defaults": {"model": {"path": str(tmp_path / "model"), "build": "tiny"},
                                       "serve": {"gpu_vendor": "none"}, **(defaults or {})},
            "runs": runs or [{"name": "r"}]}
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("where, name", [("suite", "../.."), ("suite", "/tmp/x"), ("suite", "../../y"),
                                         ("suite", "a\nb"), ("run", "../.."), ("run", "/tmp/x"), ("run", ".hidden"),
                                         ("run", "a b"), ("run", "x" * 65), ("run", "r\n#SBATCH --wrap=id")])
def test_a_name_that_is_no_plain_name_is_refused_when_the_recipe_loads(tmp_path, where, name):
    path = suite_file(tmp_path, name=name) if where == "suite" else suite_file(tmp_path, runs=[{"name": name}])
    with pytest.raises(RecipeError, match=f"{where} name .*: expected letters, digits"):
        load_suite(path)
    result = CliRunner().invoke(main, ["recipes", "validate", str(path)])
    assert result.exit_code == 1 and "expected letters, digits" in result.output and "Traceback" not in result.output


def test_a_run_named_dot_dot_with_overwrite_deletes_nothing_outside(tmp_path):
    """The attack that deleted a user's folder: `run --overwrite` of a run named '../..'."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    out = tmp_path / "precious" / "results"
    path = suite_file(tmp_path, runs=[{"name": "../.."}])
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out), "--overwrite"])
    assert result.exit_code == 2 and "run name '../..'" in result.output and "Traceback" not in result.output
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_matrix_values_become_plain_name_parts(tmp_path):
    path = suite_file(tmp_path, runs=[{"name": "m", "matrix": {"serve.extra_args": [["--x=/a/b c"]],
                                                               "benchmark.seed": [1]}}])
    assert [r.name for r in load_suite(path).runs] == ["m-1-x-a-b-c"]  # matrix keys in sorted order


def test_the_store_keeps_every_path_inside_its_root(tmp_path):
    with pytest.raises(ValueError, match="suite name '../x'"):
        ResultsStore(tmp_path, "../x")
    store = ResultsStore(tmp_path, "s")
    with pytest.raises(ValueError, match="run name '/etc'"):
        store.run_dir("/etc")
    assert inside(tmp_path, tmp_path / "a" / "b") == (tmp_path / "a" / "b").resolve()
    with pytest.raises(UnsafePath):
        inside(tmp_path / "a", tmp_path / "a" / ".." / "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    run = store.run_dir("r")
    run.mkdir(parents=True)
    (run / "link").symlink_to(outside)
    (run / "r1").mkdir()
    store.clear_run("r", keep=".lock")  # removes the link itself, never what it points to
    assert list(run.iterdir()) == [] and (outside / "keep").exists()


def test_overwrite_refuses_a_run_another_process_is_measuring(tmp_path):
    path = suite_file(tmp_path)
    store = ResultsStore(tmp_path / "out", "s")
    run = store.run_dir("r")
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text("kept")
    lock = RunLock(run)
    assert lock.acquire()
    try:
        result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "out"), "--overwrite"])
    finally:
        lock.release()
    assert result.exit_code == 1 and "being measured by another process" in result.output
    assert (run / "recipe.yaml").read_text() == "kept"


def work() -> TaskWork:
    return TaskWork("/shared/recipes/s.yaml", "/shared/results", 2, [])


@pytest.mark.parametrize("field, value", [("partition", "gpu\n#SBATCH --wrap=id"), ("partition", "gpu; rm -rf ~"),
                                          ("time", "1:00:00\nid"), ("mem", "64G $(id)"),
                                          ("log_dir", "/shared/x\nid"), ("log_dir", "/shared/$(id)")])
def test_every_sbatch_value_is_checked(field, value):
    opt = SlurmOptions("attnbench-s", [0, 1], **{"log_dir": "/shared/results/s/slurm", field: value})
    with pytest.raises(ScriptValueError, match="expected"):
        slurm_script(work(), opt)


def test_the_script_quotes_every_value_and_adds_no_line():
    script = slurm_script(work(), SlurmOptions("attnbench-s", [0, 1], "/shared/results/s/slurm", partition="gpu",
                                               mem="64G", time="2:00:00"))
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == ['#SBATCH --job-name="attnbench-s"', "#SBATCH --array=0-1",
                          '#SBATCH --output="/shared/results/s/slurm/task-%a.log"', '#SBATCH --partition="gpu"',
                          "#SBATCH --gpus-per-task=1", "#SBATCH --ntasks=1", '#SBATCH --mem="64G"',
                          '#SBATCH --time="2:00:00"']
    with pytest.raises(ValueError, match="job name"):
        slurm_script(work(), SlurmOptions("s\nid", [0], "/l"))


def test_submit_prints_a_shell_quoted_command(tmp_path):
    """A results root with a space and a `$(...)` in its name: the script refuses it in one
    line; a Kubernetes manifest path with the same is printed quoted, so pasting it runs
    nothing but kubectl."""
    path = suite_file(tmp_path)
    result = CliRunner().invoke(main, ["submit", "slurm", str(path), "--out", str(tmp_path / "a $(touch pwned)")])
    assert result.exit_code == 2 and "expected a path without spaces" in result.output
    assert not (Path.cwd() / "pwned").exists()
    recipes = ROOT / "recipes"
    manifest = tmp_path / "job $(touch pwned).yaml"
    result = CliRunner().invoke(main, ["submit", "k8s", str(recipes / "cpu-demo.yaml"), "--manifest", str(manifest)])
    assert result.exit_code == 0, result.output
    printed = result.output.strip().splitlines()[-1]
    assert shlex.split(printed) == ["kubectl", "apply", "-f", str(manifest)]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "kubectl").write_text("#!/bin/sh\necho kubectl \"$@\"\n")
    (fake / "kubectl").chmod(0o755)
    done = subprocess.run(["bash", "-c", printed], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert done.returncode == 0 and not (tmp_path / "pwned").exists()


def test_kubernetes_names_are_dns_labels(tmp_path):
    assert dns_label("attnbench-My_Suite.v2") == "attnbench-my-suite-v2"
    assert len(dns_label("attnbench-" + "x" * 80)) == 63
    result = CliRunner().invoke(main, ["submit", "k8s", str(ROOT / "recipes/cpu-demo.yaml"), "--namespace", "Bad_NS",
                                       "--manifest", str(tmp_path / "j.yaml")])
    assert result.exit_code == 2 and "--namespace" in result.output and "Kubernetes name" in result.output


def test_figure_names_from_a_results_tree_cannot_leave_the_output_folder(tmp_path):
    """A summary.json whose suite is '../../evil' is refused in one line; nothing is drawn."""
    rep = tmp_path / "res" / "s" / "r" / "r1"
    rep.mkdir(parents=True)
    (rep / "summary.json").write_text(json.dumps({"suite": "../../evil", "run": "r", "status": "ok", "completed": 1}))
    with pytest.raises(CollectError, match="suite name '../../evil'"):
        collect_results(tmp_path / "res")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "res"), "--out", str(tmp_path / "figs")])
    assert result.exit_code == 2 and "Traceback" not in result.output and not (tmp_path / "evil").exists()


CANARY = "canary-0f9e8d7c6b5a"


def test_secret_values_stay_out_of_what_is_written_and_shown(tmp_path):
    """A token in serve.env: the server gets it; `recipes show`, the recipe.yaml a run
    writes, the docker launcher's argv and the recipe hash do not carry it. (The server log
    and provenance of a real run: tests/test_integration_vllm.py.)"""
    path = suite_file(tmp_path, defaults={"serve": {"gpu_vendor": "none", "env": {"HF_TOKEN": CANARY, "X": "1"}}})
    suite = load_suite(path)
    recipe = suite.runs[0]
    shown = CliRunner().invoke(main, ["recipes", "show", str(path)]).output
    assert CANARY not in shown and "HF_TOKEN='<redacted>'" in shown and "X=1" in shown
    store = ResultsStore(tmp_path / "out", suite.name)
    store.write_run_meta("r", recipe.model_dump(mode="json"), {})
    written = (store.run_dir("r") / "recipe.yaml").read_text()
    assert CANARY not in written and "<redacted>" in written
    plan = build_launch(recipe, port=8100)
    assert plan.env["HF_TOKEN"] == CANARY and CANARY not in plan.shell_line()
    docker = build_launch(recipe.model_copy(update={"serve": recipe.serve.model_copy(
        update={"launcher": "docker", "image": "img"})}), port=8100)
    assert CANARY not in " ".join(docker.argv) and docker.env["HF_TOKEN"] == CANARY
    other = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"env": {"HF_TOKEN": "x", "X": "1"}})})
    assert other.digest() == recipe.digest()  # the hash never depends on a secret
