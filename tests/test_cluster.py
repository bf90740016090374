"""A suite as independent tasks (one server configuration each), safe to run side by side
into one results tree, and handed to Slurm (sbatch job array) or Kubernetes (Indexed
Job, validated against the API models of Kubernetes' official Python client)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.runner.recipe import load_suite
from attnbench.runner.store import ResultsStore, atomic_write_json
from attnbench.runner.submit import K8sOptions, SlurmOptions, TaskWork, k8s_job, slurm_script
from attnbench.runner.tasks import RunLock, is_locked, parse_task, split_tasks, task_runs, task_states, write_plan

ROOT = Path(__file__).resolve().parents[1]


def test_tasks_are_server_configurations_in_suite_order():
    h100 = load_suite(ROOT / "recipes/h100.yaml")
    tasks = split_tasks(h100.runs)
    assert sum(len(t) for t in tasks) == len(h100.runs)
    by_name = {t[0].name: [r.name for r in t] for t in tasks}
    assert by_name["fig9-flash-10"] == ["fig9-flash-10", "fig9-flash-100", "fig9-flash-1000",
                                        "fig9-flash-long-4000", "fig9-flash-long-12800"]  # one server
    assert [r.name for r in tasks[0]] == ["backends-flex"]
    # every run in exactly one task for any array size
    for count in (1, 3, len(tasks), len(tasks) + 2):
        names = [r.name for i in range(count) for r in task_runs(tasks, i, count)]
        assert sorted(names) == sorted(r.name for r in h100.runs)


@pytest.mark.parametrize("spec", ["3", "4/4", "-1/2", "a/b", ""])
def test_task_spec_errors_name_the_form(spec):
    with pytest.raises(ValueError, match="expected i/N with 0 <= i < N"):
        parse_task(spec)
    assert parse_task(" 1 / 4 ") == (1, 4)


def test_a_run_lock_excludes_a_second_process_and_dies_with_its_holder(tmp_path):
    run_dir = tmp_path / "suite" / "run"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from attnbench.runner.tasks import RunLock
assert RunLock(Path({str(run_dir)!r})).acquire()
print("locked", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    assert is_locked(run_dir) and not RunLock(run_dir).acquire()
    holder.kill()
    holder.wait()
    assert not is_locked(run_dir)  # a killed task leaves no stale lock
    mine = RunLock(run_dir)
    assert mine.acquire() and is_locked(run_dir)
    mine.release()
    assert not is_locked(run_dir)


def test_results_are_readable_by_the_team(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "summary.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o644
        os.umask(0o002)
        atomic_write_json(tmp_path / "group.json", {"a": 1})
        assert stat.S_IMODE((tmp_path / "group.json").stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_status_of_tasks(tmp_path):
    suite = load_suite(ROOT / "recipes/cpu-demo.yaml")
    store = ResultsStore(tmp_path, suite.name)
    tasks = split_tasks(suite.runs)
    write_plan(store, suite, tasks, repeats=2)
    plan = json.loads((store.suite_dir / "tasks.json").read_text())
    assert plan["tasks"] == [["v0-style"], ["v1"], ["shared-prefix"]]
    assert plan["repeats"] == {"v0-style": 2, "v1": 2, "shared-prefix": 2}
    states = lambda: [(i, s) for i, s, _ in task_states(store, plan, plan["repeats"])][:2]  # noqa: E731
    assert states() == [(0, "missing"), (1, "missing")]
    store.write_summary("v0-style", 1, {"status": "ok"})
    store.write_summary("v1", 1, {"status": "ok"})
    store.write_summary("v1", 2, {"status": "failed"})
    assert states() == [(0, "partial"), (1, "failed")]
    store.write_summary("v0-style", 2, {"status": "ok"})
    lock = RunLock(store.run_dir("v1"))
    assert lock.acquire()
    try:
        assert states() == [(0, "done"), (1, "running")]
    finally:
        lock.release()
    out = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert out.exit_code == 0 and "task   0  done" in out.output and "task   1  failed" in out.output
    assert "1 done, 1 failed, 1 missing of 3 tasks" in out.output


def test_run_task_writes_the_plan_and_checks_its_spec(tmp_path):
    bad = CliRunner().invoke(main, ["run", str(ROOT / "recipes/cpu-demo.yaml"), "--task", "2/2", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "expected i/N" in bad.output
    none = CliRunner().invoke(main, ["run", str(ROOT / "recipes/cpu-demo.yaml"), "--task", "5/8", "--out", str(tmp_path)])
    assert none.exit_code == 0 and "nothing for this one" in none.output
    assert json.loads((tmp_path / "cpu-demo" / "tasks.json").read_text())["tasks"] == [
        ["v0-style"], ["v1"], ["shared-prefix"]]


def work(count=3):
    return TaskWork("/shared/recipes/h100.yaml", "/shared/results", count, ["--models", "dummy"])


def test_slurm_script_per_vendor_and_container():
    plain = slurm_script(work(), SlurmOptions("attnbench-h100", [0, 1, 2, 5], "/shared/results/h100/slurm",
                                              partition="gpu", cpus_per_task=16, time="4:00:00", max_parallel=2,
                                              attnbench="/venv/bin/attnbench"))
    assert "#SBATCH --array=0-2,5%2" in plain and '#SBATCH --partition="gpu"' in plain
    assert '#SBATCH --time="4:00:00"' in plain and '#SBATCH --job-name="attnbench-h100"' in plain
    assert "#SBATCH --gpus-per-task=1" in plain and "#SBATCH --cpus-per-task=16" in plain
    assert '/venv/bin/attnbench run /shared/recipes/h100.yaml --task "$SLURM_ARRAY_TASK_ID"/3 --out /shared/results' \
        in plain
    pyxis = slurm_script(work(), SlurmOptions("j", [0], "/l", container_image="attnbench:cuda-v0.26.0",
                                              mounts=["/shared/results", "/shared/recipes"]))
    assert "srun --container-image=attnbench:cuda-v0.26.0 " \
           "--container-mounts=/shared/results:/shared/results,/shared/recipes:/shared/recipes attnbench run" in pyxis
    amd = slurm_script(work(), SlurmOptions("j", [0], "/l", vendor="amd", apptainer_image="/img/attnbench-rocm.sif",
                                            mounts=["/shared"]))
    assert "apptainer exec --rocm --bind /shared /img/attnbench-rocm.sif attnbench run" in amd
    cpu = slurm_script(work(), SlurmOptions("j", [0], "/l", vendor="none"))
    assert "--gpus-per-task" not in cpu


@pytest.mark.parametrize("vendor,resource", [("nvidia", "nvidia.com/gpu"), ("amd", "amd.com/gpu")])
def test_k8s_indexed_job_is_a_valid_kubernetes_job(vendor, resource):
    from kubernetes.client.models import V1Job

    job = k8s_job(work(), K8sOptions("attnbench-h100", "attnbench:cuda-v0.26.0", vendor=vendor, namespace="bench",
                                     parallelism=2))
    parsed = V1Job.model_validate(job)  # the API's own models: unknown or misplaced keys are errors
    assert parsed.model_dump(by_alias=True, exclude_none=True) == job  # nothing dropped or renamed
    spec = parsed.spec
    assert spec.completion_mode == "Indexed" and spec.completions == 3 and spec.parallelism == 2
    (container,) = spec.template.spec.containers
    assert container.args[:4] == ["run", "/shared/recipes/h100.yaml", "--task", "$(TASK_INDEX)/3"]
    index = next(e for e in container.env if e.name == "TASK_INDEX")
    assert index.value_from.field_ref.field_path == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert container.resources.limits == {resource: "1"}
    claims = {v.name: v.persistent_volume_claim.claim_name for v in spec.template.spec.volumes
              if v.persistent_volume_claim}
    assert claims == {"results": "attnbench-results", "hf-cache": "attnbench-hf-cache"}
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        V1Job.model_validate({**job, "spec": {**job["spec"], "completionsMode": "Indexed"}})


def test_submit_k8s_writes_the_manifest_for_a_shipped_suite(tmp_path):
    manifest = tmp_path / "job.yaml"
    out = CliRunner().invoke(main, ["submit", "k8s", str(ROOT / "recipes/mi300x.yaml"), "--models", "dummy",
                                    "--manifest", str(manifest)])
    assert out.exit_code == 0, out.output
    job = yaml.safe_load(manifest.read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][1] == "/opt/attnbench/recipes/mi300x.yaml"
    assert container["resources"]["limits"] == {"amd.com/gpu": "1"} and f"kubectl apply -f {manifest}" in out.output
    elsewhere = tmp_path / "mine.yaml"
    elsewhere.write_text((ROOT / "recipes/cpu-demo.yaml").read_text())
    refused = CliRunner().invoke(main, ["submit", "k8s", str(elsewhere)])
    assert refused.exit_code == 2 and "reads its suite from the image" in refused.output


def test_submit_slurm_asks_only_for_unfinished_tasks(tmp_path):
    args = ["submit", "slurm", str(ROOT / "recipes/cpu-demo.yaml"), "--out", str(tmp_path)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0 and "3 of 3 tasks to run" in first.output
    store = ResultsStore(tmp_path, "cpu-demo")
    for r in (1, 2, 3):
        store.write_summary("v0-style", r, {"status": "ok"})
    second = CliRunner().invoke(main, args)
    assert "2 of 3 tasks to run" in second.output
    assert "#SBATCH --array=1-2\n" in (tmp_path / "cpu-demo" / "slurm" / "submit.sbatch").read_text()
    assert json.loads((tmp_path / "cpu-demo" / "tasks.json").read_text())["tasks"] == [
        ["v0-style"], ["v1"], ["shared-prefix"]]


def test_status_reads_any_results_tree(tmp_path):
    """A tree `attnbench run` made without --task has no tasks.json: `status` lists its runs,
    each against the repeats its recipe.yaml asks for."""
    from click.testing import CliRunner

    from attnbench.cli import main
    from attnbench.runner.recipe import Recipe
    from attnbench.runner.store import ResultsStore
    from attnbench.runner.summary import RepeatHeader, RepeatSummary

    store = ResultsStore(tmp_path, "s")
    for run, repeats, statuses in (("a", 2, ["ok", "ok"]), ("b", 3, ["ok"]), ("c", 1, ["degraded"])):
        recipe = Recipe.model_validate({"name": run, "model": {"path": "m"}, "benchmark": {"repeats": repeats}})
        store.write_run_meta(run, recipe.model_dump(mode="json"), {})
        for k, status in enumerate(statuses, 1):
            store.write_summary(run, k, RepeatSummary(**RepeatHeader(run=run, repeat=k).model_dump(), status=status))
    for where in (tmp_path, tmp_path / "s"):
        result = CliRunner().invoke(main, ["status", str(where)])
        assert result.exit_code == 0, result.output
        assert "done     a" in result.output and "partial  b" in result.output and "failed   c" in result.output
        assert "1 done, 1 failed, 1 partial of 3 runs" in result.output
