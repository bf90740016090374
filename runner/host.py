"""The client's machine as a witness: how much CPU it lost while a repeat ran.

On a cloud VM the hypervisor can take CPU time from the guest (steal), and the guest's
own tasks can queue for its CPUs (pressure stall). Either slows the client and, when the
server runs on the same machine, the server too, without any change in the load: a
repeat measured during such a spell reads slower for reasons neither the client nor the
server owns. Reading the kernel's cumulative counters before and after a repeat
(`host_counters`, `host_between`) puts that beside the repeat's own metrics.

Linux only; elsewhere, and where a counter is missing, the counters are left out.
"""

from __future__ import annotations

import os

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
