"""The cross-check's verdict: `attnbench load` beside `vllm bench serve` on one server.

    python3 compare_clients.py CROSS_CHECK_DIR > CROSS_CHECK_DIR/comparison.md
    python3 compare_clients.py DIR_1 DIR_2 ... > pooled.md    several campaigns, then pooled per rate

For each load (burst/, poisson/): per client, the median over its repeats of output
throughput, median TTFT, median ITL and mean TPOT (and more), the difference of attnbench
from vllm bench serve (and of attnbench held to N client processes, attnbench-pN/, where
cross-check.sh ran it), each client's run-to-run spread (max - min over median), and the
issue's criteria (medians within 5%; attnbench's spread no wider than vllm bench's + 2
points). Then the evidence: what the server itself measured for each client's runs (vLLM's
/metrics), how many chunks each client saw, the client's event-loop lag and coalesced
reads, the order in which the server answered the requests (rank correlation of each
request's number with the time of its first token: 1.0 is first come, first served in the
dataset's order), the CPU seconds of the server's processes and of each client, kernel
compiles; each client's latencies minus the server's own for the same requests (the
third witness), and each criterion fitted over the server's own reading run by run (the
clients' difference at equal server timing); what moved the server between runs (its TTFT
and its merging of tokens ranked against the host's speed: CPU seconds per unit of work,
stolen CPU, a probe's fixed work). Given several campaigns (on several hosts), each load is
named DIR/LOAD, and after them every rate that more than one load ran at is pooled: the
criteria over all their runs, fitted over the server's merging and over its own timing.
Where cross-check.sh traced the clients' sends
(SEND_TRACE=1, sent/), each client's TTFT also counted from the moment its request was on
the wire (send_trace.py), with what each client did between its clock's start and that
moment. Where cross-check.sh ran the clients side by side (SIDE_BY_SIDE=1), the
differences within each run too, where the server's drift is common to both clients.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
import random
import statistics  # stdlib only: cross-check.sh runs this on GPU hosts with vLLM's packages alone
import sys
from pathlib import Path

from attnbench.runner.host import COUNTERS as HOST  # the machine's own counters, differenced per run
from attnbench.runner.serverlog import jit_compiles
from attnbench.runner.witness import Snapshot, between

CRITERIA = ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_tpot_ms")
KEYS = CRITERIA + ("mean_ttft_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "duration",
                   "total_output_tokens", "completed")
FIXED = "attnbench-p"  # attnbench-pN/: `attnbench load --client-processes N`, when cross-check.sh made them
NOT_SERVER = ("client", "client_wall", "probe_ms", *HOST)  # the keys of `_cpu` that are no server process
SERVER = ("mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "mean_e2el_ms", "mean_queue_ms", "generation_tokens")


def text_of(path: Path) -> str:
    """A file's text, gunzipped when its name ends in .gz."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()


def _json(path: Path) -> dict:
    return json.loads(text_of(path))


def _repeat(path: Path) -> int:
    return int(path.name.split(".")[0][1:]) if path.name.startswith("r") else int(path.parent.name[1:])


def attnbench_chunks(records: str) -> int:
    """Chunks an attnbench run saw, from its requests.jsonl text."""
    return sum(len(json.loads(line)["chunk_s"]) for line in records.splitlines() if line)


def vllm_bench_chunks(result: dict) -> int:
    """Chunks a vllm bench serve run saw, from its --save-detailed result."""
    return sum(len(gaps) + 1 for gaps, ttft in zip(result["itls"], result.get("ttfts", [])) if ttft)


def _ranks(values: list[float]) -> list[float]:
    """Each value's rank (0-based); tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2
        start = end + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho of two paired lists (tied values share their mean rank); None when
    under 2 pairs or when either list is constant."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(_ranks(xs), _ranks(ys))


def _rank_correlation(times: list[float]) -> float | None:
    """Spearman's rho between request number (0..n-1) and ``times``."""
    return spearman(list(range(len(times))), times)


def attnbench_first_token_order(records: str) -> float | None:
    """How closely the server's first tokens followed the request numbers (attnbench records)."""
    first = {r["index"]: r["chunk_s"][0] for r in map(json.loads, filter(None, records.splitlines()))
             if r["phase"] == "measure" and r["chunk_s"]}
    return _rank_correlation([first[i] for i in sorted(first)])


def vllm_bench_first_token_order(result: dict) -> float | None:
    """The same from a vllm bench serve --save-detailed result (requests in dataset order)."""
    return _rank_correlation([start + ttft for start, ttft in zip(result["start_times"], result["ttfts"]) if ttft])


def sent_rows(load_dir: Path, client: str, repeat: int) -> dict[str, dict]:
    """send_trace.py's rows of one run, by request id (requests without one are left out)."""
    rows = {}
    for path in sorted((load_dir / "sent").glob(f"{client}-r{repeat}.*.jsonl*")):
        for line in filter(None, text_of(path).splitlines()):
            row = json.loads(line)
            if row.get("id") and row.get("headers") is not None:
                rows[row["id"]] = row
    return rows


def on_the_wire(clocked: dict[str, tuple[float, float]], rows: dict[str, dict]) -> dict | None:
    """One run's TTFT counted from when each request was written, and what came before.

    ``clocked``: per request id, the client's own TTFT (ms) and the moment its TTFT clock
    started (``time.perf_counter()`` s, the clock of ``rows``). For each request traced:
    ``wait_ms`` = headers written - the clock's start (connecting, and waiting for the
    client's event loop to write it), ``wire_ttft_ms`` = TTFT - wait, ``taken_ms`` =
    response headers - request headers (vLLM's API server taking the request in). Returns
    medians (and the mean of wire TTFT, the share of requests that had to connect) over the
    run; None when no request was traced.
    """
    both = [(*clocked[i], rows[i]) for i in clocked if i in rows]
    if not both:
        return None
    wait = [(r["headers"] - start) * 1e3 for _, start, r in both]
    wire = [ttft - w for (ttft, _, _), w in zip(both, wait)]
    return {"traced": len(both), "connected": sum(r["new_conn"] for _, _, r in both) / len(both),
            "median_wait_ms": statistics.median(wait), "max_wait_ms": max(wait),
            "median_taken_ms": statistics.median((r["response"] - r["headers"]) * 1e3 for _, _, r in both),
            "median_ttft_ms": statistics.median(ttft for ttft, _, _ in both),
            "median_wire_ttft_ms": statistics.median(wire), "mean_wire_ttft_ms": statistics.fmean(wire)}


def attnbench_wire(load_dir: Path, client: str, repeat: int, records: str) -> dict | None:
    """`on_the_wire` for one attnbench run from its requests.jsonl text (None: not traced).

    Records hold ``sent_s``, seconds after the load's start; the trace starts each request
    at or after that moment, so the load's start on the trace's clock is the smallest
    (trace start - sent_s) over the run's requests (clients forked from one start share it).
    """
    rows = sent_rows(load_dir, client, repeat)
    if not rows:
        return None
    records_by_id = {d["request_id"]: d for d in map(json.loads, filter(None, records.splitlines()))
                     if d["phase"] == "measure" and d["chunk_s"] and d.get("request_id")}
    traced = [(rows[i]["start"] - d["sent_s"]) for i, d in records_by_id.items() if i in rows]
    if not traced:
        return None
    t0 = min(traced)
    return on_the_wire({i: ((d["chunk_s"][0] - d["sent_s"]) * 1e3, t0 + d["sent_s"]) for i, d in records_by_id.items()},
                       rows)


def vllm_bench_wire(load_dir: Path, repeat: int, result: dict) -> dict | None:
    """`on_the_wire` for one vllm bench run from its --save-detailed result (None: not
    traced). vllm bench numbers its request ids <prefix><position> and keeps each
    request's clock start (``start_times``, perf_counter s)."""
    rows = sent_rows(load_dir, "vllm-bench", repeat)
    clocked = {}
    for rid in rows:
        suffix = rid.rsplit("-", 1)[-1]
        j = int(suffix) if suffix.isdigit() else -1
        if 0 <= j < len(result["ttfts"]) and result["ttfts"][j]:
            clocked[rid] = (result["ttfts"][j] * 1e3, result["start_times"][j])
    return on_the_wire(clocked, rows)


def attnbench_runs(load_dir: Path, client: str = "attnbench") -> list[dict]:
    runs = []
    for summary in sorted(load_dir.glob(f"{client}/r*/summary.json"), key=_repeat):
        s = json.loads(summary.read_text())
        records = summary.parent / "requests.jsonl.gz"
        if records.exists():
            text = text_of(records)
            s["chunks"], s["order"] = attnbench_chunks(text), attnbench_first_token_order(text)
            s["wire"] = attnbench_wire(load_dir, client, _repeat(summary), text)
        elif (summary.parent / "chunks.txt").exists():  # archived copies keep only these
            s["chunks"] = int((summary.parent / "chunks.txt").read_text())
            order = summary.parent / "order.txt"
            s["order"] = float(order.read_text()) if order.exists() else None
            wire = summary.parent / "wire.json"
            s["wire"] = json.loads(wire.read_text()) if wire.exists() else None
        s["server"] = s.get("server_metrics") or {}
        s["repeat"] = _repeat(summary)
        runs.append(s)
    return runs


def vllm_bench_runs(load_dir: Path) -> list[dict]:
    runs = []
    for path in sorted(load_dir.glob("vllm-bench/r*.json*"), key=_repeat):
        s = _json(path)
        i = _repeat(path)
        if s.get("itls") is not None:  # --save-detailed; archived copies keep only the count
            s["chunks"] = vllm_bench_chunks(s)
            if s.get("start_times"):
                s["order"] = vllm_bench_first_token_order(s)
                s["wire"] = vllm_bench_wire(load_dir, i, s)
        scrapes = [next(iter(sorted(load_dir.glob(f"vllm-bench/r{i}.{w}.prom*"))), None) for w in ("before", "after")]
        s["server"] = between(*(Snapshot.parse(text_of(p)) for p in scrapes)) if all(scrapes) else {}
        s["repeat"] = i
        runs.append(s)
    return runs


@functools.lru_cache(maxsize=None)
def _probe_samples(root: Path) -> tuple[tuple[float, float], ...]:
    """(epoch s, ms) of every `proc_cpu.py --probe` sample in ``root``'s host-probe.jsonl[.gz]
    (cross-check.sh runs the probe through a whole campaign); empty where there is none."""
    path = next(iter(sorted(root.glob("host-probe.jsonl*"))), None)
    if path is None:
        return ()
    return tuple((r["t"], r["ms"]) for r in map(json.loads, filter(None, text_of(path).splitlines())))


@functools.lru_cache(maxsize=None)
def _cpu(load_dir: Path, client: str, i: int) -> dict:
    """CPU seconds during one client run: per server process (by name), the client's, and
    the host's stolen and stalled seconds (`proc_cpu.host`) where the snapshots hold them;
    ``probe_ms``: the median time of the host probe's fixed work between the snapshots.
    Read once per run (cached); callers must not change the dict."""
    cpu = load_dir / "cpu"
    try:
        before = json.loads((cpu / f"{client}-r{i}.before.json").read_text())
        after = json.loads((cpu / f"{client}-r{i}.after.json").read_text())
        own = json.loads((cpu / f"{client}-r{i}.client.json").read_text())
    except FileNotFoundError:
        return {}
    out: dict = {"client": own["cpu_s"], "client_wall": own["wall_s"]}
    host_before, host_after = before.pop("host", {}), after.pop("host", {})
    for key in HOST:
        if key in host_before and key in host_after:
            out[key] = host_after[key] - host_before[key]
    if "time" in host_before and "time" in host_after:
        during = [ms for t, ms in _probe_samples(load_dir.parent) if host_before["time"] <= t <= host_after["time"]]
        if during:
            out["probe_ms"] = statistics.median(during)
    for pid, p in after.items():
        used = p["cpu_s"] - before.get(pid, {}).get("cpu_s", 0.0)
        if used > 0.5:
            out[p["comm"]] = out.get(p["comm"], 0.0) + used
    return out


def _server_processes(cpu: dict) -> dict:
    """The server processes' CPU seconds (by name) of a `_cpu` record."""
    return {k: v for k, v in cpu.items() if k not in NOT_SERVER}


def _host_label(key: str) -> str:
    """A host counter's name for a table: "steal_s" -> "host steal"."""
    return "host " + key.removesuffix("_s").replace("_", " ")


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread(values) -> float | None:
    values = [v for v in values if v is not None]
    m = _med(values)
    return (max(values) - min(values)) / m * 100 if values and m else None


def _fmt(v, nd=1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{nd}f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _loads(roots: tuple[Path, ...]) -> list[tuple[str, Path]]:
    """Each campaign's load folders (burst/, poisson/), named LOAD, or DIR/LOAD given several."""
    return [(f"{root.name}/{d.name}" if len(roots) > 1 else d.name, d) for root in roots
            for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "attnbench").exists())]


def report(*roots: Path) -> list[str]:
    lines = ["# attnbench load vs vllm bench serve", ""]
    for root in roots:
        lines += _compiles(root, f"{root.name}'s server" if len(roots) > 1 else "the server")
    by_rate: dict[object, list[tuple[str, list[dict], list[dict]]]] = {}
    for name, load_dir in _loads(roots):
        ours, theirs = attnbench_runs(load_dir), vllm_bench_runs(load_dir)
        if not ours or not theirs:
            continue
        by_rate.setdefault(ours[0].get("request_rate"), []).append((name, ours, theirs))
        fixed = {d.name: attnbench_runs(load_dir, d.name)  # optional: attnbench held to N client processes
                 for d in sorted(load_dir.glob(f"{FIXED}*"), key=lambda d: int(d.name[len(FIXED):]))}
        rate = ours[0].get("request_rate")
        side = (load_dir / "side-by-side").exists()
        lines += [f"## {name} (request rate {rate} req/s{' per client' if side else ''}; {len(ours)} attnbench "
                  f"and {len(theirs)} vllm bench serve runs, {'side by side' if side else 'alternating'})", ""]
        lines += _compiles(load_dir, f"{name}'s server (its own launch)")
        lines += _criteria_table(ours, theirs, "attnbench")
        if side:
            lines += _side_by_side_table(ours, theirs)
        if str(rate) == "inf":  # a burst (summaries hold the float inf)
            lines += _net_of_merging(ours, theirs)
        lines += _net_of_server(ours, theirs)
        clients = [("attnbench", ours), *fixed.items(), ("vllm-bench", theirs)]
        lines += _self_agreement_table(clients)
        for name, runs in fixed.items():
            n = name[len(FIXED):]
            lines += ["", f"The same against `attnbench load --client-processes {n}` ({len(runs)} runs, "
                      "interleaved with the others" + ("; one client process, as vllm bench serve has)" if n == "1"
                                                       else ")"), ""]
            lines += _criteria_table(runs, theirs, name)
        lines += ["", "Per run (the server's own view from vLLM's /metrics; chunks the client saw; the order the "
                  "server answered in (rank correlation of request number and first-token time); client health; "
                  "CPU seconds during the run):", "",
                  "| client | run | out tok/s | median TTFT ms | median ITL ms | server mean TTFT ms | server mean ITL ms "
                  "| chunks | first tokens in request order | loop lag p99 ms | coalesced | JIT compiles "
                  "| CPU s: client / server processes |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for client, runs in clients:
            for r in runs:
                s = r["server"]
                cpu = _cpu(load_dir, client, r["repeat"])
                procs = ", ".join(f"{k} {v:.1f}" for k, v in _server_processes(cpu).items())
                procs += "".join(f"; {_host_label(k)} {cpu[k]:.1f}" for k in HOST if k in cpu)
                procs += f"; probe {cpu['probe_ms']:.2f} ms" if "probe_ms" in cpu else ""
                lag = (r.get("client_loop_lag_ms") or {}).get("p99")
                coalesced = r.get("client_coalesced_chunks")
                lines.append(
                    f"| {client} | r{r['repeat']} | {_fmt(r.get('output_throughput'), 0)} | {_fmt(r.get('median_ttft_ms'))} "
                    f"| {_fmt(r.get('median_itl_ms'), 2)} | {_fmt(s.get('mean_ttft_ms'))} | {_fmt(s.get('mean_itl_ms'), 2)} "
                    f"| {r.get('chunks', '-')} | {_fmt(r.get('order'), 2)} | {_fmt(lag, 2)} | {'-' if coalesced is None else f'{coalesced:.1%}'} "
                    f"| {len(r.get('jit_compiles', [])) if 'jit_compiles' in r else '-'} "
                    f"| {_fmt(cpu.get('client'))} / {procs or '-'} |")
        lines += ["", "The server as third witness: each client's mean TTFT and mean ITL minus the server's own "
                  "for the same requests (vLLM's /metrics over the run), ms, median over runs. Every client "
                  "reads the same server, so a difference between rows in the last two columns is the clients' own; "
                  "one in the first two is the server treating the clients' loads differently (or changing "
                  "between their runs: the spread, max - min over median, of its own mean TTFT over each "
                  "client's runs):", "",
                  "| client | server mean TTFT | its spread | mean TTFT - server's | mean ITL - server's |",
                  "|---|---|---|---|---|"]
        for client, runs in clients:
            ttft = _med([_minus(r.get("mean_ttft_ms"), r["server"].get("mean_ttft_ms")) for r in runs])
            itl = _med([_minus(r.get("mean_itl_ms"), r["server"].get("mean_itl_ms")) for r in runs])
            server = [r["server"].get("mean_ttft_ms") for r in runs]
            spread = _spread(server)
            lines.append(f"| {client} | {_fmt(_med(server))} | {'-' if spread is None else f'{spread:.1f}%'} "
                         f"| {_fmt(ttft)} | {_fmt(itl, 2)} |")
        lines.append("")
        lines += _host_witness(load_dir, clients)
        lines += _wire_tables(clients)
    for rate, loads in by_rate.items():
        if len(loads) > 1:
            lines += _pooled(rate, loads)
    return lines


def _host_witness(load_dir: Path, clients: list[tuple[str, list[dict]]]) -> list[str]:
    """What moved the server between runs: Spearman's rho, over the runs of this load, of
    the server's own mean TTFT, and of the chunks the client saw (how many tokens the server
    merged: fewer chunks, more merging), with the CPU seconds the server's processes used,
    with each client's CPU time per chunk it read, with the host's stolen and stalled CPU
    seconds where recorded, and with the host probe's time for its fixed work
    (`proc_cpu.probe`). A client does the same work for every chunk in every run, so its
    CPU time per chunk measures how fast the host ran (it is not ranked against the chunks
    it is divided by); when it and the probe rise with the server's TTFT in both clients'
    runs, the host, not the client, set the spread. A row needs 5 runs with its witness;
    nothing at all under 6 runs."""
    rows = []  # one per run with CPU records and the server's mean TTFT
    for client, runs in clients:
        for r in runs:
            cpu, ttft = _cpu(load_dir, client, r["repeat"]), r["server"].get("mean_ttft_ms")
            if cpu and ttft is not None:
                rows.append({"client": client, "ttft": ttft, "chunks": r.get("chunks"), "host": cpu,
                             "server_s": sum(_server_processes(cpu).values()),
                             "per_chunk": cpu["client"] / r["chunks"] * 1e6 if r.get("chunks") else None})
    if len(rows) < 6:
        return []

    def cell(name: str, witness, against_chunks: bool = True, client: str | None = None) -> str | None:
        """One witness's row: ``witness(row)`` (None: not recorded) over this load's runs, or one client's."""
        had = [(witness(row), row) for row in rows if client in (None, row["client"]) and witness(row) is not None]
        if len(had) < 5:
            return None
        with_chunks = [(x, row["chunks"]) for x, row in had if row["chunks"]]
        rho_chunks = spearman(*zip(*with_chunks)) if against_chunks and len(with_chunks) >= 5 else None
        rho_ttft = spearman([x for x, _ in had], [row["ttft"] for _, row in had])
        return f"| {name} | {_fmt(rho_ttft, 2)} | {_fmt(rho_chunks, 2)} | {len(had)} |"

    cells = [cell("the server's processes' CPU s", lambda row: row["server_s"])]
    cells += [cell(f"{client}'s CPU us per chunk", lambda row: row["per_chunk"], against_chunks=False, client=client)
              for client, _ in clients]
    cells += [cell(f"{_host_label(key)} s", lambda row, key=key: row["host"].get(key)) for key in HOST]
    cells.append(cell("host probe ms (median in the run)", lambda row: row["host"].get("probe_ms")))
    return (["What moved the server between runs: the rank correlation (Spearman) of the server's own mean "
             "TTFT, and of the chunks each run's client saw (fewer: the server merged more tokens into "
             "one chunk), with each witness, over the runs. A client does the same work for each chunk in "
             "every run, so its CPU time per chunk measures how fast the host ran, as does the time the "
             "host probe (`proc_cpu.py --probe`, where it ran) takes for its fixed work:", "",
             "| witness | rho with the server's mean TTFT | rho with the chunks | runs |", "|---|---|---|---|"]
            + [c for c in cells if c] + [""])


def _wire_tables(clients: list[tuple[str, list[dict]]]) -> list[str]:
    """Where each client's TTFT clock starts (send_trace.py): per run, then the criterion on
    TTFT counted from the request's write. Nothing when no run was traced."""
    if not any(r.get("wire") for _, runs in clients for r in runs):
        return []
    lines = ["Where each client's TTFT clock starts (aiohttp's trace of every request, send_trace.py): "
             "wait = request headers written - the client's clock start (connecting, then the client's own "
             "event loop getting to the write); taken = response headers - request headers (vLLM's API server "
             "taking the request in); TTFT from the write = TTFT - wait. ms, per run:", "",
             "| client | run | traced | had to connect | median wait | max wait | median taken | median TTFT "
             "| median TTFT from the write | mean TTFT from the write |", "|---|---|---|---|---|---|---|---|---|---|"]
    for client, runs in clients:
        for r in runs:
            w = r.get("wire")
            if w:
                lines.append(f"| {client} | r{r['repeat']} | {w['traced']} | {w['connected']:.0%} | "
                             f"{_fmt(w['median_wait_ms'])} | {_fmt(w['max_wait_ms'])} | {_fmt(w['median_taken_ms'])} | "
                             f"{_fmt(w['median_ttft_ms'])} | {_fmt(w['median_wire_ttft_ms'])} | {_fmt(w['mean_wire_ttft_ms'])} |")
    theirs = next((runs for client, runs in clients if client == "vllm-bench"), [])
    lines += ["", "The TTFT criterion with both clocks started at the write (medians over runs):", "",
              "| client | median TTFT from the write | - vllm bench's | spread | vllm spread | criterion |",
              "|---|---|---|---|---|---|"]
    theirs_wire = _wire_ttfts(theirs)
    sv = _spread(theirs_wire)
    lines.append(f"| vllm-bench | {_fmt(_med(theirs_wire))} | | | {_fmt(sv)}% | |")
    for client, runs in clients:
        if client == "vllm-bench":
            continue
        values = _wire_ttfts(runs)
        result = criterion(values, theirs_wire)
        if result is None:
            continue
        _, diff, sa, _ = result
        lines.append(f"| {client} | {_fmt(_med(values))} | {_fmt(diff)}% | {_fmt(sa)}% | {_fmt(sv)}% | "
                     f"{_verdict(result)} |")
    return lines + [""]


def _values(runs: list[dict], key: str) -> list[float]:
    """``key`` of every run that has it."""
    return [r[key] for r in runs if r.get(key) is not None]


def _wire_ttfts(runs: list[dict]) -> list[float]:
    """Each traced run's median TTFT counted from the write (ms); untraced runs left out."""
    return [w["median_wire_ttft_ms"] for w in (r.get("wire") for r in runs) if w]


def _compiles(where: Path, whose: str) -> list[str]:
    """Kernel compiles logged after /health by the server whose log lies in `where` (none: no lines)."""
    log = next(iter(sorted(where.glob("server.log*"))), None)
    if log is None:
        return []
    text = text_of(log)
    started = text.rfind("Application startup complete")
    compiles = jit_compiles(text[max(started, 0):].splitlines())
    return ([f"Kernel compiles {whose} logged after it answered /health: {len(compiles)}", ""]
            + [f"- `{c[:200]}`" for c in compiles] + ([""] if compiles else []))


def _pooled(rate, loads: list[tuple[str, list[dict], list[dict]]]) -> list[str]:
    """Every campaign at one request rate taken together: the criteria, then `_net_of_merging`
    and `_net_of_server`."""
    names = ", ".join(f"{name}/" for name, _, _ in loads)
    ours = [r for _, runs, _ in loads for r in runs]
    theirs = [r for _, _, runs in loads for r in runs]
    lines = [f"## All runs at request rate {rate} req/s pooled ({names}: {len(ours)} attnbench and "
             f"{len(theirs)} vllm bench serve runs)", "",
             "Each load's difference, attnbench - vllm bench serve, of the medians over its runs:", "",
             "| load | pairs | " + " | ".join(CRITERIA) + " |", "|---" * (len(CRITERIA) + 2) + "|"]
    for name, a_runs, v_runs in loads:
        diffs = [difference_pct(_values(a_runs, k), _values(v_runs, k)) for k in CRITERIA]
        lines.append(f"| {name} | {min(len(a_runs), len(v_runs))} | "
                     + " | ".join("-" if d is None else f"{d:+.1f}%" for d in diffs) + " |")
    lines += ["", "Over all of them (a spread here also holds what differed between the loads' servers or hosts):", ""]
    return (lines + _criteria_table(ours, theirs, "attnbench") + _net_of_merging(ours, theirs)
            + _net_of_server(ours, theirs) + [""])


def common_slope_fit(xs: list[list[float]], ys: list[list[float]]) -> tuple[float, list[float], float, float]:
    """Least squares of y over x with one slope for every group and one offset per group
    (analysis of covariance): (slope, each group's offset, the residuals' standard
    deviation, the correlation of x and y over all points). A difference of two offsets is
    the difference of the groups at equal x."""
    centred = [([x - statistics.fmean(gx) for x in gx], [y - statistics.fmean(gy) for y in gy])
               for gx, gy in zip(xs, ys)]
    sxx = sum(x * x for cx, _ in centred for x in cx)
    slope = sum(x * y for cx, cy in centred for x, y in zip(cx, cy)) / sxx if sxx else 0.0
    offsets = [statistics.fmean(gy) - slope * statistics.fmean(gx) for gx, gy in zip(xs, ys)]
    residuals = [y - slope * x for cx, cy in centred for x, y in zip(cx, cy)]
    flat_x, flat_y = [x for g in xs for x in g], [y for g in ys for y in g]
    return slope, offsets, statistics.pstdev(residuals), statistics.correlation(flat_x, flat_y)


def _net_of(ours: list[dict], theirs: list[dict], witness: dict, heading: str, per: str, scale: float) -> list[str]:
    """Each criterion fitted over a witness of the same run (``witness[criterion](run)``, in
    units of ``scale``) by `common_slope_fit`, attnbench and vllm bench as the groups: the
    two clients' difference at equal witness, to be read against the residuals' standard
    deviation. Nothing when a client has fewer than 2 runs with the witness, or the witness
    is the same in every run."""
    lines = []
    for k, of in witness.items():
        groups = [[(of(r) / scale, r[k]) for r in runs if of(r) is not None and r.get(k) is not None]
                  for runs in (ours, theirs)]
        if min(map(len, groups)) < 2 or len({x for g in groups for x, _ in g}) < 2 \
                or len({y for g in groups for _, y in g}) < 2:
            continue
        slope, offsets, residual, corr = common_slope_fit([[x for x, _ in g] for g in groups],
                                                          [[y for _, y in g] for g in groups])
        net, theirs_median = offsets[0] - offsets[1], statistics.median(y for _, y in groups[1])
        share = f"{net / theirs_median * 100:+.1f}%" if theirs_median else "-"
        lines.append(f"| {k} | {slope:+.2f} | {corr:+.2f} | {net:+.2f} | {share} | {residual:.2f} |")
    return (["", heading, "", f"| metric | change per {per} | correlation | attnbench - vllm bench, net | "
             "of vllm bench's median | residual std |", "|---|---|---|---|---|---|"] + lines) if lines else []


def _net_of_merging(ours: list[dict], theirs: list[dict]) -> list[str]:
    """The server's merging taken out of a burst's criteria: at a burst, how far vLLM's API
    server falls behind the engine decides how many tokens it merges into one chunk, and
    that moves every run's ITL and TPOT for either client; each is fitted over the chunks
    the client saw (`_net_of`)."""
    chunks = {k: (lambda r: r.get("chunks")) for k in CRITERIA[1:]}
    return _net_of(ours, theirs, chunks, "Net of the server's merging (each criterion fitted over the chunks "
                   "the client saw, one slope for all runs, one offset per client):", "1,000 more chunks", 1000)


def _net_of_server(ours: list[dict], theirs: list[dict]) -> list[str]:
    """The server's own run-to-run variation taken out: each latency criterion fitted over
    what the server itself measured in the same run (vLLM's /metrics: its mean TTFT for the
    client's median TTFT, its mean ITL for the client's median ITL and mean TPOT). Where the
    host's speed moves the server between runs, both clients' latencies move with it; the
    difference at equal server timing is the clients' own (`_net_of`)."""
    witness = {"median_ttft_ms": lambda r: r.get("server", {}).get("mean_ttft_ms"),
               "median_itl_ms": lambda r: r.get("server", {}).get("mean_itl_ms"),
               "mean_tpot_ms": lambda r: r.get("server", {}).get("mean_itl_ms")}
    return _net_of(ours, theirs, witness, "Net of the server's own timing (each criterion fitted over the "
                   "server's mean TTFT or mean ITL in the same run, /metrics; one slope for all runs, one "
                   "offset per client):", "ms of the server's", 1)


def permutation_p(a: list[float], b: list[float], draws: int = 20_000) -> float | None:
    """How often the difference of medians of two groups of runs is at least as large as
    ``a``'s against ``b``'s when the runs are dealt to the groups at random (two-sided):
    whether a difference between clients stands out from the run-to-run variation. Every
    split is enumerated when there are at most ``draws`` of them (5 + 5 runs: 252, and no
    difference of medians can reach below p = 12/252 = 0.048), else ``draws`` splits are
    drawn with a fixed seed."""
    if len(a) < 2 or len(b) < 2:
        return None
    runs = a + b
    observed = abs(statistics.median(a) - statistics.median(b)) - 1e-9

    def farther(picked) -> bool:
        rest = [x for i, x in enumerate(runs) if i not in picked]
        return abs(statistics.median([runs[i] for i in picked]) - statistics.median(rest)) >= observed

    if math.comb(len(runs), len(a)) <= draws:
        splits = [set(c) for c in itertools.combinations(range(len(runs)), len(a))]
    else:
        rng = random.Random(0)
        splits = [set(rng.sample(range(len(runs)), len(a))) for _ in range(draws)]
    return sum(map(farther, splits)) / len(splits)


def difference_pct(ours: list[float], theirs: list[float]) -> float | None:
    """The median of ``ours`` over the median of ``theirs``, minus 1, in % (None: a group is
    empty or ``theirs``' median is 0)."""
    a, v = _med(ours), _med(theirs)
    return (a - v) / v * 100 if a is not None and v else None


def criterion(ours: list[float], theirs: list[float]) -> tuple[bool, float, float, float] | None:
    """The issue's criterion for one metric over two groups of runs: the medians of runs
    within 5% of ``theirs``, and ``ours``' spread (max - min over median, %) no wider than
    ``theirs``' + 2 points. Returns (passes, difference %, our spread, their spread), or None
    when a group is empty or ``theirs``' median is 0."""
    diff, sa, sv = difference_pct(ours, theirs), _spread(ours), _spread(theirs)
    if diff is None or sa is None or sv is None:
        return None
    return abs(diff) <= 5 and sa <= sv + 2, diff, sa, sv


def _verdict(result: tuple[bool, float, float, float]) -> str:
    ok, diff, sa, sv = result
    return ("pass" if ok else "FAIL") + f" (|diff| {abs(diff):.1f}% <= 5; spread {sa:.1f} <= {sv + 2:.1f})"


def self_agreement(values: list[float]) -> float | None:
    """How often one client passes the issue's criterion against itself: every choice of
    n // 2 of its n runs against the rest (each half taken once as "ours" when n is even),
    the share of these deals that pass `criterion`. What a
    criterion can tell apart: where a client meets it against itself in only some of the
    deals, the server's run-to-run variation decides a verdict between clients as often.
    None with fewer than 6 runs (halves of 3)."""
    if len(values) < 6:
        return None
    n = len(values)
    deals = []
    for picked in itertools.combinations(range(n), n // 2):
        half = [values[i] for i in picked]
        rest = [values[i] for i in range(n) if i not in picked]
        deals += [(half, rest), (rest, half)] if n % 2 == 0 else [(half, rest)]
    results = [criterion(a, b) for a, b in deals]
    return sum(bool(r and r[0]) for r in results) / len(results)


def _self_agreement_table(clients: list[tuple[str, list[dict]]]) -> list[str]:
    """`self_agreement` of each client with 6 runs or more, per criterion (nothing otherwise)."""
    shares = {client: {k: self_agreement(_values(runs, k)) for k in CRITERIA}
              for client, runs in clients}
    shown = [c for c, by_key in shares.items() if any(v is not None for v in by_key.values())]
    if not shown:
        return []
    lines = ["", "Each client against itself: its runs dealt into two halves in every way, the share of "
             "deals in which one half passes the criterion against the other (1.00: the criterion "
             "always holds between two runs of one client on this server):", "",
             "| metric | " + " | ".join(f"{c} vs {c}" for c in shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for k in CRITERIA:
        lines.append(f"| {k} | " + " | ".join(_fmt(shares[c][k], 2) for c in shown) + " |")
    return lines


def _criteria_table(ours: list[dict], theirs: list[dict], label: str, keys=KEYS, judged=CRITERIA) -> list[str]:
    """The issue's table: medians over runs of each client, difference, spreads, and for the
    ``judged`` keys the verdict and the difference's permutation p over the runs
    (`permutation_p`)."""
    lines = [f"| metric | {label} (median of runs) | vllm bench serve | {label} - vllm | {label} spread "
             "| vllm spread | criterion | p, runs permuted |", "|---|---|---|---|---|---|---|---|"]
    for k in keys:
        ours_k, theirs_k = _values(ours, k), _values(theirs, k)
        a, v = _med(ours_k), _med(theirs_k)
        sa, sv = _spread(ours_k), _spread(theirs_k)
        diff = difference_pct(ours_k, theirs_k)
        result = criterion(ours_k, theirs_k) if k in judged else None
        verdict = _verdict(result) if result else ""
        p = permutation_p(ours_k, theirs_k) if k in judged else None
        lines.append(f"| {k} | {_fmt(a)} | {_fmt(v)} | {_fmt(diff)}% | {_fmt(sa)}% | {_fmt(sv)}% | {verdict} "
                     f"| {_fmt(p, 2)} |")
    return lines


def _side_by_side_table(ours: list[dict], theirs: list[dict]) -> list[str]:
    """Side-by-side runs (cross-check.sh SIDE_BY_SIDE=1: both clients at once, each on half
    of the prompts, halves swapped from one run to the next): each criterion's difference
    within each run, where both clients met the same server on the same host, and its
    median over runs and over pairs of runs (a pair sends each client every prompt)."""
    by_run = {r["repeat"]: r for r in theirs}
    runs = [(a, by_run[a["repeat"]]) for a in ours if a["repeat"] in by_run]
    keys = (*CRITERIA, "median_wire_ttft_ms")

    def value(r: dict, k: str):
        return (r.get("wire") or {}).get(k) if k == "median_wire_ttft_ms" else r.get(k)

    def diff(group, k) -> float | None:  # over a run or a pair of (attnbench, vllm bench) runs
        a = [value(x, k) for x, _ in group]
        v = [value(y, k) for _, y in group]
        if None in a or None in v or not sum(v):
            return None
        return (sum(a) / sum(v) - 1) * 100  # the pair's runs weighed alike

    per_run = {k: [diff([run], k) for run in runs] for k in keys}
    pairs = [runs[i:i + 2] for i in range(0, len(runs) - 1, 2)]
    per_pair = {k: [diff(pair, k) for pair in pairs] for k in keys}
    lines = ["", "Within each run (both clients at once, on the same server and host): attnbench - vllm bench, %; "
             "TTFT from the write where the sends were traced:", "",
             "| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for i, (a, _) in enumerate(runs):
        lines.append(f"| r{a['repeat']} | " + " | ".join(_fmt(per_run[k][i]) for k in keys) + " |")
    lines.append("| median over runs | " + " | ".join(_fmt(_med(per_run[k])) for k in keys) + " |")
    lines.append(f"| median over {len(pairs)} pairs | " + " | ".join(_fmt(_med(per_pair[k])) for k in keys) + " |")
    lines += ["", "The issue's criteria over the pairs (a pair: two runs with the halves swapped, so each client "
              "sent every prompt; a client's value for a pair: the mean of its two runs'), each pair taken as "
              "one run: medians over the pairs and spreads over them:", ""]

    def pair_values(side: int) -> list[dict]:  # one client's pairs, as runs of their own
        return [{k: _pair_mean([value(run[side], k) for run in pair]) for k in keys} for pair in pairs]

    return lines + _criteria_table(pair_values(0), pair_values(1), "attnbench", keys, judged=keys) + [""]


def _pair_mean(values: list) -> float | None:
    """The mean of a pair's two values (None if either is missing)."""
    return statistics.fmean(values) if values and None not in values else None


def _minus(a, b):
    return a - b if a is not None and b is not None else None


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: compare_clients.py CROSS_CHECK_DIR [CROSS_CHECK_DIR ...]")
    print("\n".join(report(*map(Path, sys.argv[1:]))))
