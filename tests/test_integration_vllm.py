"""End to end against a real vLLM server (vLLM's CPU build) serving a tiny local model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from attnbench.runner import execute
from attnbench.runner.execute import run_suite
from attnbench.runner.recipe import load_suite
from attnbench.runner.server import port_is_free
from attnbench.runner.store import read_records

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("vllm")]
CANARY = "canary-hf-token-4b1d"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from attnbench.runner.models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-it")


class AfterFirstRecord:
    """A repeat's record writer that does ``action`` (kill or stop the server) once the
    first record is written: inside the runner's own call, so it cannot miss the repeat."""

    def __init__(self, writer, action):
        self.writer, self.action, self.acted_at = writer, action, None

    def __call__(self, record):
        self.writer(record)
        if self.acted_at is None:
            self.acted_at = time.monotonic()
            self.action()

    def digest(self):
        return self.writer.digest()


def signal_server(model_dir: Path, sig: int) -> None:
    for pid in server_pids(model_dir):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def suite_file(tmp_path: Path, model_dir: Path, runs: list[dict], **benchmark) -> Path:
    data = {
        "name": "it",
        "defaults": {
            "model": {"path": str(model_dir), "served_name": "tiny"},
            "serve": {"engine": "v1", "gpu_vendor": "none", "max_num_seqs": 8, "graph_mode": "eager", "dtype": "bfloat16",
                      "max_model_len": 1024, "startup_timeout_s": 300,
                      "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
            "benchmark": {"dataset": {"kind": "random", "input_len": 32, "output_len": 12},
                          "num_prompts": 10, "warmup_requests": 1, "repeats": 2, **benchmark},
        },
        "runs": runs,
    }
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def server_pids(model_dir: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", f"serve {model_dir} "], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_run_completes_exact_tokens_and_cleans_up(tmp_path, model_dir):
    """Two runs that differ only in benchmark settings: the second reuses the first's server."""
    # TTFT may equal E2EL here: on a loaded 2-core machine the client can sleep through a
    # whole 64-token decode and then read every chunk at once. That chunks are timed as
    # they arrive is tested against a paced fake server (test_loadgen); here, that vLLM
    # streams the tokens and the records hold every event.
    # a token in the server's environment (a canary): the server gets it, no file shows it
    env = {"serve": {"env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": CANARY}}}
    suite = load_suite(suite_file(tmp_path, model_dir, [
        {"name": "v1", **env, "benchmark": {"dataset": {"kind": "random", "input_len": 32, "output_len": 64}}},
        {"name": "v1-longer", **env, "benchmark": {"repeats": 1, "num_prompts": 4,
                                                   "dataset": {"kind": "random", "input_len": 32, "output_len": 80}}},
        {"name": "two-api-servers", "serve": {"api_server_count": 2},
         "benchmark": {"repeats": 1, "num_prompts": 6, "warmup_requests": 0}},
    ]))
    outcomes = run_suite(suite, tmp_path / "results")
    assert [o.status for o in outcomes] == ["ok"] * 4
    run_dir = tmp_path / "results" / "it" / "v1"
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["vllm_server_version"] and prov["packages"].get("vllm-cpu")
    port = int(prov["server_argv"][prov["server_argv"].index("--port") + 1])
    for repeat in (1, 2):
        records = read_records(run_dir / f"r{repeat}" / "requests.jsonl")
        assert len(records) == 10
        for r in records:
            assert r.status == "ok"
            assert r.completion_tokens == 64  # ignore_eos: exactly max_tokens
            # one event per token, or (a busy API server merges tokens) fewer, counts unknown
            assert (r.chunk_tokens == [1] * 64 and len(r.chunk_s) == 64) or \
                (r.chunk_tokens == [] and 0 < len(r.chunk_s) < 64), (len(r.chunk_s), r.chunk_tokens)
            assert r.chunk_s == sorted(r.chunk_s)
            ttft, e2el = r.chunk_s[0] - r.sent_s, r.chunk_s[-1] - r.sent_s
            assert 0 < ttft <= e2el
        summary = json.loads((run_dir / f"r{repeat}" / "summary.json").read_text())
        assert summary["completed"] == 10 and summary["total_output_tokens"] == 640
        # the server's own count of what it generated (vLLM's /metrics) equals the client's
        assert summary["server_metrics"]["generation_tokens"] == 640
        assert summary["server_metrics"]["requests"] == 10 and summary["jit_compiles"] == []
        assert summary["median_ttft_ms"] <= summary["median_e2el_ms"]
        # a CPU server: no GPU energy, said so, and nothing else changes
        assert summary["energy"] == {"valid": False, "note": "no GPU energy (gpu_vendor none)"}
    assert len(read_records(run_dir / "warmup.jsonl")) == 1
    assert "--enforce-eager" in (run_dir / "server.log").read_text()
    assert "HF_TOKEN='<redacted>'" in (run_dir / "server.log").read_text().splitlines()[0]
    leaked = [p for p in (tmp_path / "results").rglob("*") if p.is_file() and CANARY in p.read_text(errors="replace")]
    assert not leaked, leaked
    assert server_pids(model_dir) == [] and port_is_free("127.0.0.1", port)

    # the second run was served by the first run's server: one launch, one log
    longer = tmp_path / "results" / "it" / "v1-longer"
    assert json.loads((longer / "provenance.json").read_text())["server_log"] == "v1/server.log"
    assert not (longer / "server.log").exists()
    assert sum(line.startswith("$ ") for line in (run_dir / "server.log").read_text().splitlines()) == 1
    assert [r.completion_tokens for r in read_records(longer / "r1" / "requests.jsonl")] == [80] * 4

    # `vllm serve --api-server-count 2`: two API-server processes answer, and the server's
    # /metrics (merged over both) counts what the client counted
    two = tmp_path / "results" / "it" / "two-api-servers"
    log = (two / "server.log").read_text()
    assert "--api-server-count 2" in log and "ApiServer_1" in log
    assert [r.completion_tokens for r in read_records(two / "r1" / "requests.jsonl")] == [12] * 6
    summary = json.loads((two / "r1" / "summary.json").read_text())
    assert summary["server_metrics"]["generation_tokens"] == 72 and summary["server_metrics"]["requests"] == 6
    assert server_pids(model_dir) == []

    # resume: nothing left to do, so no server starts
    log_size = (run_dir / "server.log").stat().st_size
    again = run_suite(suite, tmp_path / "results", resume=True)
    assert [o.note for o in again] == ["kept (resume)"] * 4
    assert (run_dir / "server.log").stat().st_size == log_size


def test_server_killed_mid_run_then_bad_argument(tmp_path, model_dir, monkeypatch):
    """Run A loses its server during repeat 2: r1 is kept, r2 and r3 fail. Run B fails at
    start-up with a bad flag and a clear error. The suite goes on through both."""
    path = suite_file(tmp_path, model_dir, [
        {"name": "a", "benchmark": {"repeats": 3, "num_prompts": 24, "max_concurrency": 2,
                                    "dataset": {"kind": "random", "input_len": 32, "output_len": 48}}},
        {"name": "b", "serve": {"extra_args": ["--no-such-flag"]}},
    ])
    results = tmp_path / "results"

    # The server dies when r2's first record reaches the sink, inside the runner's own call:
    # the kill cannot miss the repeat however loaded the machine is (a watcher thread polling
    # for r2's file once landed in r3 on CI, after r2's 24 requests had all been answered).
    real_measure = execute.measure_repeat

    def measure_killing_at_r2(cfg, requests, offsets, writer, header, *, desc, **kw):
        if desc.endswith(" r2"):
            writer = AfterFirstRecord(writer, lambda: signal_server(model_dir, signal.SIGKILL))
        return real_measure(cfg, requests, offsets, writer, header, desc=desc, **kw)

    monkeypatch.setattr(execute, "measure_repeat", measure_killing_at_r2)
    outcomes = run_suite(load_suite(path), results)
    by = {(o.run, o.repeat): o for o in outcomes}
    assert by[("a", 1)].status == "ok"
    assert by[("a", 2)].status == "failed" and "exited during the repeat" in by[("a", 2)].summary.error
    assert by[("a", 3)].status == "failed" and "not running" in by[("a", 3)].summary.error
    assert by[("b", 1)].status == "failed"
    assert "exited with code" in by[("b", 1)].summary.error and "no-such-flag" in by[("b", 1)].summary.error
    assert json.loads((results / "it" / "a" / "r1" / "summary.json").read_text())["status"] == "ok"
    assert read_records(results / "it" / "a" / "r1" / "requests.jsonl")  # earlier results kept
    r2 = read_records(results / "it" / "a" / "r2" / "requests.jsonl")  # every request of r2 recorded
    assert len(r2) == 24
    assert sum(r.status == "ok" for r in r2) >= 1 and sum(r.status != "ok" for r in r2) >= 20
    assert server_pids(model_dir) == []


def test_sigint_stops_the_server_and_keeps_partial_results(tmp_path, model_dir):
    path = suite_file(tmp_path, model_dir, [{"name": "long"}], num_prompts=400, max_concurrency=2,
                      repeats=1, dataset={"kind": "random", "input_len": 32, "output_len": 64})
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "attnbench.cli", "run", str(path), "--out", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    requests = results / "it" / "long" / "r1" / "requests.jsonl"
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None:
        if requests.exists() and len(requests.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    summary = json.loads((results / "it" / "long" / "r1" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert len(read_records(requests)) >= 3
    assert summary["completed"] >= 3
    assert server_pids(model_dir) == []


def test_crosscheck_runs_both_clients_side_by_side_on_a_real_server(tmp_path, model_dir):
    """`attnbench crosscheck run` starts a suite's server, sends a Poisson load with
    attnbench and `vllm bench serve` at once (each on half of the prompts, from one
    --start-at), swaps the halves for the second run, records each run's witnesses, writes
    the comparison, and stops the server; the archived copy reads the same."""
    from click.testing import CliRunner

    from attnbench.analysis import crosscheck, crosscheck_runs
    from attnbench.cli import main

    path = suite_file(tmp_path, model_dir, [{"name": "xc", "serve": {"max_model_len": 2048}}])  # ShareGPT lengths
    out = tmp_path / "xc"
    result = CliRunner().invoke(main, ["crosscheck", "run", str(path), "--out", str(out), "--prompts", "8",
                                       "--pairs", "1", "--rate", "8", "--load", "poisson", "--side-by-side",
                                       "--lead", "20"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    load = out / "poisson-side"
    for i in (1, 2):
        summary = json.loads((load / "attnbench" / f"r{i}" / "summary.json").read_text())
        bench = json.loads((load / "vllm-bench" / f"r{i}.json").read_text())
        assert summary["completed"] == 4 and bench["completed"] == 4 and summary["request_rate"] == 4.0
        # vllm bench's half on the same server: counted by its /metrics, not held against this load
        assert summary["status"] == "ok" and summary["server_metrics"]["requests"] >= 4
        witness = json.loads((load / "witness" / f"vllm-bench-r{i}.json").read_text())
        assert witness["rc"] == 0 and witness["server"]["requests"] >= 4 and witness["after"]["processes"]
        sent = [json.loads(line) for line in (load / "vllm-bench" / f"r{i}.sent.jsonl").read_text().splitlines()]
        assert sum(1 for row in sent if row["headers"] is not None) >= 4
    # the halves swapped: each client sent every prompt once over the pair
    prompts = {len(r["prompt_len"] * "x") for i in (1, 2)
               for r in map(json.loads, (load / "attnbench" / f"r{i}" / "requests.jsonl").read_text().splitlines())}
    assert len(prompts) >= 2
    rows, _ = crosscheck_runs.campaign_rows(out)
    assert [(r["client"], r["repeat"]) for r in rows] == [("attnbench", 1), ("attnbench", 2),
                                                          ("vllm-bench", 1), ("vllm-bench", 2)]
    assert all(r["wire"] and r["wire"]["traced"] == 4 for r in rows) and all(r["side_by_side"] for r in rows)
    text = (out / "comparison.md").read_text()
    assert "## poisson-side (request rate 4.0 req/s per client; 2 attnbench and 2 vllm bench serve runs, side by side)" \
        in text and "| median over 1 pairs |" in text
    crosscheck_runs.archive(out, tmp_path / "kept")
    assert crosscheck.report(tmp_path / "kept") == crosscheck.report(out)
    assert server_pids(model_dir) == []


def test_a_hung_server_is_found_within_the_idle_timeout_and_by_its_health(tmp_path, model_dir, monkeypatch):
    """The server is stopped (SIGSTOP: it holds its port and its processes, and answers
    nothing) once r1's first request has finished. The load stops `idle_timeout_s` after the
    last byte, with the requests in flight recorded as timed out and r1 degraded, not ok; r2
    is not measured (the server does not answer /health); the stopped server is stopped for
    good and its port is free again."""
    # 10 s of silence: a 2-core CI machine running two CPU servers at once has gone 4 s
    # without a token from a healthy one (its first batch of two), which r1 took for a hang
    path = suite_file(tmp_path, model_dir, [{"name": "h", "benchmark": {
        "repeats": 2, "num_prompts": 8, "max_concurrency": 2, "idle_timeout_s": 10,
        "dataset": {"kind": "random", "input_len": 32, "output_len": 300}}}])
    real_measure = execute.measure_repeat

    stopping = {}

    def measure_stopping_in_r1(cfg, requests, offsets, writer, header, *, desc, **kw):
        if desc.endswith(" r1"):
            writer = stopping["writer"] = AfterFirstRecord(writer, lambda: signal_server(model_dir, signal.SIGSTOP))
        return real_measure(cfg, requests, offsets, writer, header, desc=desc, **kw)

    monkeypatch.setattr(execute, "measure_repeat", measure_stopping_in_r1)
    outcomes = run_suite(load_suite(path), tmp_path / "results")
    found_after = time.monotonic() - stopping["writer"].acted_at
    r1, r2 = outcomes
    assert r1.status == "degraded" and r1.summary.timed_out >= 1 and r1.summary.completed >= 1
    assert "read-idle timeout" in r1.summary.first_error and "idle_timeout_s" in r1.summary.first_error
    assert r2.status == "failed" and "/health" in r2.summary.error
    assert found_after < 10 + 10 + 60  # idle timeout + /health wait + the stop, not 600 s per request
    records = read_records(tmp_path / "results" / "it" / "h" / "r1" / "requests.jsonl")
    assert len(records) == 8 and {r.status for r in records} >= {"ok", "timeout"}
    assert server_pids(model_dir) == []


def test_a_knee_search_probes_one_server_and_resumes(tmp_path, model_dir):
    """A knee run on a real server: the burst, then the rates the search picks from what
    each probe measured (each a repeat after its own warm-up, one server start), the path
    in knee.json and a report section with its figures. --resume keeps every probe of the
    same recipe; a changed SLO measures again, and probes of the longer search go."""
    from attnbench.analysis.report import analyze, write_report
    from attnbench.runner.knee import KneeResult, KneeSettings, Probe, next_rate

    def knee_suite(slo: str) -> Path:
        return suite_file(tmp_path, model_dir, [{"name": "knee", "benchmark": {
            "num_prompts": 6, "slo": {"objectives": [slo]}, "knee": {"max_probes": 4, "probe_s": 1.5}}}])

    impossible = knee_suite("p90 ttft <= 0.001 ms")  # holds at no rate: the search goes down to C/4
    outcomes = run_suite(load_suite(impossible), tmp_path / "results")
    run_dir = tmp_path / "results" / "it" / "knee"
    result = KneeResult.model_validate_json((run_dir / "knee.json").read_text())
    rates = [p.rate for p in result.probes]
    capacity = result.probes[0].request_throughput
    assert [o.status for o in outcomes] == ["ok"] * 4 and capacity > 0
    assert rates == [float("inf"), capacity, capacity / 2, capacity / 4]
    for k, probe in enumerate(result.probes, start=1):  # each rate is the search's answer to the ones before
        settings = KneeSettings(max_probes=4, probe_s=1.5)  # at least 1.5 s of arrivals: more than 6 at C
        assert probe.rate == next_rate(result.probes[:k - 1], settings)
        summary = json.loads((run_dir / f"r{k}" / "summary.json").read_text())
        assert summary["request_rate"] == probe.rate and summary["slo"]["attainment"] == probe.attainment == 0.0
        assert summary["num_prompts"] == probe.requests == settings.requests_at(probe.rate, 6)
        assert Probe.of(execute.RepeatSummary.model_validate(summary), settings.keep_up) == probe
    assert not result.converged and result.knee_rate is None
    assert result.verdict == f"the SLO held at no rate down to {capacity / 4:.3g} req/s in 4 probes: the knee is lower"
    assert (run_dir / "warmup.jsonl").exists()
    log = (run_dir / "server.log").read_text()
    assert sum(line.startswith("$ ") for line in log.splitlines()) == 1  # one server start

    analysis = analyze([tmp_path / "results"], tmp_path / "figures")
    assert analysis.agg is None and list(analysis.knees["run"]) == ["knee"]
    assert [p.name for p in analysis.knee_figures["it"] if p.suffix == ".png"] == ["it-knee.png", "it-knee-backends.png"]
    report = write_report(analysis, tmp_path / "report.md").read_text()
    assert "## it: the SLO knee" in report and "- SLO: p90 ttft <= 0.001 ms, met by 90% of requests" in report
    assert f"- `knee`: {result.verdict}." in report

    from attnbench.runner.store import ResultsStore
    from attnbench.runner.tasks import run_state

    store = ResultsStore(tmp_path / "results", "it")
    assert run_state(store, "knee", 3) == "done"  # every probe of knee.json, whatever `repeats` says
    (run_dir / "knee.json").rename(run_dir / "knee.json.bak")
    assert run_state(store, "knee", 3) == "partial"  # probes, but the search did not end
    (run_dir / "knee.json.bak").rename(run_dir / "knee.json")

    again = run_suite(load_suite(impossible), tmp_path / "results", resume=True)
    assert [o.note for o in again] == ["kept (resume)"] * 4
    assert (run_dir / "server.log").read_text() == log  # nothing measured, no server started

    lax = knee_suite("p90 ttft <= 600000 ms")  # holds even at the burst: one probe, measured anew
    third = run_suite(load_suite(lax), tmp_path / "results", resume=True)
    assert [(o.repeat, o.status, o.note) for o in third] == [(1, "ok", "")]
    result = KneeResult.model_validate_json((run_dir / "knee.json").read_text())
    assert len(result.probes) == 1 and result.converged and result.verdict.startswith("the SLO holds even at a burst")
    assert sorted(p.name for p in run_dir.glob("r[0-9]*")) == ["r1"]  # the longer search's probes are gone
    assert server_pids(model_dir) == []


def test_shared_prefix_multiturn_and_trace_loads_on_a_server_with_prefix_caching(tmp_path, model_dir):
    """Three workloads on one real server with prefix caching on: prompts sharing prefixes
    hit the cache (vLLM's own counters), conversations send their history turn by turn (TTFT
    by turn, history from the cache), a trace is sent on its own clock; each summary and the
    provenance say how the load was timed, and the report gives the hit rate and turns."""
    from attnbench.analysis.report import analyze, write_report

    sharegpt = tmp_path / "conversations.json"
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    rng = __import__("random").Random(0)
    sharegpt.write_text(json.dumps([{"conversations": [
        {"from": "human" if k % 2 == 0 else "gpt", "value": " ".join(rng.choice(words) for _ in range(120))}
        for k in range(6)]} for _ in range(6)]))
    trace = tmp_path / "trace.jsonl"
    stamps = [0, 200, 400, 1200, 1300, 2500]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 300, "output_length": 6,
                                         "hash_ids": [0, 1 + i % 2]}) + "\n" for i, t in enumerate(stamps)))
    suite = suite_file(tmp_path, model_dir, [
        {"name": "prefix", "benchmark": {"dataset": {"kind": "shared_prefix", "num_prefixes": 2, "prefix_len": 128,
                                                      "input_len": 16, "output_len": 8}, "num_prompts": 12,
                                         "repeats": 2}},
        {"name": "chat", "benchmark": {"dataset": {"kind": "multiturn", "path": str(sharegpt), "conversations": 2,
                                                    "max_turns": 3, "output_len": 8, "think_time_s": 0.1},
                                        "num_prompts": 3}},
        {"name": "trace", "benchmark": {"dataset": {"kind": "trace", "path": str(trace), "block_size": 128},
                                         "num_prompts": 6}},
    ], repeats=1)
    data = yaml.safe_load(suite.read_text())
    data["defaults"]["serve"]["enable_prefix_caching"] = True
    suite.write_text(yaml.safe_dump(data, sort_keys=False))
    outcomes = run_suite(load_suite(suite), tmp_path / "results")
    assert [(o.run, o.status) for o in outcomes] == [("prefix", "ok"), ("prefix", "ok"), ("chat", "ok"),
                                                     ("trace", "ok")]
    summaries = {o.run: o.summary for o in outcomes}  # the last repeat of each
    # 12 prompts over 2 prefixes of 128 tokens (one block of vLLM's CPU cache): all but 2 find theirs cached;
    # the second repeat, sent after the cache was emptied, finds the same share, not its own first repeat
    first, second = outcomes[0].summary, outcomes[1].summary
    assert 0.5 < first.prefix_cache_hit_rate < 0.85 and first.prefix_cache_reset and second.prefix_cache_reset
    assert abs(second.prefix_cache_hit_rate - first.prefix_cache_hit_rate) < 0.05
    assert summaries["prefix"].load_timing == "schedule: all 12 requests at once"
    chat = summaries["chat"]
    assert chat.completed == 9 and set(chat.ttft_by_turn) == {"1", "2", "3"}
    assert chat.prefix_cache_hit_rate > 0.2  # turns 2 and 3 find their history's full blocks cached
    assert chat.load_timing.startswith("closed loop: 3 conversations (9 turns), 2 at a time")
    records = read_records(tmp_path / "results" / "it" / "chat" / "r1" / "requests.jsonl")
    for r in records:
        if r.turn > 1:
            before = next(x for x in records if x.conversation == r.conversation and x.turn == r.turn - 1)
            assert r.sent_s >= before.end_s + 0.1 - 1e-3 and r.prompt_tokens > before.prompt_tokens + 8
    trace_summary = summaries["trace"]
    assert trace_summary.load_timing == f"trace: the timestamps of {trace}, 1x as fast"
    sent = sorted(r.sent_s for r in read_records(tmp_path / "results" / "it" / "trace" / "r1" / "requests.jsonl"))
    # each request leaves at its timestamp, give or take the event loop's delay on a loaded
    # machine (on the 2-core CI machine beside a CPU server the one at 0.2 s left at 0.25)
    offsets = [s - sent[0] for s in sent]
    assert all(abs(o - t) < 0.15 for o, t in zip(offsets, [0.0, 0.2, 0.4, 1.2, 1.3, 2.5])), offsets
    assert trace_summary.prefix_cache_hit_rate > 0.3  # the shared blocks (vLLM's CPU blocks: 128 tokens)
    prov = json.loads((tmp_path / "results" / "it" / "trace" / "provenance.json").read_text())
    assert prov["load_timing"] == trace_summary.load_timing

    report = write_report(analyze([tmp_path / "results"], tmp_path / "figures"), tmp_path / "report.md").read_text()
    assert "prefix hit %" in report and "Median TTFT (ms) by turn" in report and "| turn 3 " in report
    drawn = (tmp_path / "figures" / "it-prefix-serving.csv").read_text().splitlines()
    assert "prefix_cache_hit_pct" in drawn[0].split(",")  # the serving figure's hit-rate panel
    assert f"- `chat`: {chat.load_timing}." in report
    assert server_pids(model_dir) == []
