"""`attnbench crosscheck`: the comparison of the two clients read off campaign folders as
`runner.crosscheck` writes them (attnbench's summaries and records, vllm bench serve's
detailed results and traced sends, each run's witnesses), its archived form, and the
statistics behind the verdicts."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from attnbench.analysis import agreement, crosscheck_runs
from attnbench.analysis import crosscheck as compare
from attnbench.cli import main
from attnbench.runner.host import HostProbe, process_tree_cpu
from attnbench.runner.witness import Snapshot, between
from test_witnesses import METRICS_AFTER, METRICS_BEFORE

SERVER = between(Snapshot.parse(METRICS_BEFORE), Snapshot.parse(METRICS_AFTER))  # 600 ms mean TTFT


def _campaign(root, load="burst", side=False):
    """A load as `crosscheck run` leaves it: attnbench, attnbench-p1 and vllm bench serve,
    two runs each, every run's witness reading the same /metrics pages (600 ms mean TTFT);
    attnbench's records 3 + 2 chunks with the second request answered first, vllm bench's
    2 + 3 chunks in order."""
    folder = root / load
    (folder / "witness").mkdir(parents=True)
    (root / "campaign.json").write_text(json.dumps({"side_by_side": side}))
    for client, i, ttft in (("attnbench", 1, 640.0), ("attnbench", 2, 660.0),
                            ("attnbench-p1", 1, 780.0), ("attnbench-p1", 2, 800.0)):
        run = folder / client / f"r{i}"
        run.mkdir(parents=True)
        run.joinpath("summary.json").write_text(json.dumps({
            "request_rate": "inf", "output_throughput": 1000.0, "median_ttft_ms": ttft, "mean_ttft_ms": ttft,
            "median_itl_ms": 20.0, "mean_itl_ms": 20.0, "mean_tpot_ms": 20.0}))
        records = "".join(json.dumps({"index": j, "phase": "measure", "sent_s": 0.0, "chunk_s": c}) + "\n"
                          for j, c in enumerate(([0.1, 0.2, 0.3], [0.05, 0.2])))
        run.joinpath("requests.jsonl").write_text(records)
    bench = folder / "vllm-bench"
    bench.mkdir()
    for i, ttft in ((1, 800.0), (2, 820.0)):
        bench.joinpath(f"r{i}.json").write_text(json.dumps({
            "output_throughput": 1010.0, "median_ttft_ms": ttft, "mean_ttft_ms": ttft, "median_itl_ms": 20.2,
            "mean_itl_ms": 20.2, "mean_tpot_ms": 20.2, "ttfts": [0.8, 0.8], "itls": [[0.02], [0.02, 0.02]],
            "start_times": [10.0, 10.1]}))
    for client in ("attnbench", "attnbench-p1", "vllm-bench"):
        for i in (1, 2):
            (folder / "witness" / f"{client}-r{i}.json").write_text(json.dumps({"server": SERVER}))
    return folder


def report(*roots) -> str:
    return "\n".join(compare.report(*roots))


def test_the_verdict_sets_each_client_beside_the_server(tmp_path):
    """The criteria (medians within 5%, spread) for each attnbench beside vllm bench, and the
    third witness: each client's mean TTFT minus the server's own (600 ms for every run)."""
    _campaign(tmp_path)
    text = report(tmp_path)
    assert "| output_throughput | 1,000.0 | 1,010.0 | -1.0% | 0.0% | 0.0% | pass" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% |" in text and "FAIL (|diff| 19.8% <= 5" in text
    # 650 and 810 ms over the server's 600; these pages have no ITL histogram: "-"
    assert "| attnbench | 600.0 | 0.0% | 50.0 | - |" in text and "| vllm-bench | 600.0 | 0.0% | 210.0 | - |" in text
    assert "| median_ttft_ms | 790.0 | 810.0 | -2.5% |" in text and "| attnbench-p1 | 600.0 | 0.0% | 190.0 | - |" in text
    # 3 + 2 chunks; first tokens against request order: reversed (-1) and in order (1)
    assert "| attnbench | r2 | 1,000 | 660.0 | 20.00 | 600.0 | - | 5 | -1.00 |" in text
    assert "| vllm-bench | r2 | 1,010 | 820.0 | 20.20 | 600.0 | - | 5 | 1.00 |" in text


def test_campaigns_on_several_hosts_are_read_apart_then_pooled(tmp_path):
    """Two campaigns: each load under its campaign's name, then the rate both ran at pooled,
    with each load's own difference of the medians per criterion."""
    for host in ("host-a", "host-b"):
        _campaign(tmp_path / host)
    text = report(tmp_path / "host-a", tmp_path / "host-b")
    assert "## host-a/burst (request rate inf req/s; 2 attnbench" in text and "## host-b/burst (" in text
    assert "pooled (host-a/burst/, host-b/burst/: 4 attnbench and 4 vllm bench serve runs)" in text
    assert "| host-a/burst | 2 | -1.0% | -19.8% | -1.0% | -1.0% |" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% |" in text.split("pooled")[-1]


def test_an_archived_campaign_keeps_the_verdict_in_one_file(tmp_path):
    """`archive` keeps one row per client run (crosscheck.json) and campaign.json: no
    records, no witnesses, the same report; the CLI does the same."""
    _campaign(tmp_path / "full")
    crosscheck_runs.archive(tmp_path / "full", tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["campaign.json", "crosscheck.json"]
    assert report(tmp_path / "kept") == report(tmp_path / "full")
    result = CliRunner().invoke(main, ["crosscheck", "archive", str(tmp_path / "full"), str(tmp_path / "cli")])
    assert result.exit_code == 0 and report(tmp_path / "cli") == report(tmp_path / "full")
    result = CliRunner().invoke(main, ["crosscheck", "compare", str(tmp_path / "cli"), "--out", str(tmp_path / "c.md")])
    assert result.exit_code == 0 and (tmp_path / "c.md").read_text() == report(tmp_path / "full") + "\n"


def test_a_folder_without_a_campaign_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["crosscheck", "compare", str(tmp_path)])
    assert result.exit_code == 2 and "no client runs found" in result.output and "Traceback" not in result.output


def test_side_by_side_runs_are_compared_within_each_run_and_pair(tmp_path):
    """Side by side: besides the criteria over runs, each criterion's difference within each
    run, and the criteria over pairs of runs (a client's value for a pair: the mean of its
    two runs). r1 and r2 make one pair: attnbench 640 and 660 ms, vllm bench 800 and 820."""
    _campaign(tmp_path, "poisson-side", side=True)
    text = report(tmp_path)
    assert "## poisson-side (request rate inf req/s per client; 2 attnbench and 2 vllm bench serve runs, side by side)" in text
    assert "| r1 | -1.0 | -20.0 | -1.0 | -1.0 | - |" in text and "| r2 | -1.0 | -19.5 | -1.0 | -1.0 | - |" in text
    assert "| median over 1 pairs | -1.0 | -19.8 | -1.0 | -1.0 | - |" in text
    assert "| median_ttft_ms | 650.0 | 810.0 | -19.8% | 0.0% | 0.0% | FAIL" in text.split("criteria over the pairs")[1]


def test_ttft_is_also_counted_from_each_requests_write(tmp_path):
    """attnbench records when each request was written (``written_s``: 0.2 ms after its
    clock; TTFTs 100 and 50 ms); vllm bench's traced sends say its first request was written
    300 ms after its clock, its second 250 ms (TTFTs 800 ms each). Each client's TTFT from
    the write, and the criterion judged on those; rows that match no request are left out."""
    load = _campaign(tmp_path)
    for i in (1, 2):
        records = "".join(json.dumps({"index": j, "phase": "measure", "sent_s": 1.0 + j, "written_s": 1.0002 + j,
                                      "chunk_s": c}) + "\n" for j, c in enumerate(([1.1, 1.2, 1.3], [2.05, 2.2])))
        (load / "attnbench" / f"r{i}" / "requests.jsonl").write_text(records)
        sent = [{"id": "bench-ab12-0", "start": 10.0005, "new_conn": True, "headers": 10.3, "response": 10.32},
                {"id": "bench-ab12-1", "start": 10.1, "new_conn": True, "headers": 10.35, "response": 10.36},
                {"id": "bench-ab12-7", "start": 10.2, "new_conn": True, "headers": 10.4, "response": 10.5},
                {"id": None, "start": 9.0, "new_conn": True, "headers": 9.1, "response": 9.2}]
        (load / "vllm-bench" / f"r{i}.sent.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sent))
    text = report(tmp_path)
    assert "| attnbench | r1 | 2 | 0% | 0.2 | 0.2 | - | 75.0 | 74.8 | 74.8 |" in text
    assert "| vllm-bench | r2 | 2 | 100% | 275.0 | 300.0 | 15.0 | 800.0 | 525.0 | 525.0 |" in text
    assert "| attnbench-p1 | r1 |" not in text.split("Where each client's TTFT clock starts")[1]
    assert "| attnbench | 74.8 | -85.8% | 0.0% | 0.0% | FAIL (|diff| 85.8% <= 5; spread 0.0 <= 2.0) |" in text


def test_the_host_witness_ranks_the_servers_ttft_against_the_hosts_speed(tmp_path):
    """"What moved the server": over a load's runs, Spearman's rho of the server's mean TTFT
    with its processes' CPU seconds, each client's CPU time per chunk, the host's stolen
    seconds and the probe's time, all from the witness files' snapshots. attnbench's CPU per
    chunk rises with the server's TTFT, vllm bench's falls; the probe's samples outside a
    run are not its own; a client with under 5 runs gets no row."""
    load = tmp_path / "poisson"
    (load / "witness").mkdir(parents=True)
    probe = [{"t": 1000.0 * i + 1, "ms": 2.0 + i} for i in range(1, 6)] + [{"t": 1000.0 * i + 500, "ms": 99.0}
                                                                         for i in range(1, 6)]
    (tmp_path / "host-probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in probe))
    rows = []
    for client, n, sign in (("attnbench", 5, 1), ("vllm-bench", 5, -1), ("attnbench-p1", 3, 1)):
        for i in range(1, n + 1):
            witness = {"client_cpu_s": 10.0 + sign * i, "wall_s": 30.0,
                       "before": {"time": 1000.0 * i, "host": {"steal_s": 100.0, "cpu_stall_s": 7.0},
                                  "processes": {"42": {"comm": "VLLM::EngineCor", "cpu_s": 10.0}}},
                       "after": {"time": 1000.0 * i + 10, "host": {"steal_s": 100.0 + i},
                                 "processes": {"42": {"comm": "VLLM::EngineCor", "cpu_s": 30.0 + i}}}}
            rows.append((client, {"repeat": i, "chunks": 900 if i == 5 else 1000,
                                  "server": {"mean_ttft_ms": 40.0 + 5 * i},
                                  "cpu": crosscheck_runs.cpu_record(witness, crosscheck_runs._probe_samples(tmp_path))}))
    clients = [(c, [r for name, r in rows if name == c]) for c in ("attnbench", "vllm-bench", "attnbench-p1")]
    assert clients[0][1][2]["cpu"] == {"client": 13.0, "client_wall": 30.0, "steal_s": 3.0, "probe_ms": 5.0,
                                       "VLLM::EngineCor": 23.0}  # no stall after: no stall
    text = "\n".join(compare._host_witness(clients))
    # every run saw 1,000 chunks but each client's r5 900: with the ties the chunks rank at -0.64
    assert "| the server's processes' CPU s | 1.00 | -0.64 | 13 |" in text
    assert "| attnbench's CPU us per chunk | 1.00 | - | 5 |" in text
    assert "| vllm-bench's CPU us per chunk | -1.00 | - | 5 |" in text
    assert "| host steal s | 1.00 | -0.64 | 13 |" in text and "attnbench-p1" not in text and "stall" not in text
    assert "| host probe ms (median in the run) | 1.00 | -0.64 | 13 |" in text
    assert compare._host_witness([clients[2]]) == []  # 3 runs: nothing to rank
    assert agreement.spearman([1, 2, 2, 3], [5, 7, 7, 9]) == 1.0 and crosscheck_runs.first_token_order([0.5, 0.5]) is None


def test_process_tree_cpu_and_the_host_probe_read_this_machine(tmp_path):
    """`process_tree_cpu` finds this process and a child it started; `HostProbe` samples the
    host's speed while it is held."""
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        tree = process_tree_cpu(os.getpid())
        assert str(os.getpid()) in tree and str(child.pid) in tree
        assert all({"comm", "cpu_s"} <= set(p) for p in tree.values())
    finally:
        child.kill()
        child.wait()
    with HostProbe(tmp_path / "probe.jsonl"):
        time.sleep(0.8)
    samples = [json.loads(line) for line in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert len(samples) >= 2 and all(s["ms"] > 0 for s in samples)


def test_permutation_p_tells_a_client_difference_from_run_noise():
    """5 + 5 runs, every split enumerated: fully separated groups have medians 3 and 8, and
    only the 12 of the 252 splits that put 1-3 on one side and 8-10 on the other are as far
    apart; interleaved ones are typical. Too many splits are sampled, with a fixed seed."""
    p = agreement.permutation_p
    assert p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(12 / 252)
    assert p([1, 3, 5, 7, 9], [2, 4, 6, 8, 10]) > 0.5
    assert p([1.0], [2.0, 3.0]) is None
    many = p([float(i) for i in range(18)], [i + 17.5 for i in range(18)], draws=2000)
    assert many == p([float(i) for i in range(18)], [i + 17.5 for i in range(18)], draws=2000) and many < 0.01


def test_pooled_burst_takes_the_servers_merging_out():
    """Each criterion fitted over the chunk count the client saw: every run's TPOT is 100 ms
    - 2 ms per 1,000 chunks, +1 ms for attnbench and -1 ms for vllm bench, so the fit gives a
    slope of -2 and +2 ms net of the chunks with nothing left over."""
    def run(chunks, offset):
        return {"chunks": chunks, "mean_tpot_ms": 100 - 2 * chunks / 1000 + offset,
                "median_itl_ms": 30.0 + offset, "median_ttft_ms": 2000.0, "output_throughput": 6000.0}

    ours = [run(c, +1) for c in (95_000, 99_000, 104_000)]
    theirs = [run(c, -1) for c in (96_000, 98_000, 103_000)]
    text = "\n".join(compare._pooled("inf", [("burst", ours[:2], theirs[:2]), ("burst-2", ours[2:], theirs[2:])]))
    assert "pooled (burst/, burst-2/: 3 attnbench and 3 vllm bench serve runs)" in text
    assert "| mean_tpot_ms | -2.00 | " in text and "| +2.00 | -2.1% | 0.00 |" in text
    assert "| median_itl_ms | +0.00 | " in text  # a constant offset, no slope
    assert compare._net_of_merging([run(95_000, 1)] * 2, [run(95_000, -1)] * 2) == []


def test_self_agreement_deals_one_clients_runs_into_halves():
    """Steady runs always pass against themselves; one outlier among six passes in half the
    deals; bimodal runs never; fewer than 6 runs give no verdict."""
    assert agreement.self_agreement([100.0, 101.0] * 3) == 1.0
    assert agreement.self_agreement([10.0] * 5 + [30.0]) == 0.5
    assert agreement.self_agreement([20.0, 40.0] * 3) == 0.0
    assert agreement.self_agreement([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    runs = [{"median_itl_ms": v, "output_throughput": 6000.0} for v in [10.0] * 5 + [30.0]]
    text = "\n".join(compare._self_agreement_table([("attnbench", runs), ("vllm-bench", runs[:5])]))
    assert "| metric | attnbench vs attnbench |" in text and "vllm-bench vs" not in text
    assert "| median_itl_ms | 0.50 |" in text and "| median_ttft_ms | - |" in text


def test_net_of_server_takes_the_hosts_drift_out_of_both_clients():
    """Each latency criterion fitted over the server's own value in the same run: the raw
    medians differ by far more than the 2 ms the fit finds at equal server timing."""
    def run(server_ttft, offset):
        return {"median_ttft_ms": server_ttft + offset, "mean_tpot_ms": server_ttft / 5 + 0.5,
                "server": {"mean_ttft_ms": server_ttft, "mean_itl_ms": server_ttft / 5}}

    ours = [run(t, 8.0) for t in (40.0, 42.0, 45.0)]
    theirs = [run(t, 10.0) for t in (50.0, 60.0, 70.0)]
    text = "\n".join(compare._net_of_server(ours, theirs))
    assert "| median_ttft_ms | +1.00 | +1.00 | -2.00 | -2.9% | 0.00 |" in text
    assert "| mean_tpot_ms | +1.00 | +1.00 | +0.00 | +0.0% | 0.00 |" in text and "median_itl_ms" not in text
    assert compare._net_of_server(ours[:1], theirs) == []
