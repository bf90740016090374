"""docs/campaign/campaign.sh: `seed` (what one GPU lease measured, carried into the next) and
the microbench job's arguments.

A lease packs its runs into results.tgz and its microbenchmark CSVs into micro.tgz (each
split into .part-* pieces past 15 MB); `seed` unpacks them here into .carry/results and
.carry/micro without the server logs and run locks, small enough to travel with the next
lease's call, where `start` puts them back for `--resume`.
"""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "docs" / "campaign" / "campaign.sh"


def _packed_lease(tmp_path: Path) -> Path:
    """A lease's `pack`: results/h100/<run>/{recipe.yaml, server.log, .lock, r1/summary.json}."""
    run = tmp_path / "lease" / "results" / "h100" / "workloads-chat-flash"
    (run / "r1").mkdir(parents=True)
    (run / "r1" / "summary.json").write_text('{"run": "workloads-chat-flash"}')
    (run / "r2").mkdir()
    (run / "r2" / "requests.jsonl").write_text("{}\n")  # a repeat the lease ended in: --resume redoes it
    (run / "recipe.yaml").write_text("name: workloads-chat-flash\n")
    (run / "server.log").write_text("INFO " * 1000)
    (run / ".lock").write_text("")
    files_at = tmp_path / "files_at"
    files_at.mkdir()
    with tarfile.open(files_at / "results.tgz", "w:gz") as tar:
        tar.add(tmp_path / "lease" / "results", arcname="results")
    return files_at


def _seed(files_at: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CAMPAIGN), "seed", str(files_at)], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "CAMPAIGN": str(cwd / "campaign")}, timeout=60)


@pytest.mark.parametrize("pieces", [False, True])
def test_seed_carries_a_leases_runs_without_server_logs_or_locks(tmp_path, pieces):
    files_at = _packed_lease(tmp_path)
    if pieces:  # pack's split of a large archive
        subprocess.run(["split", "-b", "300", "results.tgz", "results.tgz.part-"], cwd=files_at, check=True)
        (files_at / "results.tgz").unlink()
        assert len(list(files_at.glob("results.tgz.part-*"))) > 1
    repo = tmp_path / "repo"
    repo.mkdir()
    done = _seed(files_at, repo)
    assert done.returncode == 0, done.stderr
    run = repo / ".carry" / "results" / "h100" / "workloads-chat-flash"
    kept = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    assert kept == ["r1/summary.json", "r2/requests.jsonl", "recipe.yaml"]


def test_seed_without_a_packed_lease_says_what_it_expected(tmp_path):
    done = _seed(tmp_path, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"seed: {tmp_path} holds no results.tgz nor micro.tgz (nor their .part-* "
                                   "pieces): expected a campaign's packed runs")


def test_seed_and_start_carry_a_leases_microbenchmark_csvs(tmp_path):
    """micro.tgz alone is a lease's work too: `seed` puts its CSVs into .carry/micro, and the
    next `start` copies them into the campaign, where the micro jobs resume them."""
    lease = tmp_path / "lease"
    (lease / "micro").mkdir(parents=True)
    (lease / "micro" / "heldout-untuned.csv").write_text("suite,case\nheldout,dec-a\n")
    files_at = tmp_path / "files_at"
    files_at.mkdir()
    with tarfile.open(files_at / "micro.tgz", "w:gz") as tar:
        tar.add(lease / "micro", arcname="micro")
    repo = tmp_path / "repo"
    repo.mkdir()
    done = _seed(files_at, repo)
    assert done.returncode == 0, done.stderr
    assert (repo / ".carry" / "micro" / "heldout-untuned.csv").read_text() == "suite,case\nheldout,dec-a\n"
    assert not (repo / ".carry" / "results").exists()

    campaign = tmp_path / "next-lease"
    started = subprocess.run(["bash", str(CAMPAIGN), "start"], cwd=CAMPAIGN.parents[2], capture_output=True,
                             text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "CAMPAIGN": str(campaign), "CARRY": str(repo / ".carry"),
                                  "ATTNBENCH_GPU_SETUP": "1", "WAIT_S": "20"})
    assert started.returncode == 0, started.stderr
    assert (campaign / "micro" / "heldout-untuned.csv").read_text() == "suite,case\nheldout,dec-a\n"


@pytest.mark.parametrize("spec, args, csv", [
    ("micro:rules/page-tiles+auto,fa3@none",
     ["recipes/microbench/rules.yaml", "--impl", "auto", "--impl", "fa3", "--only", "page-tiles",
      "--l2-flush", "none"], "rules-page-tiles+auto,fa3-none.csv"),
    ("micro:heldout", ["recipes/microbench/heldout.yaml"], "heldout.csv"),
])
def test_a_micro_job_names_its_suite_group_and_implementations(tmp_path, spec, args, csv):
    """A worker's micro job, with `attnbench` replaced by a script that records its arguments
    (the job's command line is what is under test, not the microbenchmark)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "attnbench"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n')
    fake.chmod(0o755)
    campaign = tmp_path / "campaign"
    done = subprocess.run(["bash", str(CAMPAIGN), "worker", spec], cwd=CAMPAIGN.parents[2], capture_output=True,
                          text=True, timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CAMPAIGN": str(campaign),
                                                      "ATTNBENCH_GPU_SETUP": "1"})
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == ["microbench", *args, "--out", str(campaign / "micro" / csv), "--resume"]
