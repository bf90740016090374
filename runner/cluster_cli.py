"""`attnbench tasks`, `attnbench status` and `attnbench submit slurm|k8s`: a suite on a
cluster, as independent tasks into one shared results tree (`tasks.py`, `submit.py`)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import yaml

from .commands import model_options, suite_with_models
from .names import DNS_LABEL, NAME_PATTERN, dns_label
from .store import RECIPE_FILE, ResultsStore, atomic_write_text, repeat_dirs
from .submit import K8sOptions, ScriptValueError, SlurmOptions, TaskWork, k8s_job, shared_paths, slurm_script
from .tasks import PLAN_FILE, read_plan, run_state, split_tasks, task_states, write_plan

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(NAME_PATTERN)
IMAGE_RECIPES = "/opt/attnbench/recipes"  # where the images keep recipes/ (docker/Dockerfile.*)
DEFAULT_IMAGES = {"nvidia": "attnbench:cuda-v0.26.0", "amd": "attnbench:rocm"}


@click.command("tasks")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
def tasks_cmd(suite_file):
    """List SUITE_FILE's tasks: one server configuration each, with the runs that share it."""
    suite = suite_with_models(suite_file, "as-written", Path(".models"))
    tasks = split_tasks(suite.runs)
    for i, task in enumerate(tasks):
        click.echo(f"{i:>3}  {', '.join(r.name for r in task)}")
    click.echo(f"{len(tasks)} tasks: `attnbench run {suite_file} --task i/{len(tasks)}` runs task i")


def _repeats(plan: dict) -> dict[str, int]:
    """Each run's repeat count, as the plan recorded it."""
    return plan.get("repeats", {})


def _suite_dirs(results: Path) -> list[Path]:
    """The suite folders of a results tree: ``results`` itself when it is one (its run
    folders hold a recipe.yaml or repeats), else its children that are."""
    def is_suite(p: Path) -> bool:
        return (p / PLAN_FILE).exists() or any(p.glob(f"*/{RECIPE_FILE}")) or any(p.glob("*/r[0-9]*"))
    return [results] if is_suite(results) else sorted(p for p in results.iterdir() if p.is_dir() and is_suite(p))


def _run_repeats(run_dir: Path) -> int:
    """A run's repeat count from its recipe.yaml (1 when there is none to read)."""
    try:
        return int(yaml.safe_load((run_dir / RECIPE_FILE).read_text())["benchmark"]["repeats"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return max([r for r, _ in repeat_dirs(run_dir)], default=1)


def unfinished(store: ResultsStore, plan: dict) -> list[tuple[int, str, dict]]:
    return [t for t in task_states(store, plan, _repeats(plan)) if t[1] != "done"]


@click.command("status")
@click.argument("results", type=click.Path(file_okay=False, exists=True, path_type=Path))
def status_cmd(results):
    """Which runs of a results tree (a root, or one suite's folder) are done, running,
    failed, partial or missing: by task where the suite was submitted (tasks.json), else
    by run, each with the repeat count its recipe.yaml asks for."""
    suites = _suite_dirs(results)
    if not suites:
        raise click.UsageError(f"{results}: no results here; expected <suite>/<run>/ folders (the tree "
                               "`attnbench run --out` or `attnbench submit --out` writes)")
    for suite_dir in suites:
        click.echo(f"{suite_dir.name}:")
        store = ResultsStore(suite_dir.parent, suite_dir.name)
        if (suite_dir / PLAN_FILE).exists():
            plan = read_plan(suite_dir)
            states = task_states(store, plan, _repeats(plan))
            for i, state, runs in states:
                detail = ", ".join(f"{run} {s}" for run, s in runs.items())
                click.echo(f"  task {i:>3}  {state:<8} {detail}")
            unit = "tasks"
        else:
            runs = sorted(p for p in suite_dir.iterdir() if p.is_dir() and NAME.fullmatch(p.name))
            states = [(run.name, run_state(store, run.name, _run_repeats(run)), None) for run in runs]
            for name, state, _ in states:
                click.echo(f"  {state:<8} {name}")
            unit = "runs"
        counts = {s: sum(1 for _, st, _ in states if st == s)
                  for s in ("done", "running", "failed", "partial", "missing")}
        click.echo("  " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" of {len(states)} {unit}")
        if any(st != "done" for _, st, _ in states):
            click.echo("  running the suite again with --resume (or submitting it again) measures only what is "
                       "not done")


@click.group("submit")
def submit_group():
    """Hand a suite's tasks to Slurm or Kubernetes (one task per server configuration)."""


def _plan_and_todo(suite, out: Path, repeats: int | None):
    """Write (or check) the task plan; the indices of the tasks not done yet."""
    store = ResultsStore(out, suite.name)
    tasks = split_tasks(suite.runs)
    names = [[r.name for r in t] for t in tasks]
    if (store.suite_dir / "tasks.json").exists():
        if read_plan(store.suite_dir)["tasks"] != names:
            raise click.ClickException(f"{store.suite_dir}/tasks.json splits the suite differently (the suite changed "
                                       f"since it was submitted); use another --out")
    else:
        write_plan(store, suite, tasks, repeats)
    todo = [i for i, _, _ in unfinished(store, read_plan(store.suite_dir))]
    return store, tasks, todo


def _vendor(suite) -> str:
    vendors = {r.serve.gpu_vendor for r in suite.runs}
    if len(vendors) > 1:
        raise click.ClickException(f"{suite.source}: runs for several GPU vendors {sorted(vendors)}: submit them "
                                   "separately (--only)")
    return vendors.pop()


def _select(suite, only):
    return suite if not only else suite.model_copy(update={"runs": suite.select(list(only))})


@submit_group.command("slurm")
@click.argument("suite_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Results root on storage every node sees.")
@click.option("--only", multiple=True, help="Run names to submit (repeatable); default every run.")
@click.option("--partition")
@click.option("--gpus-per-task", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--cpus-per-task", type=click.IntRange(min=1))
@click.option("--mem", help="Memory per task, Slurm syntax (e.g. 64G).")
@click.option("--time", "time_limit", help="Time limit per task, Slurm syntax (e.g. 2:00:00).")
@click.option("--max-parallel", type=click.IntRange(min=1), help="At most this many tasks at once (--array %N).")
@click.option("--container-image", help="Run each task in this image with pyxis/enroot (srun --container-image).")
@click.option("--apptainer", "apptainer_image", help="Run each task in this Apptainer image (.sif).")
@click.option("--attnbench", "attnbench_cmd", help="attnbench on the nodes without a container (default: this one).")
@click.option("--repeats", type=click.IntRange(min=1), help="Override every run's repeat count.")
@model_options
@click.option("--now", is_flag=True, help="Submit with sbatch right away.")
def submit_slurm(suite_file, out, only, partition, gpus_per_task, cpus_per_task, mem, time_limit, max_parallel,
                 container_image, apptainer_image, attnbench_cmd, repeats, models, models_dir, now):
    """Write an sbatch job array over SUITE_FILE's tasks not done yet in OUT, print the
    sbatch command, and with --now run it."""
    if container_image and apptainer_image:
        raise click.UsageError("--container-image and --apptainer exclude each other")
    suite = _select(suite_with_models(suite_file, models, models_dir), only)
    out = out.resolve()
    store, tasks, todo = _plan_and_todo(suite, out, repeats)
    if not todo:
        click.echo(f"all {len(tasks)} tasks of {suite.name} are done in {store.suite_dir}; nothing to submit")
        return
    run_args = (["--models", "dummy", "--models-dir", str(models_dir.resolve())] if models == "dummy" else []) \
        + (["--repeats", str(repeats)] if repeats else []) + [a for o in only for a in ("--only", o)]
    work = TaskWork(str(suite_file.resolve()), str(out), len(tasks), run_args)
    log_dir = store.suite_dir / "slurm"
    vendor = _vendor(suite)
    opt = SlurmOptions(
        job_name=f"attnbench-{suite.name}", array=todo, log_dir=str(log_dir), vendor=vendor, partition=partition,
        gpus_per_task=gpus_per_task if vendor != "none" else 0, cpus_per_task=cpus_per_task, mem=mem,
        time=time_limit, max_parallel=max_parallel,
        attnbench=attnbench_cmd or f"{sys.executable} -m attnbench.cli",
        container_image=container_image, apptainer_image=apptainer_image,
        mounts=shared_paths(out, suite_file.resolve().parent, models_dir.resolve()))
    try:
        text = slurm_script(work, opt)
    except ScriptValueError as e:
        raise click.BadParameter(str(e)) from None
    log_dir.mkdir(parents=True, exist_ok=True)
    script = log_dir / "submit.sbatch"
    atomic_write_text(script, text)
    command = ["sbatch", str(script)]
    click.echo(f"{len(todo)} of {len(tasks)} tasks to run; script {script}")
    click.echo(shlex.join(command))
    if now:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise click.ClickException(f"sbatch failed: {(done.stderr or done.stdout).strip()}")
        click.echo(done.stdout.strip())


@submit_group.command("k8s")
@click.argument("suite_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--only", multiple=True, help="Run names to submit (repeatable); default every run.")
@click.option("--image", help="The attnbench image (default: the CUDA or ROCm image of `make image-*`).")
@click.option("--namespace")
@click.option("--gpus-per-task", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--parallelism", type=click.IntRange(min=1), help="Pods at once (default: every task).")
@click.option("--results-claim", default="attnbench-results", show_default=True,
              help="PersistentVolumeClaim holding the results tree (mounted at /results).")
@click.option("--cache-claim", default="attnbench-hf-cache", show_default=True,
              help="PersistentVolumeClaim of the shared Hugging Face model cache (mounted at /hf-cache).")
@click.option("--models", type=click.Choice(["as-written", "dummy"]), default="as-written", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), help="Override every run's repeat count.")
@click.option("--manifest", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the Job (default: attnbench-<suite>-job.yaml here).")
def submit_k8s(suite_file, only, image, namespace, gpus_per_task, parallelism, results_claim, cache_claim, models,
               repeats, manifest):
    """Write a Kubernetes Indexed Job over SUITE_FILE's tasks (one completion index per task)
    and print the kubectl command that submits it."""
    suite = _select(suite_with_models(suite_file, "as-written", Path(".models")), only)
    recipes = (REPO / "recipes").resolve()
    path = suite_file.resolve()
    if not path.is_relative_to(recipes):
        raise click.UsageError(f"{suite_file}: a Kubernetes task reads its suite from the image, which holds "
                               f"recipes/; put the suite there and rebuild the image (make image-cuda)")
    tasks = split_tasks(suite.runs)
    vendor = _vendor(suite)
    run_args = (["--models", "dummy", "--models-dir", "/results/.models"] if models == "dummy" else []) \
        + (["--repeats", str(repeats)] if repeats else []) + [a for o in only for a in ("--only", o)]
    work = TaskWork(f"{IMAGE_RECIPES}/{path.relative_to(recipes)}", "/results", len(tasks), run_args)
    name = dns_label(f"attnbench-{suite.name}")
    for option, value in (("--namespace", namespace), ("--results-claim", results_claim),
                          ("--cache-claim", cache_claim)):
        if value is not None and not (len(value) <= 63 and DNS_LABEL.fullmatch(value)):
            raise click.BadParameter(f"{value!r}: expected a Kubernetes name (lower-case letters, digits and '-', "
                                     "starting and ending with a letter or digit, at most 63 characters)",
                                     param_hint=option)
    job = k8s_job(work, K8sOptions(name=name, image=image or DEFAULT_IMAGES.get(vendor, DEFAULT_IMAGES["nvidia"]),
                                   vendor=vendor, namespace=namespace, gpus_per_task=gpus_per_task,
                                   parallelism=parallelism, results_claim=results_claim, cache_claim=cache_claim))
    manifest = manifest or Path(f"{name}-job.yaml")
    atomic_write_text(manifest, yaml.safe_dump(job, sort_keys=False))
    click.echo(f"{len(tasks)} tasks; Indexed Job {name} in {manifest}")
    click.echo(shlex.join(["kubectl", "apply", "-f", str(manifest)]))
