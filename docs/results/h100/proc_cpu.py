"""CPU time of processes, for the cross-check (Linux /proc; seconds of user + system time).

    python3 proc_cpu.py PID                 JSON: every descendant of PID (the vLLM server's
                                            API-server, engine-core and worker processes),
                                            and under "host" the whole machine's counters
    python3 proc_cpu.py --run OUT -- CMD..  run CMD; write its (and its children's) CPU
                                            seconds, peak RSS and wall seconds to OUT
    python3 proc_cpu.py --probe OUT         until stopped, time a fixed piece of Python work
                                            every PROBE_EVERY_S and append each time to OUT
                                            (JSON lines: epoch seconds, ms): how fast the
                                            host runs one thread, whatever slows it
"""

import json
import os
import resource
import subprocess
import sys
import time

from attnbench.runner.host import TICK, host_counters  # TICK: /proc's clock ticks per second

PROBE_EVERY_S = 0.25
PROBE_WORK = 50_000  # squares summed per probe: ~2 ms on one current x86 core


def probe(out: str) -> None:
    """Append {"t": epoch s, "ms": wall ms of PROBE_WORK} to ``out`` every PROBE_EVERY_S until
    killed. Wall time, not CPU time: a frequency drop, the hypervisor's steal and contention
    for the core all lengthen it alike."""
    with open(out, "a") as fh:
        while True:
            start = time.perf_counter()
            sum(i * i for i in range(PROBE_WORK))
            ms = (time.perf_counter() - start) * 1e3
            fh.write(json.dumps({"t": round(time.time(), 3), "ms": round(ms, 4)}) + "\n")
            fh.flush()
            time.sleep(PROBE_EVERY_S)


def _stat(pid: int):
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read()
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK  # ppid, utime + stime


def host() -> dict:
    """The machine's cumulative counters (`attnbench.runner.host.host_counters`: stolen and
    stalled CPU seconds) and the epoch time they were read at, which places a snapshot among
    --probe's samples. Differenced around a run they say whether the host, not the server,
    slowed down."""
    return {"time": time.time(), **host_counters()}


def descendants(root: int) -> dict:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table[int(entry)] = _stat(int(entry))
            except (OSError, ValueError):
                continue
    keep, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in table:
            keep[pid] = table[pid]
            frontier += [p for p, (_, ppid, _) in table.items() if ppid == pid]
    return {str(p): {"comm": c, "cpu_s": cpu} for p, (c, _, cpu) in keep.items()}


if __name__ == "__main__":
    if sys.argv[1] == "--run":
        out, cmd = sys.argv[2], sys.argv[sys.argv.index("--") + 1:]
        start = time.perf_counter()
        rc = subprocess.call(cmd)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(out, "w") as fh:
            json.dump({"cmd": cmd[:3], "rc": rc, "wall_s": time.perf_counter() - start,
                       "cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_mib": usage.ru_maxrss / 1024}, fh)
        sys.exit(rc)
    if sys.argv[1] == "--probe":
        probe(sys.argv[2])
    print(json.dumps({"host": host(), **descendants(int(sys.argv[1]))}))
