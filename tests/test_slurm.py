"""The CPU demo suite as a Slurm job array on a real single-node Slurm (Debian's
slurm-wlm + munge, started here): two tasks side by side into one results tree, then
`attnbench status` and the same report as `make demo`. `make test` installs the packages
(apt-get) where it can; without them this test is skipped and says why."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import SingleNodeSlurm, missing_programs

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = missing_programs()
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} not found); `make test` installs slurm-wlm and munge "
                    "with apt-get as root")
    cluster = SingleNodeSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def attnbench(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def test_demo_suite_as_a_job_array(slurm, tmp_path):
    out = tmp_path / "results"
    only = ["--only", "v0-style", "--only", "v1"]  # two tasks, side by side on the two CPUs
    submitted = attnbench("submit", "slurm", "recipes/cpu-demo.yaml", "--out", str(out), "--cpus-per-task", "1",
                          "--repeats", "2", "--now", *only, env=slurm.env)
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    assert "2 of 2 tasks to run" in submitted.stdout and "Submitted batch job" in submitted.stdout
    script = (out / "cpu-demo" / "slurm" / "submit.sbatch").read_text()
    assert "#SBATCH --array=0-1" in script and "--task \"$SLURM_ARRAY_TASK_ID\"/2" in script
    slurm.wait_idle(timeout_s=420)
    logs = "\n".join(p.read_text() for p in sorted((out / "cpu-demo" / "slurm").glob("task-*.log")))

    status = attnbench("status", str(out))
    assert status.returncode == 0 and "2 done of 2 tasks" in status.stdout, status.stdout + logs
    for run in ("v0-style", "v1"):
        summaries = [json.loads((out / "cpu-demo" / run / f"r{k}" / "summary.json").read_text()) for k in (1, 2)]
        assert all(s["status"] == "ok" and s["completed"] == 48 for s in summaries), logs
    # the two tasks ran side by side: each started before the other finished
    spans = [tuple(int(m) for m in re.findall(r"(?:from|done at) (\d+)", log.read_text()))
             for log in sorted((out / "cpu-demo" / "slurm").glob("task-*.log"))]
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, f"the tasks ran one after the other: {spans}"
    # the shared tree is readable by the team (the umask's mode, not the temp file's 0600)
    assert (out / "cpu-demo" / "v1" / "r1" / "summary.json").stat().st_mode & 0o044 == 0o044

    again = attnbench("submit", "slurm", "recipes/cpu-demo.yaml", "--out", str(out), "--repeats", "2", *only,
                      env=slurm.env)
    assert "all 2 tasks of cpu-demo are done" in again.stdout
    report = attnbench("report", str(out / "cpu-demo"))
    assert report.returncode == 0, report.stderr
    text = (out / "cpu-demo" / "report.md").read_text()
    for heading in ("## cpu-demo", "Normalized to `v0-style`", "![cpu-demo-serving]", "![cpu-demo-normalized]"):
        assert heading in text
