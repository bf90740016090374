"""The client's machine as a witness: how much CPU it lost while a repeat ran.

On a cloud VM the hypervisor can take CPU time from the guest (steal), and the guest's
own tasks can queue for its CPUs (pressure stall). Either slows the client and, when the
server runs on the same machine, the server too, without any change in the load: a
repeat measured during such a spell reads slower for reasons neither the client nor the
server owns. Reading the kernel's cumulative counters before and after a repeat
(`host_counters`, `host_between`) puts that beside the repeat's own metrics.

Linux only; elsewhere, and where a counter is missing, the counters are left out.

`attnbench crosscheck` also reads each server process's CPU time (`process_tree_cpu`) and
samples the host's speed through a campaign (`HostProbe`).
"""

from __future__ import annotations

import json
import os
import threading
import time

COUNTERS = ("steal_s", "cpu_stall_s")  # what `host_counters` reads, where the machine has it
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit, per second


def host_counters() -> dict[str, float]:
    """This machine's cumulative counters, seconds since boot: ``steal_s``, CPU time the
    hypervisor gave to others, all CPUs together (/proc/stat); ``cpu_stall_s``, time in
    which some runnable task waited for a CPU (/proc/pressure/cpu "some" total)."""
    out: dict[str, float] = {}
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
        if len(fields) > 8:
            out["steal_s"] = int(fields[8]) / TICK
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/pressure/cpu") as fh:
            some = fh.readline().split()  # some avg10=.. avg60=.. avg300=.. total=<us>
        out["cpu_stall_s"] = int(some[-1].split("=")[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    return out


def host_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The counters' increase from ``before`` to ``after`` (s), for those read both times."""
    return {k: round(after[k] - before[k], 3) for k in before if k in after}


def process_tree_cpu(root: int) -> dict[str, dict]:
    """CPU seconds (user + system) of ``root`` and every process descended from it, by pid:
    ``{"<pid>": {"comm": name, "cpu_s": seconds}}`` (/proc; a process that exits meanwhile is
    left out). Read before and after a load, it says which of a server's processes (its API
    servers, engine core, workers) worked, and how much."""
    table: dict[int, tuple[str, int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    text = fh.read()
            except OSError:
                continue
            comm = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            table[int(entry)] = comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK
    keep, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in table:
            keep[pid] = table[pid]
            frontier += [p for p, (_, ppid, _) in table.items() if ppid == pid]
    return {str(p): {"comm": comm, "cpu_s": cpu} for p, (comm, _, cpu) in keep.items()}


PROBE_EVERY_S = 0.25
PROBE_WORK = 50_000  # squares summed per probe: ~2 ms on one current x86 core


class HostProbe:
    """How fast the host runs one thread, sampled through a campaign: every `PROBE_EVERY_S`
    the wall time of a fixed piece of Python work, appended to a JSONL file as ``{"t": epoch
    s, "ms": ...}``. Wall time, not CPU time: a frequency drop, the hypervisor's steal and
    contention for the core all lengthen it alike. ``with HostProbe(path):`` runs it in a
    daemon thread (the process that holds it only waits on others meanwhile)."""

    def __init__(self, path):
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attnbench-host-probe", daemon=True)

    def _run(self) -> None:
        with open(self.path, "a") as fh:
            while not self._stop.wait(PROBE_EVERY_S):
                start = time.perf_counter()
                sum(i * i for i in range(PROBE_WORK))
                ms = (time.perf_counter() - start) * 1e3
                fh.write(json.dumps({"t": round(time.time(), 3), "ms": round(ms, 4)}) + "\n")
                fh.flush()

    def __enter__(self) -> "HostProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
