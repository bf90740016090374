"""The cross-check's verdict: `attnbench load` beside `vllm bench serve` on one server
(`attnbench.runner.crosscheck` runs the campaign).

    attnbench crosscheck compare DIR [DIR ...] [--out comparison.md]
    attnbench crosscheck archive SRC DEST

First each client run becomes one row (`campaign_rows`, from a campaign's folder as
`crosscheck run` wrote it, or from the ``crosscheck.json`` an archived copy keeps): its
summary's metrics, the chunks the client saw, the order in which the server answered (rank
correlation of each request's number with the time of its first token: 1.0 is first come,
first served in the dataset's order), its TTFT counted from the moment each request was
written (attnbench's ``written_s``; vllm bench's traced sends), what the server itself
measured over the run (vLLM's /metrics: the third witness), and the CPU seconds of the
server's processes, of the client and of the host.

Then per load (burst, Poisson): per client, the median over its runs of output throughput,
median TTFT, median ITL and mean TPOT (`CRITERIA`, and more), how far attnbench is from
vllm bench serve (and attnbench held to N client processes, where the campaign ran it), each client's run-to-run spread (max - min over median) and the agreement criteria:
medians within 5%, attnbench's spread no wider than vllm bench's + 2 points
(`criterion`), with a permutation p over the runs. Then the evidence: each client against
itself (`self_agreement`), each client's latencies minus the server's own for the same
requests, each criterion fitted over the server's own reading run by run (the clients'
difference at equal server timing), what moved the server between runs (the host's speed),
and TTFT from the write. Side by side, the differences within each run and each pair of
runs too, where the server's drift is common to both clients. Given several campaigns (on
several hosts), each load is named DIR/LOAD, and every rate that more than one load ran
at is pooled.

Statistics are the standard library's: the comparison runs wherever attnbench does.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from pathlib import Path

from attnbench.runner.crosscheck import CAMPAIGN_FILE, FIXED_PREFIX, PROBE_FILE
from attnbench.runner.host import COUNTERS as HOST  # the machine's own counters, differenced per run
from attnbench.runner.serverlog import jit_compiles
from attnbench.runner.store import REQUESTS_FILE, SUMMARY_FILE, atomic_write_json, atomic_write_text

CRITERIA = ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_tpot_ms")
KEYS = CRITERIA + ("mean_ttft_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "duration",
                   "total_output_tokens", "completed")
NOT_SERVER = ("client", "client_wall", "probe_ms", *HOST)  # the keys of a ``cpu`` record that are no server process
ARCHIVE_FILE = "crosscheck.json"  # an archived campaign's rows (`archive`)
COMPARISON_FILE = "comparison.md"
SERVER_CPU_FLOOR_S = 0.5  # server processes that used less CPU during a run are left out of its record


class CrossCheckDataError(ValueError):
    """A folder that holds no cross-check campaign, or one that cannot be read."""


# ---------------------------------------------------------------------- rows
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


def first_token_order(first_token_s: list[float]) -> float | None:
    """Spearman's rho between request number (0..n-1) and the time of its first token."""
    return spearman(list(range(len(first_token_s))), first_token_s)


def on_the_wire(requests: list[tuple[float, float, bool, float | None]]) -> dict | None:
    """One run's TTFT counted from when each request was written, and what came before.

    ``requests``: per request, its TTFT by the client's own clock (ms), the wait from that
    clock's start to its headers on the socket (ms: taking or opening a connection, the
    client's event loop getting to the write), whether it had to connect, and how long the
    server's API process took to answer with headers (ms; None where unknown). Returns
    medians (and the mean of TTFT from the write, the share that had to connect) over the
    run; None when no request was traced."""
    if not requests:
        return None
    wire = [ttft - wait for ttft, wait, _, _ in requests]
    taken = [t for _, _, _, t in requests if t is not None]
    return {"traced": len(requests), "connected": sum(c for _, _, c, _ in requests) / len(requests),
            "median_wait_ms": statistics.median(w for _, w, _, _ in requests),
            "max_wait_ms": max(w for _, w, _, _ in requests),
            "median_taken_ms": statistics.median(taken) if taken else None,
            "median_ttft_ms": statistics.median(t for t, _, _, _ in requests),
            "median_wire_ttft_ms": statistics.median(wire), "mean_wire_ttft_ms": statistics.fmean(wire)}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def attnbench_row(run_dir: Path) -> dict:
    """One `attnbench load` run (``r<i>/`` with summary.json and requests.jsonl) as a row."""
    s = json.loads((run_dir / SUMMARY_FILE).read_text())
    row = {k: s.get(k) for k in (*KEYS, "request_rate", "client_loop_lag_ms", "client_coalesced_chunks",
                                 "jit_compiles")}
    row["server"] = s.get("server_metrics") or {}
    records = [r for r in _jsonl(run_dir / REQUESTS_FILE) if r["phase"] == "measure"] \
        if (run_dir / REQUESTS_FILE).exists() else []
    answered = sorted((r for r in records if r["chunk_s"]), key=lambda r: r["index"])
    row["chunks"] = sum(len(r["chunk_s"]) for r in answered) if records else None
    row["order"] = first_token_order([r["chunk_s"][0] for r in answered])
    row["wire"] = on_the_wire([((r["chunk_s"][0] - r["sent_s"]) * 1e3, (r["written_s"] - r["sent_s"]) * 1e3,
                                False, None) for r in answered if r.get("written_s") is not None])
    return row


def vllm_bench_row(result_path: Path) -> dict:
    """One `vllm bench serve --save-result --save-detailed` run as a row; its traced sends
    (``r<i>.sent.jsonl``) give TTFT from the write. vllm bench numbers its request ids
    <prefix><position> and keeps each request's clock start (``start_times``, perf_counter
    s, the trace's clock)."""
    s = json.loads(result_path.read_text())
    row = {k: s.get(k) for k in (*KEYS, "request_rate")}
    ttfts, starts = s.get("ttfts") or [], s.get("start_times") or []
    row["chunks"] = sum(len(gaps) + 1 for gaps, ttft in zip(s.get("itls") or [], ttfts) if ttft) if ttfts else None
    row["order"] = first_token_order([start + ttft for start, ttft in zip(starts, ttfts) if ttft]) if starts else None
    sent = result_path.with_name(result_path.name.removesuffix(".json") + ".sent.jsonl")
    traced = []
    for t in (_jsonl(sent) if sent.exists() else []):
        suffix = (t.get("id") or "").rsplit("-", 1)[-1]
        j = int(suffix) if suffix.isdigit() else -1
        if t.get("headers") is not None and 0 <= j < len(ttfts) and ttfts[j] and j < len(starts):
            traced.append((ttfts[j] * 1e3, (t["headers"] - starts[j]) * 1e3, t["new_conn"],
                           (t["response"] - t["headers"]) * 1e3 if t.get("response") else None))
    row["wire"] = on_the_wire(traced)
    return row


def _probe_samples(root: Path) -> list[tuple[float, float]]:
    path = root / PROBE_FILE
    return [(r["t"], r["ms"]) for r in _jsonl(path)] if path.exists() else []


def cpu_record(witness: dict, probe: list[tuple[float, float]]) -> dict:
    """CPU seconds during one client run (a witness file of `runner.crosscheck`): per
    server process (by name, those over `SERVER_CPU_FLOOR_S`), the client's (``client``,
    ``client_wall``), the host's stolen and stalled seconds, and ``probe_ms``: the median
    time of the host probe's fixed work meanwhile."""
    before, after = witness.get("before", {}), witness.get("after", {})
    out: dict = {}
    if witness.get("client_cpu_s") is not None:
        out["client"], out["client_wall"] = witness["client_cpu_s"], witness.get("wall_s")
    for key in HOST:
        if key in before.get("host", {}) and key in after.get("host", {}):
            out[key] = after["host"][key] - before["host"][key]
    during = [ms for t, ms in probe if before.get("time", math.inf) <= t <= after.get("time", -math.inf)]
    if during:
        out["probe_ms"] = statistics.median(during)
    for pid, p in after.get("processes", {}).items():
        used = p["cpu_s"] - before.get("processes", {}).get(pid, {}).get("cpu_s", 0.0)
        if used > SERVER_CPU_FLOOR_S:
            out[p["comm"]] = out.get(p["comm"], 0.0) + used
    return out


def _repeat_of(path: Path) -> int:
    return int(path.name.split(".")[0][1:])


def campaign_rows(root: Path) -> tuple[list[dict], dict[str, list[str]]]:
    """Every client run of a campaign folder as a row (``load``, ``side_by_side``,
    ``client``, ``repeat`` and the measures of `attnbench_row` / `vllm_bench_row`, with the
    server's view from the run's witness and its ``cpu`` record), and the kernel compiles
    the server logged after it answered /health (by folder: "" the campaign's server, else
    a load's own). An archived campaign holds both in ``crosscheck.json``."""
    if (root / ARCHIVE_FILE).exists():
        data = json.loads((root / ARCHIVE_FILE).read_text())
        return data["runs"], data.get("compiles", {})
    if not root.is_dir():
        raise CrossCheckDataError(f"{root}: no such folder; expected a campaign of `attnbench crosscheck run`")
    probe = _probe_samples(root)
    side = json.loads((root / CAMPAIGN_FILE).read_text()).get("side_by_side", False) \
        if (root / CAMPAIGN_FILE).exists() else False
    rows, compiles = [], {"": _compiles_in(root)}
    for load_dir in sorted(p for p in root.iterdir() if p.is_dir() and (p / "attnbench").is_dir()):
        compiles[load_dir.name] = _compiles_in(load_dir)
        runs = [(d.parent.name, _repeat_of(d), attnbench_row(d))
                for d in sorted(load_dir.glob("attnbench*/r[0-9]*")) if (d / SUMMARY_FILE).exists()]
        runs += [("vllm-bench", _repeat_of(p), vllm_bench_row(p)) for p in sorted(load_dir.glob("vllm-bench/r*.json"))
                 if p.name.removesuffix(".json")[1:].isdigit()]
        for client, repeat, row in runs:
            witness_path = load_dir / "witness" / f"{client}-r{repeat}.json"
            witness = json.loads(witness_path.read_text()) if witness_path.exists() else {}
            if witness.get("server"):
                row["server"] = witness["server"]
            rows.append({"load": load_dir.name, "side_by_side": side, "client": client, "repeat": repeat, **row,
                         "server": row.get("server") or {}, "cpu": cpu_record(witness, probe) if witness else {}})
    if not rows:
        raise CrossCheckDataError(f"{root}: no client runs found; expected LOAD/attnbench/r<i>/{SUMMARY_FILE} "
                                  f"and LOAD/vllm-bench/r<i>.json (or an archived {ARCHIVE_FILE})")
    rows.sort(key=lambda r: (r["load"], r["client"], r["repeat"]))
    return rows, {k: v for k, v in compiles.items() if v is not None}


def _compiles_in(folder: Path) -> list[str] | None:
    """Kernel compiles logged after /health by the server whose log lies in ``folder``
    (None: no server log there)."""
    log = folder / "server.log"
    if not log.exists():
        return None
    text = log.read_text(errors="replace")
    started = text.rfind("Application startup complete")
    return jit_compiles(text[max(started, 0):].splitlines())


def archive(src: Path, dest: Path) -> Path:
    """What a repository keeps of a campaign: its rows and compiles (``crosscheck.json``),
    its ``campaign.json`` and its comparison; per-request records, /metrics pages and logs
    stay behind (the rows hold what the comparison reads of them)."""
    rows, compiles = campaign_rows(src)
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_json(dest / ARCHIVE_FILE, {"runs": rows, "compiles": compiles})
    for name in (CAMPAIGN_FILE, COMPARISON_FILE):
        if (src / name).exists() and src.resolve() != dest.resolve():
            atomic_write_text(dest / name, (src / name).read_text())
    return dest


# ---------------------------------------------------------------------- the report
def report(*roots: Path) -> list[str]:
    """The comparison of one or several campaigns, as Markdown lines."""
    lines = ["# attnbench load vs vllm bench serve", ""]
    by_rate: dict[object, list[tuple[str, list[dict], list[dict]]]] = {}
    for root in roots:
        rows, compiles = campaign_rows(root)
        prefix = f"{root.name}/" if len(roots) > 1 else ""
        lines += _campaign_note(root)
        lines += _compiles(compiles.get(""), f"{root.name}'s server" if len(roots) > 1 else "the server")
        for load in dict.fromkeys(r["load"] for r in rows):
            in_load = [r for r in rows if r["load"] == load]
            name = prefix + load
            ours = [r for r in in_load if r["client"] == "attnbench"]
            theirs = [r for r in in_load if r["client"] == "vllm-bench"]
            if not ours or not theirs:
                continue
            lines += _load_report(name, ours, theirs, in_load, compiles.get(load))
            by_rate.setdefault(ours[0].get("request_rate"), []).append((name, ours, theirs))
    for rate, loads in by_rate.items():
        if len(loads) > 1:
            lines += _pooled(rate, loads)
    return lines


def _load_report(name: str, ours: list[dict], theirs: list[dict], rows: list[dict],
                 compiles: list[str] | None) -> list[str]:
    fixed = {}  # attnbench held to N client processes, where the campaign ran it
    for r in sorted((r for r in rows if r["client"].startswith(FIXED_PREFIX)),
                    key=lambda r: int(r["client"][len(FIXED_PREFIX):])):
        fixed.setdefault(r["client"], []).append(r)
    rate = ours[0].get("request_rate")
    side = ours[0].get("side_by_side", False)
    lines = [f"## {name} (request rate {rate} req/s{' per client' if side else ''}; {len(ours)} attnbench "
             f"and {len(theirs)} vllm bench serve runs, {'side by side' if side else 'alternating'})", ""]
    lines += _compiles(compiles, f"{name}'s server (its own launch)")
    lines += _criteria_table(ours, theirs, "attnbench")
    if side:
        lines += _side_by_side_table(ours, theirs)
    if str(rate) == "inf":  # a burst (summaries hold the float inf)
        lines += _net_of_merging(ours, theirs)
    lines += _net_of_server(ours, theirs)
    clients = [("attnbench", ours), *fixed.items(), ("vllm-bench", theirs)]
    lines += _self_agreement_table(clients)
    for client, runs in fixed.items():
        n = client[len(FIXED_PREFIX):]
        lines += ["", f"The same against `attnbench load --client-processes {n}` ({len(runs)} runs, "
                  "interleaved with the others" + ("; one client process, as vllm bench serve has)" if n == "1"
                                                   else ")"), ""]
        lines += _criteria_table(runs, theirs, client)
    lines += ["", "Per run (the server's own view from vLLM's /metrics; chunks the client saw; the order the "
              "server answered in (rank correlation of request number and first-token time); client health; "
              "CPU seconds during the run):", "",
              "| client | run | out tok/s | median TTFT ms | median ITL ms | server mean TTFT ms | server mean ITL ms "
              "| chunks | first tokens in request order | loop lag p99 ms | coalesced | JIT compiles "
              "| CPU s: client / server processes |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for client, runs in clients:
        for r in runs:
            s, cpu = r["server"], r.get("cpu") or {}
            procs = ", ".join(f"{k} {v:.1f}" for k, v in sorted(_server_processes(cpu).items()))
            procs += "".join(f"; {_host_label(k)} {cpu[k]:.1f}" for k in HOST if k in cpu)
            procs += f"; probe {cpu['probe_ms']:.2f} ms" if "probe_ms" in cpu else ""
            lag = (r.get("client_loop_lag_ms") or {}).get("p99")
            coalesced = r.get("client_coalesced_chunks")
            lines.append(
                f"| {client} | r{r['repeat']} | {_fmt(r.get('output_throughput'), 0)} | {_fmt(r.get('median_ttft_ms'))} "
                f"| {_fmt(r.get('median_itl_ms'), 2)} | {_fmt(s.get('mean_ttft_ms'))} | {_fmt(s.get('mean_itl_ms'), 2)} "
                f"| {_fmt(r.get('chunks'), 0)} | {_fmt(r.get('order'), 2)} | {_fmt(lag, 2)} "
                f"| {'-' if coalesced is None else f'{coalesced:.1%}'} "
                f"| {'-' if r.get('jit_compiles') is None else len(r['jit_compiles'])} "
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
    lines += _host_witness(clients)
    lines += _wire_tables(clients)
    return lines


def _campaign_note(root: Path) -> list[str]:
    """What campaign.json says about where an archived campaign came from (``measured_with``,
    ``records``), where it says so."""
    path = root / CAMPAIGN_FILE
    facts = json.loads(path.read_text()) if path.exists() else {}
    said = [f"{root.name}: {facts[k]}" for k in ("measured_with", "records") if facts.get(k)]
    return said + [""] if said else []


def _compiles(compiles: list[str] | None, whose: str) -> list[str]:
    """The server's kernel compiles after start-up (None: its log was not kept: nothing)."""
    if compiles is None:
        return []
    return ([f"Kernel compiles {whose} logged after it answered /health: {len(compiles)}", ""]
            + [f"- `{c[:200]}`" for c in compiles] + ([""] if compiles else []))


def _server_processes(cpu: dict) -> dict:
    """The server processes' CPU seconds (by name) of a run's ``cpu`` record."""
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


def _host_witness(clients: list[tuple[str, list[dict]]]) -> list[str]:
    """What moved the server between runs: Spearman's rho, over the runs of this load, of
    the server's own mean TTFT, and of the chunks the client saw (how many tokens the server
    merged: fewer chunks, more merging), with the CPU seconds the server's processes used,
    with each client's CPU time per chunk it read, with the host's stolen and stalled CPU
    seconds where recorded, and with the host probe's time for its fixed work
    (`host.HostProbe`). A client does the same work for every chunk in every run, so its
    CPU time per chunk measures how fast the host ran (it is not ranked against the chunks
    it is divided by); when it and the probe rise with the server's TTFT in both clients'
    runs, the host, not the client, set the spread. A row needs 5 runs with its witness;
    nothing at all under 6 runs."""
    rows = []  # one per run with CPU records and the server's mean TTFT
    for client, runs in clients:
        for r in runs:
            cpu, ttft = r.get("cpu") or {}, r["server"].get("mean_ttft_ms")
            if cpu and ttft is not None:
                rows.append({"client": client, "ttft": ttft, "chunks": r.get("chunks"), "host": cpu,
                             "server_s": sum(_server_processes(cpu).values()),
                             "per_chunk": cpu["client"] / r["chunks"] * 1e6
                             if r.get("chunks") and cpu.get("client") is not None else None})
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
             "host probe (where it ran) takes for its fixed work:", "",
             "| witness | rho with the server's mean TTFT | rho with the chunks | runs |", "|---|---|---|---|"]
            + [c for c in cells if c] + [""])


def _wire_tables(clients: list[tuple[str, list[dict]]]) -> list[str]:
    """Where each client's TTFT clock starts (attnbench's ``written_s``, vllm bench's traced
    sends): per run, then the criterion on
    TTFT counted from the request's write. Nothing when no run was traced."""
    if not any(r.get("wire") for _, runs in clients for r in runs):
        return []
    lines = ["Where each client's TTFT clock starts (aiohttp's trace of every request): "
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
    """Side-by-side runs (``--side-by-side``: both clients at once, each on half
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


