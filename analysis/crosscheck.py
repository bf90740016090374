"""The cross-check's verdict: `attnbench load` beside `vllm bench serve` on one server
(`attnbench.runner.crosscheck` runs the campaign).

    attnbench crosscheck compare DIR [DIR ...] [--out comparison.md]
    attnbench crosscheck archive SRC DEST

Each client run is one row (`crosscheck_runs.campaign_rows`: its metrics, the chunks the
client saw, the order in which the server answered, its TTFT counted from the request's
write, the server's own /metrics over the run, and CPU seconds). Per load (burst, Poisson):
per client, the median over its runs of output throughput, median TTFT, median ITL and
mean TPOT (`CRITERIA`, and more), how far attnbench is from vllm bench serve (and
attnbench held to N client processes, where the campaign ran it), each client's run-to-run
spread (max - min over median) and the agreement criteria: medians within 5%, attnbench's
spread no wider than vllm bench's + 2 points (`agreement.criterion`), with a permutation p
over the runs. Then the evidence: each client against itself (`agreement.self_agreement`),
each client's latencies minus the server's own for the same requests, each criterion fitted
over the server's own reading run by run (the clients' difference at equal server timing),
what moved the server between runs (the host's speed), and TTFT from the write. Side by
side, the differences within each run and each pair of runs too, where the server's drift
is common to both clients. Given several campaigns (on several hosts), each load is named
DIR/LOAD, and every rate that more than one load ran at is pooled.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from attnbench.runner.crosscheck import CAMPAIGN_FILE, FIXED_PREFIX
from attnbench.runner.host import COUNTERS as HOST  # the machine's own counters, differenced per run

from .agreement import (common_slope_fit, criterion, difference_pct, median, permutation_p, self_agreement,
                        spearman, spread)
from .crosscheck_runs import CRITERIA, KEYS, campaign_rows

NOT_SERVER = ("client", "client_wall", "probe_ms", *HOST)  # the keys of a ``cpu`` record that are no server process


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
        ttft = median([_minus(r.get("mean_ttft_ms"), r["server"].get("mean_ttft_ms")) for r in runs])
        itl = median([_minus(r.get("mean_itl_ms"), r["server"].get("mean_itl_ms")) for r in runs])
        server = [r["server"].get("mean_ttft_ms") for r in runs]
        server_spread = spread(server)
        lines.append(f"| {client} | {_fmt(median(server))} | {'-' if server_spread is None else f'{server_spread:.1f}%'} "
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
    sv = spread(theirs_wire)
    lines.append(f"| vllm-bench | {_fmt(median(theirs_wire))} | | | {_fmt(sv)}% | |")
    for client, runs in clients:
        if client == "vllm-bench":
            continue
        values = _wire_ttfts(runs)
        result = criterion(values, theirs_wire)
        if result is None:
            continue
        _, diff, sa, _ = result
        lines.append(f"| {client} | {_fmt(median(values))} | {_fmt(diff)}% | {_fmt(sa)}% | {_fmt(sv)}% | "
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


def _verdict(result: tuple[bool, float, float, float]) -> str:
    ok, diff, sa, sv = result
    return ("pass" if ok else "FAIL") + f" (|diff| {abs(diff):.1f}% <= 5; spread {sa:.1f} <= {sv + 2:.1f})"


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
        a, v = median(ours_k), median(theirs_k)
        sa, sv = spread(ours_k), spread(theirs_k)
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
    lines.append("| median over runs | " + " | ".join(_fmt(median(per_run[k])) for k in keys) + " |")
    lines.append(f"| median over {len(pairs)} pairs | " + " | ".join(_fmt(median(per_pair[k])) for k in keys) + " |")
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
