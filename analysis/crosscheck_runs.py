"""A cross-check campaign's client runs as rows: each `attnbench load` and `vllm bench
serve` run of a campaign folder (as `attnbench crosscheck run` wrote it, or the
``crosscheck.json`` an archived copy keeps) with its summary's metrics, the chunks the
client saw, the order in which the server answered, its TTFT counted from the request's
write, what the server itself measured over the run (vLLM's /metrics) and the CPU seconds
of the server's processes, of the client and of the host (`campaign_rows`); and what a
repository keeps of a campaign (`archive`)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from attnbench.runner.crosscheck import CAMPAIGN_FILE, PROBE_FILE
from attnbench.runner.host import COUNTERS as HOST  # the machine's own counters, differenced per run
from attnbench.runner.serverlog import jit_compiles
from attnbench.runner.store import REQUESTS_FILE, SUMMARY_FILE, atomic_write_json, atomic_write_text

from .agreement import spearman

CRITERIA = ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_tpot_ms")
KEYS = CRITERIA + ("mean_ttft_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "duration",
                   "total_output_tokens", "completed")
ARCHIVE_FILE = "crosscheck.json"  # an archived campaign's rows (`archive`)
COMPARISON_FILE = "comparison.md"
SERVER_CPU_FLOOR_S = 0.5  # server processes that used less CPU during a run are left out of its record


class CrossCheckDataError(ValueError):
    """A folder that holds no cross-check campaign, or one that cannot be read."""


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
