"""A suite's tasks (`tasks.py`) as work for the schedulers GPU fleets already run:
a Slurm job array (`slurm_script`) and a Kubernetes Indexed Job (`k8s_job`).

Each array task / job index runs ``attnbench run SUITE --task <index>/<tasks>``: one server
configuration with its runs, into one results tree on shared storage, resuming what an
earlier attempt left. Nothing here talks to a scheduler; `attnbench submit` writes the
script or manifest, prints the command that submits it, and (Slurm, ``--now``) runs it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .names import check_name

GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
APPTAINER_GPU_FLAG = {"nvidia": "--nv", "amd": "--rocm"}


@dataclass
class TaskWork:
    """What every task of a submission runs: ``attnbench run`` of one suite file."""

    suite_file: str  # as the task sees it (a path on shared storage, or inside the image)
    out: str  # results root as the task sees it
    task_count: int
    run_args: list[str] = field(default_factory=list)  # e.g. --models dummy --models-dir ...

    def argv(self, index: str) -> list[str]:
        """``run`` arguments of task ``index`` (a number or the scheduler's variable)."""
        return ["run", self.suite_file, "--task", f"{index}/{self.task_count}", "--out", self.out, *self.run_args]


@dataclass
class SlurmOptions:
    job_name: str
    array: list[int]  # the task indices to run (all, or those not done yet)
    log_dir: str
    vendor: str = "nvidia"  # nvidia | amd | none
    partition: str | None = None
    gpus_per_task: int = 1
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    max_parallel: int | None = None
    attnbench: str = "attnbench"  # the command on the compute nodes (no container)
    container_image: str | None = None  # pyxis/enroot: srun --container-image
    apptainer_image: str | None = None  # apptainer exec IMAGE.sif
    mounts: list[str] = field(default_factory=list)  # host folders the container must see


def _array_spec(indices: list[int], max_parallel: int | None) -> str:
    """Slurm's --array: ranges for runs of consecutive indices (0-3,5), %limit."""
    parts, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts) + (f"%{max_parallel}" if max_parallel else "")


# what each #SBATCH value may be (Slurm's own syntax, conservatively); a value is checked
# against its pattern, then written in double quotes
SBATCH_VALUES = {
    "partition": (r"[A-Za-z0-9_.,-]{1,64}", "a partition name (letters, digits, '_', '.', ',', '-')"),
    "mem": (r"[0-9]+[KMGT]?", "a size such as 64G"),
    "time": (r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}", "a time such as 2:00:00 or 1-12:00"),
    "output": (r"[^\s\"'`$\\;|&<>]+", "a path without spaces, quotes or shell characters"),
}


class ScriptValueError(ValueError):
    """A value that would not be one plain value in a generated script."""


def sbatch_value(option: str, value: str) -> str:
    """``value`` checked against ``SBATCH_VALUES[option]`` and double-quoted."""
    pattern, expected = SBATCH_VALUES[option]
    if not re.fullmatch(pattern, str(value)):
        raise ScriptValueError(f"--{option} {value!r}: expected {expected}")
    return f'"{value}"'


def slurm_script(work: TaskWork, opt: SlurmOptions) -> str:
    """An sbatch script: a job array with one task per index of ``opt.array``. Every
    directive's value is checked and quoted (`sbatch_value`), the task's command is built
    with shell quoting, so no name or option can add a line or a command to the script."""
    check_name(opt.job_name, "job name")
    if "\n" in opt.attnbench or "\r" in opt.attnbench:
        raise ScriptValueError(f"--attnbench {opt.attnbench!r}: expected one command line")
    directives = [f'--job-name="{opt.job_name}"', f"--array={_array_spec(opt.array, opt.max_parallel)}",
                  f"--output={sbatch_value('output', f'{opt.log_dir}/task-%a.log')}"]
    if opt.partition:
        directives.append(f"--partition={sbatch_value('partition', opt.partition)}")
    if opt.vendor != "none" and opt.gpus_per_task:
        directives.append(f"--gpus-per-task={int(opt.gpus_per_task)}")
    directives.append("--ntasks=1")
    if opt.cpus_per_task:
        directives.append(f"--cpus-per-task={int(opt.cpus_per_task)}")
    if opt.mem:
        directives.append(f"--mem={sbatch_value('mem', opt.mem)}")
    if opt.time:
        directives.append(f"--time={sbatch_value('time', opt.time)}")
    argv = shlex.join(work.argv("INDEX")).replace("INDEX/", '"$SLURM_ARRAY_TASK_ID"/')
    if opt.container_image:  # pyxis / enroot: the image's entrypoint is attnbench
        mounts = ",".join(f"{m}:{m}" for m in opt.mounts)
        command = (f"srun --container-image={shlex.quote(opt.container_image)}"
                   + (f" --container-mounts={shlex.quote(mounts)}" if mounts else "") + f" attnbench {argv}")
    elif opt.apptainer_image:
        parts = ["apptainer", "exec", *([APPTAINER_GPU_FLAG[opt.vendor]] if opt.vendor in APPTAINER_GPU_FLAG else [])]
        parts += [f"--bind {shlex.quote(m)}" for m in opt.mounts] + [shlex.quote(opt.apptainer_image)]
        command = " ".join(parts) + f" attnbench {argv}"
    else:
        command = f"{opt.attnbench} {argv}"
    lines = ["#!/bin/bash", f"# attnbench: {work.task_count} tasks of {' '.join(str(work.suite_file).split())}; "
             "array task i runs task i",
             "# (one server configuration and its runs) into the shared results tree, resuming."]
    lines += [f"#SBATCH {d}" for d in directives]
    lines += ["set -euo pipefail", 'echo "attnbench task $SLURM_ARRAY_TASK_ID on $(hostname) from $(date +%s)"',
              command, 'echo "attnbench task $SLURM_ARRAY_TASK_ID done at $(date +%s)"', ""]
    return "\n".join(lines)


@dataclass
class K8sOptions:
    name: str
    image: str
    vendor: str = "nvidia"
    namespace: str | None = None
    gpus_per_task: int = 1
    parallelism: int | None = None
    results_claim: str = "attnbench-results"  # PersistentVolumeClaim of the results tree
    cache_claim: str = "attnbench-hf-cache"  # ... of the shared Hugging Face model cache
    shm_size: str = "16Gi"


def k8s_job(work: TaskWork, opt: K8sOptions) -> dict:
    """A batch/v1 Indexed Job: one completion index per task, ``--task <index>/<tasks>``."""
    # quantities are strings in the API (kubectl would coerce a number; the schema does not)
    limits = {GPU_RESOURCE[opt.vendor]: str(opt.gpus_per_task)} if opt.vendor in GPU_RESOURCE and opt.gpus_per_task else {}
    container = {
        "name": "attnbench",
        "image": opt.image,
        "args": work.argv("$(TASK_INDEX)"),
        "env": [
            # the index of this pod in the Indexed Job, from the downward API
            {"name": "TASK_INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "HF_HOME", "value": "/hf-cache"},
        ],
        "volumeMounts": [{"name": "results", "mountPath": work.out},
                         {"name": "hf-cache", "mountPath": "/hf-cache"},
                         {"name": "shm", "mountPath": "/dev/shm"}],
    }
    if limits:
        container["resources"] = {"limits": limits}
    metadata = {"name": opt.name, "labels": {"app.kubernetes.io/name": "attnbench"}}
    if opt.namespace:
        metadata["namespace"] = opt.namespace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "completionMode": "Indexed",
            "completions": work.task_count,
            "parallelism": opt.parallelism or work.task_count,
            "backoffLimit": work.task_count,
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "attnbench"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "results", "persistentVolumeClaim": {"claimName": opt.results_claim}},
                        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": opt.cache_claim}},
                        # vLLM's worker processes share tensors through /dev/shm
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": opt.shm_size}},
                    ],
                },
            },
        },
    }


def shared_paths(*paths: str | Path) -> list[str]:
    """Absolute folders a container must mount for these paths (deduplicated, in order)."""
    out: list[str] = []
    for p in paths:
        folder = str(Path(p).resolve())
        if folder not in out:
            out.append(folder)
    return out
