"""A real single-node Slurm for the tests: Debian's slurmctld + slurmd + munge, with a
minimal slurm.conf in a temporary folder (linuxproc process tracking, no task plugin, one
node with this machine's CPUs and memory, one partition). Started as root in seconds;
`SingleNodeSlurm.env` points Slurm's commands at it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PROGRAMS = ("sbatch", "squeue", "sinfo", "scancel", "slurmctld", "slurmd", "munged")


def missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None]


class SingleNodeSlurm:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def _node_line(self) -> str:
        out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
        return out.splitlines()[0].strip()

    def _start_munge(self) -> None:
        if subprocess.run(["sh", "-c", "munge -n | unmunge"], capture_output=True).returncode == 0:
            return  # a munged already answers
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create"], check=True)
            shutil.chown(key, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", shutil.which("munged")], check=True)

    def start(self) -> "SingleNodeSlurm":
        for d in ("state", "spool"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=attnbench-test", f"SlurmctldHost={socket.gethostname()}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "MpiDefault=none", "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill", f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd.log",
            f"{self._node_line()} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        self._start_munge()
        subprocess.run(["slurmctld", "-f", str(self.conf), "-c"], env=self.env, check=True)
        subprocess.run(["slurmd", "-f", str(self.conf)], env=self.env, check=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True).stdout
            if "idle" in state:
                return self
            time.sleep(0.3)
        raise RuntimeError(f"slurm node not idle after 30 s; {self.root}/slurmctld.log and slurmd.log say why")

    def wait_idle(self, timeout_s: float) -> None:
        """Until no job is queued or running: two answers of squeue in a row, a second
        apart, that succeed and list nothing. A squeue that fails (slurmctld busy on a
        loaded two-core machine: "Socket timed out") prints nothing too, and is not an
        empty queue."""
        deadline = time.monotonic() + timeout_s
        empty_in_a_row, last = 0, None
        while time.monotonic() < deadline:
            last = subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True)
            empty = last.returncode == 0 and not last.stdout.strip()
            empty_in_a_row = empty_in_a_row + 1 if empty else 0
            if empty_in_a_row == 2:
                return
            time.sleep(1)
        raise TimeoutError(f"jobs still queued after {timeout_s} s; squeue said: "
                           f"{(last.stdout + last.stderr).strip() if last else 'nothing'}")

    def stop(self) -> None:
        subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True)
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            try:
                os.kill(int((self.root / pid_file).read_text()), 15)
            except (OSError, ValueError):
                pass
        time.sleep(0.5)
