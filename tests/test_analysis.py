"""Analysis: results trees and microbenchmark CSVs made with the project's own writers, the
numbers each figure plots, the files it writes, and clear errors on bad input."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.analysis import fig9, figures, plotting
from attnbench.analysis.collect import CollectError, collect_results, collect_vllm_bench, load_microbench
from attnbench.analysis.normalize import aggregate, normalize
from attnbench.analysis.report import analyze, format_value, noise_lines, write_report
from attnbench.kernels.schema import MICROBENCH_FIELDS
from attnbench.runner.loadgen import RequestRecord
from attnbench.runner.recipe import Recipe
from attnbench.runner.store import ResultsStore
from attnbench.runner.summary import RepeatHeader, summarize_repeat


def make_records(ttfts_ms, itl_ms, tokens=4, prompt=10):
    recs = []
    for i, ttft in enumerate(ttfts_ms):
        first = 0.01 * i + ttft / 1e3
        chunks = [first + k * itl_ms / 1e3 for k in range(tokens)]
        recs.append(RequestRecord(i, "measure", prompt, tokens, 0.0, dispatch_s=0.0, sent_s=0.01 * i,
                                  chunk_s=chunks, chunk_tokens=[1] * tokens, end_s=chunks[-1],
                                  prompt_tokens=prompt, completion_tokens=tokens))
    return recs


def write_run(store: ResultsStore, suite: str, run: str, repeats: list[list[RequestRecord]], *,
              backend="TRITON_ATTN", gpu="NVIDIA H100 80GB HBM3", output_len=None, weights="dummy (random)",
              model="/m/llama8b", engine="v1", env=None):
    dataset = ({"kind": "random", "input_len": 10, "output_len": output_len} if output_len
               else {"kind": "synthetic"})
    recipe = Recipe.model_validate({"name": run, "model": {"path": model},
                                    "serve": {"engine": engine, "attention_backend": backend, "env": env or {}},
                                    "benchmark": {"dataset": dataset}}).model_dump(mode="json")
    prov = {"gpus": [{"name": gpu}], "vendor": "nvidia", "model": model, "model_weights": weights,
            "vllm_server_version": "0.26.0", "collected_at": "2026-11-22T00:00:00+00:00"}
    store.write_run_meta(run, recipe, prov)
    for k, records in enumerate(repeats, start=1):
        with store.requests_writer(run, k) as w:
            for r in records:
                w(r)
        store.write_summary(run, k, summarize_repeat(records, RepeatHeader(suite=suite, run=run, repeat=k),
                                                     digest=w.digest()))


@pytest.fixture
def tree(tmp_path):
    store = ResultsStore(tmp_path / "results", "talk")
    write_run(store, "talk", "flex", [make_records([100, 120, 140], 10), make_records([110, 130, 150], 12),
                                      make_records([90, 100, 200], 11)], backend="FLEX_ATTENTION")
    write_run(store, "talk", "triton", [make_records([50, 60, 70], 5), make_records([55, 65, 75], 6),
                                        make_records([45, 60, 80], 5)])
    return tmp_path / "results"


def test_collect_one_row_per_repeat(tree):
    data = collect_results(tree)
    assert len(data.runs) == 6 and set(data.runs["run"]) == {"flex", "triton"}
    row = data.runs.iloc[0]
    assert row["gpu"] == "NVIDIA H100 80GB HBM3" and row["attention_backend"] == "FLEX_ATTENTION"
    assert row["vllm_version"] == "0.26.0" and row["status"] == "ok"


def test_a_tree_without_its_request_records_aggregates_the_same(tree):
    """Committed trees keep summaries only: the figures' numbers come from them alone."""
    before = aggregate(collect_results(tree))
    for records in tree.rglob("requests.jsonl"):
        records.unlink()
    pd.testing.assert_frame_equal(aggregate(collect_results(tree)), before)


def test_a_cut_request_file_is_not_shown_as_a_measurement(tree):
    """A requests.jsonl shorter than its summary counted (a torn copy) makes its repeat
    'damaged': left out of the means, and the report names it."""
    path = tree / "talk" / "triton" / "r2" / "requests.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    data = collect_results(tree)
    row = data.runs[(data.runs["run"] == "triton") & (data.runs["repeat"] == 2)].iloc[0]
    assert row["status"] == "damaged" and "2 records, but its summary counted 3" in row["error"]
    agg = aggregate(data).set_index("run")
    assert agg.loc["triton", "repeats"] == 2 and agg.loc["triton", "left_out"] == "r2 damaged"


def test_a_repeat_stopped_before_its_summary_is_named_not_counted(tree, tmp_path):
    """A repeat folder with records but no summary (a crash, Ctrl-C, a lease that ended in
    it) is 'unfinished': out of the means, and the report says so and how to finish it."""
    (tree / "talk" / "triton" / "r3" / "summary.json").unlink()
    data = collect_results(tree)
    row = data.runs[(data.runs["run"] == "triton") & (data.runs["repeat"] == 3)].iloc[0]
    assert row["status"] == "unfinished" and row["suite"] == "talk" and row["attention_backend"] == "TRITON_ATTN"
    agg = aggregate(data).set_index("run")
    assert agg.loc["triton", "repeats"] == 2 and agg.loc["triton", "left_out"] == "r3 unfinished"
    report = write_report(analyze([tree], tmp_path / "figs"), tmp_path / "report.md").read_text()
    assert ("- **warning**: `triton`: left out of its means: r3 unfinished (`attnbench run --resume` measures "
            "them again).") in report
    for summary in (tree / "talk" / "triton").glob("r*/summary.json"):  # a run none of whose repeats finished
        summary.unlink()
    report = write_report(analyze([tree], tmp_path / "figs"), tmp_path / "report.md").read_text()
    assert ("- **warning**: `triton`: no repeat counted (r1 unfinished, r2 unfinished, r3 unfinished); it is in "
            "no table or figure (`attnbench run --resume` measures it again).") in report


def test_aggregate_follows_the_talks_convention(tree):
    data = collect_results(tree)
    agg = aggregate(data).set_index("run")
    runs = data.runs[data.runs["run"] == "triton"]
    assert agg.loc["triton", "total_token_throughput"] == pytest.approx(runs["total_token_throughput"].mean())
    assert agg.loc["triton", "total_token_throughput_lo"] == pytest.approx(runs["total_token_throughput"].min())
    assert agg.loc["triton", "total_token_throughput_hi"] == pytest.approx(runs["total_token_throughput"].max())
    # TTFT: mean of the per-repeat medians (60, 65, 60); error bars: the mean of each
    # repeat's p20 and p80 over its requests
    assert agg.loc["triton", "ttft"] == pytest.approx((60 + 65 + 60) / 3, rel=1e-6)
    repeats = [[50, 60, 70], [55, 65, 75], [45, 60, 80]]
    assert agg.loc["triton", "ttft_lo"] == pytest.approx(np.mean([np.percentile(r, 20) for r in repeats]), rel=1e-6)
    assert agg.loc["triton", "ttft_hi"] == pytest.approx(np.mean([np.percentile(r, 80) for r in repeats]), rel=1e-6)
    assert agg.loc["triton", "itl"] == pytest.approx((5 + 6 + 5) / 3, rel=1e-6)


def test_normalize_to_baseline(tree):
    agg = aggregate(collect_results(tree))
    norm = normalize(agg, "flex").set_index("run")
    assert norm.loc["flex", "ttft"] == pytest.approx(1.0)
    raw = agg.set_index("run")
    assert norm.loc["triton", "ttft"] == pytest.approx(raw.loc["triton", "ttft"] / raw.loc["flex", "ttft"])
    assert norm.loc["triton", "ttft_hi"] == pytest.approx(raw.loc["triton", "ttft_hi"] / raw.loc["flex", "ttft"])
    with pytest.raises(CollectError, match="baseline run 'fa3' not found; runs are \\['flex', 'triton'\\]"):
        normalize(agg, "fa3")


@pytest.fixture
def captured(monkeypatch):
    """Figures drawn, with the matplotlib figure and the data they saved."""
    drawn = {}
    original = figures.save_figure

    def save(fig, data, out_dir, name):
        drawn[name] = (fig, data.copy())
        return original(fig, data, out_dir, name)

    monkeypatch.setattr(figures, "save_figure", save)
    monkeypatch.setattr(fig9, "save_figure", save)
    return drawn


def test_normalized_bars_plot_the_normalized_means_and_p20_p80(tree, tmp_path, captured):
    analysis = analyze([tree], tmp_path / "figs")
    fig, data = captured["talk-normalized"]
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    agg = aggregate(collect_results(tree))
    norm = normalize(agg, "flex").set_index("run")
    expect = [norm.loc["flex", m] for m in ("total_token_throughput", "ttft", "itl")] + \
             [norm.loc["triton", m] for m in ("total_token_throughput", "ttft", "itl")]
    assert heights == pytest.approx(expect)
    # error bar ends (the vertical line segments) sit at p20/p80 (latency), min/max (throughput)
    segments = [c for c in ax.collections if hasattr(c, "get_segments")]
    ends = sorted(round(y, 6) for c in segments for seg in c.get_segments() for (_, y) in seg)
    for m in ("ttft_lo", "ttft_hi", "total_token_throughput_lo", "total_token_throughput_hi"):
        assert round(norm.loc["triton", m], 6) in ends
    for p in analysis.figures:
        assert p.exists() and p.stat().st_size > 0
    saved = pd.read_csv(tmp_path / "figs" / "talk-normalized.csv").set_index("run")
    assert saved.loc["triton", "ttft"] == pytest.approx(norm.loc["triton", "ttft"])


def test_serving_bars_in_their_units(tree, tmp_path, captured):
    analyze([tree], tmp_path / "figs")
    fig, _ = captured["talk-serving"]
    agg = aggregate(collect_results(tree)).set_index("run")
    ttft_heights = [p.get_height() for p in fig.axes[1].patches]
    assert ttft_heights == pytest.approx([agg.loc["flex", "ttft"] / 1e3, agg.loc["triton", "ttft"] / 1e3])
    assert fig.axes[1].get_ylabel() == "TTFT (s)" and fig.axes[2].get_ylabel() == "ITL (ms)"
    note = " ".join(t.get_text() for t in fig.texts)
    assert "NVIDIA H100 80GB HBM3" in note and "dummy weights" in note and "vLLM 0.26.0" in note


def test_latency_vs_output_length(tmp_path, captured):
    store = ResultsStore(tmp_path / "res", "fig9")
    lines = {"triton": ("TRITON_ATTN", None, 5), "flash": ("FLASH_ATTN", None, 4),  # attnbench's steps:
             "steps-qblock": ("CUSTOM", "qblock", 6), "steps-auto": ("CUSTOM", None, 3)}  # one line each
    for run, (backend, variant, itl) in lines.items():
        for out_len in (10, 100, 1000):
            # two repeats, the second 10% slower per token: the error bars span them
            write_run(store, "fig9", f"{run}-{out_len}", [make_records([20], itl, tokens=out_len),
                                                          make_records([20], itl * 1.1, tokens=out_len)],
                      backend=backend, output_len=out_len, env={"ATTNBENCH_VARIANT": variant} if variant else None)
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    fig, data = captured["fig9-latency-vs-output"]
    assert sorted(set(data["output_len"])) == [10, 100, 1000]
    assert set(data["line"]) == {"TRITON_ATTN", "FLASH_ATTN", "CUSTOM (qblock)", "CUSTOM (auto)"}
    qblock = data[data["line"] == "CUSTOM (qblock)"].sort_values("output_len")
    lo = [20 + (n - 1) * 6 for n in (10, 100, 1000)]
    hi = [20 + (n - 1) * 6.6 for n in (10, 100, 1000)]
    assert qblock["e2el_min_ms"].tolist() == pytest.approx(lo) and qblock["e2el_max_ms"].tolist() == pytest.approx(hi)
    assert qblock["e2el_ms"].tolist() == pytest.approx([(a + b) / 2 for a, b in zip(lo, hi)])
    assert fig.axes[0].get_xlabel() == "output length (tokens)"
    assert fig.axes[0].get_xscale() == fig.axes[0].get_yscale() == "log"
    # the second panel: % of FA3 = FA3 latency / latency x 100
    pct = fig9.percent_of_reference(fig9.sweep_table(analysis.agg))
    fa3_1000, qblock_1000 = 20 + 999 * 4.2, 20 + 999 * 6.3
    assert pct.loc["CUSTOM (qblock)", 1000] == pytest.approx(fa3_1000 / qblock_1000 * 100, abs=0.05)
    assert pct.loc["FLASH_ATTN"].tolist() == [100.0, 100.0, 100.0]
    assert list(fig.axes[1].lines[0].get_ydata()) == [100.0, 100.0, 100.0]  # FA3 is drawn first
    report = write_report(analysis, tmp_path / "report.md").read_text()
    assert "% of FA3 performance" in report and "The paper's Fig. 9 claims" in report


def test_fig9_claims_against_the_paper():
    """Known latencies in, the paper's claims with the right verdicts out."""
    fa3 = {100: 1.0, 12800: 100.0}
    factor = {"FLASH_ATTN": (1.0, 1.0), "CUSTOM (naive)": (1.5, 100 / 19.0),  # 19.0% of FA3: agrees
              "CUSTOM (qblock)": (1.2, 100 / 30.0),  # 30%: differs from 49%; 1.58x over naive: differs
              "CUSTOM (parallel_tiled)": (1.1, 100 / 90.0),  # 3.0x over Q-block
              "CUSTOM (static_grid)": (0.99, 100 / 95.0)}  # 95.0-101.0% of FA3; 5.6% over parallel tiled
    rows = [{"line": line, "output_len": n, "e2el_ms": fa3[n] * f[i], "e2el_min_ms": 0, "e2el_max_ms": 0,
             "repeats": 2, "cuda_graphs": "", "jit_compiles": 0}
            for line, f in factor.items() for i, n in enumerate(sorted(fa3))]
    got = fig9.claims(pd.DataFrame(rows)).set_index("claim")
    assert got.loc["naive, % of FA3", "attnbench"] == "19.0%" and got.loc["naive, % of FA3", "verdict"] == "agrees"
    assert got.loc["Q-block, % of FA3", "verdict"] == "differs"
    assert got.loc["Q-block over naive", "attnbench"] == "1.58x"
    assert got.loc["static grid + full CUDA graphs, % of FA3", "attnbench"] == "95.0-101.0%"
    assert got.loc["static grid + full CUDA graphs, % of FA3", "verdict"] == "agrees"
    assert got.loc["parallel tiled over Q-block", "attnbench"] == "3.00x"
    assert got.loc["static grid (full graphs) over parallel tiled", "attnbench"] == "+5.6%"
    assert set(got["verdict"]) <= {"agrees", "differs"}
    assert not any("kernels only" in claim for claim in got.index)  # no full-graph runs of the eager steps

    # the eager steps run with full graphs too: their own lines, and the kernel-only claim
    factor |= {"CUSTOM (qblock, full graphs)": (1.0, 100 / 50.0), "CUSTOM (parallel_tiled, full graphs)": (1.0, 1.0)}
    rows = [{"line": line, "output_len": n, "e2el_ms": fa3[n] * f[i], "e2el_min_ms": 0, "e2el_max_ms": 0,
             "repeats": 2, "cuda_graphs": "", "jit_compiles": 0}
            for line, f in factor.items() for i, n in enumerate(sorted(fa3))]
    got = fig9.claims(pd.DataFrame(rows)).set_index("claim")
    kernels_only = "parallel tiled over Q-block, both with full graphs (kernels only)"
    assert got.loc[kernels_only, "attnbench"] == "2.00x" and got.loc[kernels_only, "verdict"] == "differs"
    assert got.loc["parallel tiled over Q-block", "attnbench"] == "3.00x"  # the eager lines, unchanged


def test_fig9_eager_steps_with_full_graphs_are_lines_of_their_own():
    def line(backend, graphs):
        return fig9._line({"attention_backend": backend, "cuda_graphs": graphs})

    assert line("CUSTOM (qblock)", "PIECEWISE") == "CUSTOM (qblock)"
    assert line("CUSTOM (qblock)", "PIECEWISE+FULL") == "CUSTOM (qblock, full graphs)"
    assert line("CUSTOM (parallel_tiled)", "PIECEWISE+FULL") == "CUSTOM (parallel_tiled, full graphs)"
    assert line("CUSTOM (static_grid)", "PIECEWISE+FULL") == "CUSTOM (static_grid)"  # the paper's condition
    assert line("FLASH_ATTN", "PIECEWISE+FULL") == "FLASH_ATTN"
    assert fig9.LINE_ORDER.index("CUSTOM (qblock, full graphs)") == fig9.LINE_ORDER.index("CUSTOM (qblock)") + 1


def test_vllm_bench_json_plots_beside_ours(tree, tmp_path):
    result = {"date": "20261122-000000", "backend": "vllm", "model_id": "llama8b", "num_prompts": 3,
              "request_throughput": 2.0, "output_throughput": 20.0, "total_token_throughput": 50.0,
              "median_ttft_ms": 80.0, "median_itl_ms": 7.0, "median_tpot_ms": 7.0, "median_e2el_ms": 100.0,
              "ttfts": [0.07, 0.08, 0.09], "itls": [[0.007, 0.007], [0.007]], "input_lens": [10, 10, 10],
              "output_lens": [3, 2, 1]}
    path = tmp_path / "vllm-bench-triton.json"
    path.write_text(json.dumps(result))
    data = collect_vllm_bench(path)
    row = data.runs.iloc[0]
    assert row["run"] == "vllm-bench-triton" and row["p20_ttft_ms"] == pytest.approx(np.percentile([70, 80, 90], 20))
    assert row["p80_itl_ms"] == pytest.approx(7.0)
    analysis = analyze([tree], tmp_path / "figs", vllm_bench=[path])
    assert set(analysis.agg["run"]) == {"flex", "triton", "vllm-bench-triton"}


def micro_csv(path: Path, rows: list[dict]) -> Path:
    """A microbenchmark CSV with the schema's columns, written through the bench's own sink."""
    from attnbench.kernels.bench.microbench import CsvSink

    sink = CsvSink(path)
    sink.write([{k: r.get(k, "") for k in MICROBENCH_FIELDS} for r in rows])
    sink.close()
    return path


def micro_rows():
    rows = []
    for share in (0.0, 1.0):
        for bs in (1, 4, 16):
            for impl, speed in (("vllm_unified", 1.0), ("qblock", 0.5)):
                rows.append({"suite": "s", "case": f"c-{share}-{bs}", "group": "fig6", "implementation": impl,
                             "status": "ok", "num_seqs": bs, "max_seqlen_k": 512, "sum_seq_lens": 512 * bs,
                             "decode_share": share, "median_us": 10.0 * bs * speed, "floor_us": 2.0 * bs,
                             "num_q_heads": 32, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16",
                             "device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6"})
    return rows


def test_microbench_figures_normalized_to_the_leftmost_baseline(tmp_path, captured):
    csv = micro_csv(tmp_path / "mb.csv", micro_rows())
    analysis = analyze([], tmp_path / "figs", microbench=[csv])
    fig, data = captured["microbench-by-decode-share-normalized"]
    d0 = data[(data["panel"] == 0.0) & (data["implementation"] == "qblock")].sort_values("sum_seq_lens")
    assert d0["y"].tolist() == pytest.approx([0.5, 2.0, 8.0])  # 10*bs*0.5 / 10 (baseline at B=1)
    fig, data = captured["microbench-by-decode-share-absolute"]
    floor = [line for line in fig.axes[0].get_lines() if line.get_label() == "roofline floor"][0]
    assert list(floor.get_ydata()) == pytest.approx([2.0, 8.0, 32.0])
    # by batch size for each decode share present (0 %, 100 %), by decode share: x2 (normalized, absolute)
    assert len([p for p in analysis.figures if p.suffix == ".png"]) == 6


def test_microbench_figures_plot_the_better_of_eager_and_graph(tmp_path, captured):
    """A row timed both ways plots its faster median (a short kernel's eager time is the
    host's launch cost); a row timed eagerly only plots that."""
    rows = micro_rows()
    for r in rows:
        if r["implementation"] == "qblock":
            r["graph_median_us"] = r["median_us"] / 4  # graphs replay 4x faster here
        elif r["num_seqs"] == 16:
            r["graph_median_us"] = r["median_us"] * 2  # slower: the eager time stands
    analyze([], tmp_path / "figs", microbench=[micro_csv(tmp_path / "mb.csv", rows)])
    _, data = captured["microbench-by-decode-share-absolute"]
    d0 = data[data["panel"] == 0.0].sort_values(["implementation", "sum_seq_lens"])
    assert d0[d0["implementation"] == "qblock"]["y"].tolist() == pytest.approx([1.25, 5.0, 20.0])
    assert d0[d0["implementation"] == "vllm_unified"]["y"].tolist() == pytest.approx([10.0, 40.0, 160.0])


def test_report_lists_tables_figures_and_conventions(tree, tmp_path):
    csv = micro_csv(tmp_path / "mb.csv", micro_rows())
    analysis = analyze([tree], tree / "figures", microbench=[csv])
    text = write_report(analysis, tree / "report.md").read_text()
    assert "## talk" in text and "Normalized to `flex`" in text and "p20/p80" in text
    assert "![talk-normalized](figures/talk-normalized.png)" in text
    assert "## Microbenchmark: mb" in text


# ------------------------------------------------------------------------------ bad input
def test_missing_empty_and_mixed_up_results(tmp_path, tree):
    with pytest.raises(CollectError, match="no such results directory"):
        collect_results(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CollectError, match="no results found; expected <suite>/<run>/r<k>/summary.json"):
        collect_results(tmp_path / "empty")
    summary = tree / "talk" / "triton" / "r1" / "summary.json"
    data = json.loads(summary.read_text())
    data["run"] = "flex"
    summary.write_text(json.dumps(data))
    with pytest.raises(CollectError, match="mixed-up results directory"):
        collect_results(tree)


def test_unknown_baseline_is_an_error(tree, tmp_path):
    with pytest.raises(CollectError, match="baseline run 'nope' not found"):
        analyze([tree], tmp_path / "figs", baseline="nope")


def test_clean_and_warm_l2_rows_stay_apart_from_do_bench_rows(tmp_path):
    rows = micro_rows()
    read = [dict(r, l2_flush="read", median_us=r["median_us"] / 2) for r in rows]
    warm = [dict(r, l2_flush="none", median_us=r["median_us"] / 3) for r in rows]
    mb = load_microbench(micro_csv(tmp_path / "all.csv", [dict(r, l2_flush="zero") for r in rows] + read + warm))
    assert set(mb["implementation"]) == {"qblock", "vllm_unified", "qblock@read", "vllm_unified@read",
                                         "qblock@none", "vllm_unified@none"}
    by = mb.set_index(["case", "implementation"])["median_us"]
    assert by[("c-1.0-4", "qblock@none")] == pytest.approx(by[("c-1.0-4", "qblock")] / 3)  # each keeps its time
    older = tmp_path / "older.csv"  # a CSV from before the column: do_bench's flush
    pd.read_csv(micro_csv(tmp_path / "x.csv", rows)).drop(columns="l2_flush").to_csv(older, index=False)
    assert set(load_microbench(older)["l2_flush"]) == {"zero"}


def test_bad_microbench_csv(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(CollectError, match="empty file"):
        load_microbench(tmp_path / "empty.csv")
    (tmp_path / "cols.csv").write_text("case,median_us\na,1\n")
    with pytest.raises(CollectError, match="missing columns .*'implementation'"):
        load_microbench(tmp_path / "cols.csv")
    with pytest.raises(CollectError, match="no such microbenchmark CSV"):
        load_microbench(tmp_path / "none.csv")


def test_figure_without_data_is_skipped_with_a_warning(tree, tmp_path):
    agg = aggregate(collect_results(tree))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert figures.fig_latency_vs_output_len(agg, tmp_path / "figs", "talk") == []
    assert any(issubclass(w.category, plotting.MissingData) for w in caught)
    assert not (tmp_path / "figs").exists()


def test_a_platform_suite_is_split_into_its_experiments(tmp_path, captured):
    """Backends (8B, synthetic), V0/V1 (24B) and a latency sweep (8B, random) in one suite:
    three experiments, each drawn and normalized only within itself."""
    store = ResultsStore(tmp_path / "res", "h100")
    write_run(store, "h100", "backends-flex", [make_records([100], 10)], backend="FLEX_ATTENTION")
    write_run(store, "h100", "backends-triton", [make_records([50], 5)])
    write_run(store, "h100", "blog-v0-default", [make_records([300], 20)], model="/m/mistral24b", engine="v0-style")
    write_run(store, "h100", "blog-v1-default", [make_records([150], 30)], model="/m/mistral24b")
    for out_len in (10, 100):
        write_run(store, "h100", f"fig9-triton-{out_len}", [make_records([20], 5, tokens=out_len)],
                  output_len=out_len)
    out = analyze([tmp_path / "res"], tmp_path / "figs")
    assert sorted(set(out.agg["suite"])) == ["h100-backends", "h100-blog", "h100-fig9"]
    assert out.normalized["h100-backends"][0] == "backends-flex"
    base, norm = out.normalized["h100-blog"]
    assert base == "blog-v0-default" and set(norm["run"]) == {"blog-v0-default", "blog-v1-default"}
    v1 = norm[norm["run"] == "blog-v1-default"].iloc[0]
    assert v1["ttft"] == pytest.approx(150 / 300) and v1["itl"] == pytest.approx(30 / 20)
    assert "h100-fig9" not in out.normalized and "h100-fig9-latency-vs-output" in captured
    assert "h100-blog-serving" in captured and "h100-serving" not in captured


def test_fig9_claims_fall_back_to_the_longest_length_both_lines_have():
    """FA3 without its 12,800-token point: the %-of-FA3 claims are made at the longest
    length both lines were measured at, and say so; a line that was not run is not measured."""
    lat = {("FLASH_ATTN", 1000): 100.0, ("FLASH_ATTN", 4000): 400.0,
           ("CUSTOM (qblock)", 1000): 200.0, ("CUSTOM (qblock)", 4000): 800.0, ("CUSTOM (qblock)", 12800): 3000.0,
           ("CUSTOM (parallel_tiled)", 12800): 1000.0}
    rows = [{"line": line, "output_len": n, "e2el_ms": v, "e2el_min_ms": v, "e2el_max_ms": v, "repeats": 2,
             "cuda_graphs": "", "jit_compiles": 0} for (line, n), v in lat.items()]
    got = fig9.claims(pd.DataFrame(rows)).set_index("claim")
    assert got.loc["Q-block, % of FA3", "attnbench"] == "50.0%"
    assert got.loc["Q-block, % of FA3", "where"] == "4,000 output tokens (12,800 not measured for both)"
    assert got.loc["parallel tiled over Q-block", "attnbench"] == "3.00x"
    assert got.loc["parallel tiled over Q-block", "where"] == "12,800 output tokens"
    assert got.loc["naive, % of FA3", "verdict"] == "not measured"


def test_decode_steps_show_whether_a_step_grows_with_the_context(tmp_path):
    """ITL over the first and last tenth of each request, from the per-chunk records: a
    step that grows with the context (gap k = 5 + 0.1 k ms) against a flat one (5 ms)."""
    def growing(n):
        t, chunks = 0.02, []
        for k in range(n):
            chunks.append(t)
            t += (5 + 0.1 * (k + 1)) / 1e3  # gap k+1
        return [RequestRecord(0, "measure", 10, n, 0.0, chunk_s=chunks, chunk_tokens=[1] * n, end_s=chunks[-1],
                              prompt_tokens=10, completion_tokens=n)]

    store = ResultsStore(tmp_path / "res", "fig9")
    for n in (10, 100):
        write_run(store, "fig9", f"flash-{n}", [make_records([20], 5, tokens=n)] * 2, backend="FLASH_ATTN",
                  output_len=n)
        write_run(store, "fig9", f"qblock-{n}", [growing(n)] * 2, backend="CUSTOM", output_len=n,
                  env={"ATTNBENCH_VARIANT": "qblock"})
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    steps = fig9.decode_steps(fig9.sweep_table(analysis.agg)).set_index("line")
    # 99 gaps: the first tenth are gaps 1-10 (median 5.55 ms), the last tenth gaps 91-99 (median 14.5 ms)
    assert steps.loc["CUSTOM (qblock)", "output tokens"] == 100
    assert steps.loc["CUSTOM (qblock)", "ITL first tenth"] == pytest.approx(5.55)
    assert steps.loc["CUSTOM (qblock)", "ITL last tenth"] == pytest.approx(14.5)
    assert steps.loc["FLASH_ATTN", "growth ms"] == pytest.approx(0.0, abs=1e-9)
    assert "Decode steps (ITL, ms)" in write_report(analysis, tmp_path / "report.md").read_text()


def test_a_summary_that_is_not_ours_is_named(tmp_path):
    store = ResultsStore(tmp_path / "res", "talk")
    write_run(store, "talk", "flex", [make_records([100, 120], 10)], backend="FLEX_ATTENTION")
    path = store.repeat_dir("flex", 1) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "status": "finished", "completed": "many"}))
    with pytest.raises(CollectError, match=r"flex/r1/summary\.json: not an attnbench summary: .*status.*completed"):
        collect_results(tmp_path / "res")


def test_the_cpu_the_clients_machine_lost_is_a_column_per_repeat(tmp_path):
    """summary.json's `client_host` (stolen and stalled CPU seconds over the repeat) becomes
    host_steal_s / host_cpu_stall_s in the runs frame; repeats that did not record it get NaN."""
    store = ResultsStore(tmp_path / "res", "talk")
    write_run(store, "talk", "flex", [make_records([100, 120], 10), make_records([110, 130], 10)],
              backend="FLEX_ATTENTION")
    path = store.repeat_dir("flex", 1) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "client_host": {"steal_s": 1.5, "cpu_stall_s": 0.25}}))
    runs = collect_results(tmp_path / "res").runs.set_index("repeat")
    assert runs.loc[1, "host_steal_s"] == 1.5 and runs.loc[1, "host_cpu_stall_s"] == 0.25
    assert runs["host_steal_s"].isna().sum() == 1


def test_the_report_notes_runs_whose_repeats_lost_cpu_to_the_hypervisor(tmp_path):
    """A run whose repeats recorded stolen CPU gets its range per repeat in the aggregate and,
    from `STOLEN_NOTE_S` on, a note in the report; a run that lost less, or recorded
    nothing, gets none."""
    from attnbench.analysis.report import STOLEN_NOTE_S

    store = ResultsStore(tmp_path / "res", "talk")
    for run, backend in (("flex", "FLEX_ATTENTION"), ("custom", "CUSTOM"), ("triton", "TRITON_ATTN")):
        write_run(store, "talk", run, [make_records([100, 120], 10), make_records([110, 130], 10)], backend=backend)
    for run, stolen in (("flex", (0.2, 0.5)), ("custom", (0.3, STOLEN_NOTE_S + 2.5))):
        for i, steal in enumerate(stolen, start=1):
            path = store.repeat_dir(run, i) / "summary.json"
            path.write_text(json.dumps({**json.loads(path.read_text()),
                                        "client_host": {"steal_s": steal, "cpu_stall_s": 0.0}}))
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    agg = analysis.agg.set_index("run")
    assert agg.loc["custom", "host_steal_s_min"] == 0.3 and agg.loc["custom", "host_steal_s_max"] == 3.5
    assert pd.isna(agg.loc["triton", "host_steal_s_max"])
    text = write_report(analysis, tmp_path / "report.md").read_text()
    assert "- **note**: `custom`: the hypervisor took 0.3-3.5 CPU seconds from the client's machine" in text
    assert "`flex`: the hypervisor" not in text and "`triton`: the hypervisor" not in text


def test_the_report_warns_of_a_rated_load_the_server_fell_behind(tmp_path):
    """A repeat whose `keep_up` is under `FELL_BEHIND` (a queue grew through the load) gets a
    warning naming the repeat; a run that kept up, or a burst (no `keep_up`), gets none. The
    bound is the knee search's default (0.9)."""
    store = ResultsStore(tmp_path / "res", "talk")
    for run, backend in (("flex", "FLEX_ATTENTION"), ("custom", "CUSTOM"), ("triton", "TRITON_ATTN")):
        write_run(store, "talk", run, [make_records([100, 120], 10), make_records([110, 130], 10)], backend=backend)
    for run, kept in (("flex", (0.97, 0.73)), ("custom", (0.99, 0.95))):
        for i, keep_up in enumerate(kept, start=1):
            path = store.repeat_dir(run, i) / "summary.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "keep_up": keep_up}))
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    agg = analysis.agg.set_index("run")
    assert (agg.loc["flex", "keep_up_min"], agg.loc["flex", "keep_up_repeat"]) == (0.73, 2)
    text = write_report(analysis, tmp_path / "report.md").read_text()
    assert ("- **warning**: `flex`: the server fell behind its arrivals (r2 completed 73% of the requests that "
            "arrived in the load's second half; `keep_up`)") in text
    assert "`custom`: the server fell behind" not in text and "`triton`: the server fell behind" not in text


def test_report_numbers_read_like_numbers():
    assert format_value(1450.3, "total_token_throughput") == "1,450"
    assert format_value(24.537, "request_throughput") == "24.54"
    assert format_value(6.271, "tpot") == "6.27" and format_value(38.84, "ttft") == "38.8"
    assert format_value(26966.2, "e2el") == "26,966" and format_value(500) == "500"
    assert format_value(1.0512, ratio=True) == "1.05" and format_value(float("nan")) == "-"


def test_noise_is_named_next_to_each_ratio():
    import pandas as pd

    norm = pd.DataFrame([
        {"gpu": "g", "run": "v0", "repeats": 3, "total_token_throughput": 1.0, "total_token_throughput_lo": 0.95,
         "total_token_throughput_hi": 1.04},
        {"gpu": "g", "run": "v1", "repeats": 3, "total_token_throughput": 1.05, "total_token_throughput_lo": 1.01,
         "total_token_throughput_hi": 1.09},
        {"gpu": "g", "run": "v2", "repeats": 3, "total_token_throughput": 1.30, "total_token_throughput_lo": 1.25,
         "total_token_throughput_hi": 1.34}])
    lines = "\n".join(noise_lines(norm, "v0"))
    assert "`v1` vs `v0`" in lines and "total tok/s 1.05 [1.01-1.09 vs 0.95-1.04], inside the spread" in lines
    assert "total tok/s 1.30 [1.25-1.34 vs 0.95-1.04], outside the spread" in lines


def test_report_says_when_a_suite_mixes_sessions(tmp_path):
    store = ResultsStore(tmp_path / "res", "talk")
    write_run(store, "talk", "flex", [make_records([100, 120], 10)], backend="FLEX_ATTENTION")
    write_run(store, "talk", "triton", [make_records([50, 60], 5)])
    for run, session in (("flex", "2026-11-22T10:00:00+00:00"), ("triton", "2026-11-23T09:00:00+00:00")):
        path = store.repeat_dir(run, 1) / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "session": session}))
    report = write_report(analyze([tmp_path / "res"], tmp_path / "figs"), tmp_path / "r.md").read_text()
    assert "these results come from 2 sessions" in report and "2026-11-23T09:00:00+00:00: `triton`" in report


def test_the_report_sets_auto_against_fa3_and_the_packages_best_kernel(tmp_path):
    """Per case `auto` / FA3 and `auto` / the fastest of the package's own kernels; the
    geometric mean and the worst over the cases; the cases where `auto` trails the best by
    more than 3%, saying where `auto` ran the very launch of the kernel it trails (two
    timings of one launch, not a worse pick); the kernels of ours that did not run
    correctly; and why `auto` chose its config in each case."""
    def row(case, impl, us, status="ok", message="", config=""):
        return {"suite": "heldout", "case": case, "group": "", "implementation": impl, "status": status,
                "message": message, "kernel": f"ran {impl}", "why": f"rule for {case}" if impl == "auto" else "",
                "num_seqs": 1, "max_seqlen_k": 10, "sum_seq_lens": 10, "config": config,
                "decode_share": 1.0, "median_us": us, "floor_us": 1.0, "num_q_heads": 8, "num_kv_heads": 8,
                "head_size": 128}

    ws = '{"variant": "qblock_ws", "tile_size": 128, "persistent": false}'
    ws_reordered = '{"tile_size": 128, "persistent": false, "variant": "qblock_ws"}'
    rows = [row("a", "auto", 100.0), row("a", "fa3", 125.0), row("a", "qblock", 100.0), row("a", "parallel_tiled", 120.0),
            row("b", "auto", 110.0, config=ws), row("b", "fa3", 100.0), row("b", "qblock", 100.0),
            row("b", "static_grid", 200.0),
            row("b", "qblock_ws", "", status="error", message="OutOfResources: shared memory"),
            row("c", "auto", 104.0, config=ws), row("c", "fa3", 104.0), row("c", "qblock_ws", 100.0, config=ws_reordered),
            row("c", "qblock", 130.0, config='{"variant": "qblock", "tile_size": 128, "persistent": false}')]
    analysis = analyze([], tmp_path / "figs", microbench=[micro_csv(tmp_path / "heldout.csv", rows)])
    text = write_report(analysis, tmp_path / "r.md").read_text()
    geomean = (0.8 * 1.1 * 1.0) ** (1 / 3)
    assert f"`auto` / FA3 over 3 cases: geomean {geomean:.3f}x, worst 1.100x (`b`)" in text
    geomean = (1.0 * 1.1 * 1.04) ** (1 / 3)
    assert f"`auto` / the package's best kernel over 3 cases: geomean {geomean:.3f}x, worst 1.100x (`b`)" in text
    assert ("more than 3% slower than the package's best kernel: `b` (1.100x), `c` (1.040x; auto ran "
            "`qblock_ws`'s config, so this is two timings of one launch).") in text
    assert "`b` qblock_ws: error (OutOfResources: shared memory)" in text
    table = next(line for line in text.splitlines() if line.startswith("| b ") and "ran auto" in line)
    assert "why auto chose it" in text and table.rstrip(" |").endswith("rule for b")


def test_where_coalesced_chunks_dominate_tpot_is_the_headline_latency(tmp_path, captured):
    """The CPU demo's case: most chunks arrive in the read of the chunk before them, so most
    gaps are 0 ms and the median ITL is 0.00. The serving figures draw TPOT instead (no
    0.00 ms bar), and the report says what share of gaps was coalesced."""
    store = ResultsStore(tmp_path / "res", "demo")
    for run, itl in (("v0-style", 10), ("v1", 12)):
        records = make_records([100, 110, 120], itl, tokens=6)
        for r in records:  # 4 of 6 chunks read together with the one before: their gaps are 0
            r.chunk_s = [r.chunk_s[0]] * 3 + [r.chunk_s[3]] * 3
            r.coalesced = 4
        write_run(store, "demo", run, [records])
    analysis = analyze([tmp_path / "res"], tmp_path / "figs", baseline="v0-style")
    agg = analysis.agg.set_index("run")
    assert agg.loc["v1", "itl"] == 0.0 and agg.loc["v1", "coalesced_chunks"] == pytest.approx(4 / 6)
    fig, _ = captured["demo-serving"]
    assert fig.axes[2].get_ylabel() == "TPOT (ms)"
    assert all(p.get_height() > 0 for ax in fig.axes for p in ax.patches)
    fig, _ = captured["demo-normalized"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["total tok/s", "TTFT", "TPOT"]
    report = write_report(analysis, tmp_path / "r.md").read_text()
    assert "up to 67% of chunk gaps were coalesced" in report and "draw TPOT as the headline latency" in report


def test_the_run_table_never_cuts_a_run_name_in_80_columns():
    from rich.console import Console

    from attnbench.runner.execute import RepeatOutcome, summary_table
    from attnbench.runner.summary import RepeatSummary

    outcomes = [RepeatOutcome(name, 1, "ok", RepeatSummary(run=name, completed=5, median_ttft_ms=1234.5,
                                                           request_throughput=12.5))
                for name in ("backends-flash", "backends-flex", "fig9-steps-parallel-tiled-long-12800")]
    console = Console(width=80, record=True)
    console.print(summary_table("h100", outcomes))
    text = console.export_text()
    for o in outcomes:
        assert o.run in text, text


def test_the_run_table_marks_an_itl_that_coalesced_chunks_make_read_low():
    """A repeat whose chunk gaps were mostly read together has its ITL marked in the
    console's table, and the caption gives the share and the repeat's median TPOT; a
    repeat under the limit is not marked."""
    from rich.console import Console

    from attnbench.runner.execute import RepeatOutcome, summary_table
    from attnbench.runner.summary import RepeatSummary

    def outcome(run, share):
        return RepeatOutcome(run, 1, "ok", RepeatSummary(run=run, completed=5, median_itl_ms=0.0, median_tpot_ms=2.42,
                                                         client_coalesced_chunks=share))

    console = Console(width=200, record=True)
    console.print(summary_table("demo", [outcome("shared", 0.39), outcome("plain", 0.05)]))
    text = console.export_text()
    assert "0.00*" in text and text.count("*") == 2, text  # the cell and the caption
    assert "shared r1: 39%, median TPOT 2.42 ms" in text and "plain r1" not in text.split("* ITL")[1], text


def test_energy_is_a_column_a_table_and_a_panel_where_measured(tmp_path, captured):
    """summary.json's energy: output tokens per joule per repeat where the reading is valid,
    the mean of the valid repeats per run (a repeat whose reading is not valid is named in a
    warning, its other metrics still count), an energy table, a tok/J panel beside the
    serving bars, and tok/J normalized like a throughput. A CPU run says nothing of energy."""
    store = ResultsStore(tmp_path / "res", "talk")
    for run, backend in (("triton", "TRITON_ATTN"), ("flash", "FLASH_ATTN")):
        write_run(store, "talk", run, [make_records([100, 120], 10), make_records([110, 130], 10),
                                       make_records([90, 140], 10)], backend=backend)
    readings = {("triton", 1): {"valid": True, "energy_j": 16.0, "joules_per_output_token": 2.0,
                                "net_joules_per_output_token": 1.5, "mean_power_w": 400.0, "counter_vs_samples": 0.004},
                ("triton", 2): {"valid": True, "energy_j": 32.0, "joules_per_output_token": 4.0,
                                "net_joules_per_output_token": 3.0, "mean_power_w": 420.0, "counter_vs_samples": -0.01},
                ("triton", 3): {"valid": False, "note": "a gap of 1.30 s between power samples (over 1 s)",
                                "energy_j": 800.0, "joules_per_output_token": 100.0},
                ("flash", 1): {"valid": True, "joules_per_output_token": 1.0},
                ("flash", 2): {"valid": True, "joules_per_output_token": 1.0},
                ("flash", 3): {"valid": True, "joules_per_output_token": 1.0}}
    for (run, k), reading in readings.items():
        path = store.repeat_dir(run, k) / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "energy": reading}))
    runs = collect_results(tmp_path / "res").runs.set_index(["run", "repeat"])
    assert runs.loc[("triton", 1), "output_tokens_per_joule"] == 0.5
    assert pd.isna(runs.loc[("triton", 3), "output_tokens_per_joule"])  # not valid: no value
    analysis = analyze([tmp_path / "res"], tmp_path / "figs", baseline="flash")
    agg = analysis.agg.set_index("run")
    assert agg.loc["triton", "output_tokens_per_joule"] == pytest.approx(0.375)  # mean of 0.5 and 0.25
    assert (agg.loc["triton", "output_tokens_per_joule_lo"], agg.loc["triton", "output_tokens_per_joule_hi"]) == (0.25, 0.5)
    assert agg.loc["triton", "joules_per_output_token"] == 3.0 and agg.loc["triton", "energy_repeats"] == 2
    assert agg.loc["triton", "energy_left_out"] == "r3: a gap of 1.30 s between power samples (over 1 s)"
    text = write_report(analysis, tmp_path / "report.md").read_text()
    energy_table = text[text.index("Energy of the server's GPUs"):].splitlines()
    assert energy_table[2].split("|")[1:-1] == [" run    ", " repeats   ", " output tok/J   ", " J/tok   ",
                                                " J/tok net of idle   ", " mean W   ",
                                                " counter vs samples (worst)   "]
    assert [c.strip() for c in energy_table[5].split("|")[1:-1]] == ["triton", "2", "0.375", "3", "2.25", "410",
                                                                      "-1.0%"]
    assert ("- **warning**: `triton`: energy not valid in r3: a gap of 1.30 s between power samples (over 1 s) "
            "(its other metrics count; its energy is the mean of the 2 valid repeat(s)).") in text
    _, norm = analysis.normalized["talk"]
    assert norm.set_index("run").loc["triton", "output_tokens_per_joule"] == pytest.approx(0.375)
    fig, data = captured["talk-serving"]
    assert fig.axes[-1].get_ylabel() == "output tokens per joule (tok/J)"
    assert list(data["output_tokens_per_joule"]) == [1.0, pytest.approx(0.375)]  # flash, triton

    cpu = ResultsStore(tmp_path / "cpu", "demo")
    write_run(cpu, "demo", "cpu", [make_records([100, 120], 10)])
    path = cpu.repeat_dir("cpu", 1) / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "energy": {"valid": False, "note": "no GPU energy (gpu_vendor none)"}}))
    analysis = analyze([tmp_path / "cpu"], tmp_path / "cpu-figs")
    text = write_report(analysis, tmp_path / "cpu.md").read_text()
    assert "tok/J" not in text and "energy" not in text.lower()


def test_the_report_splits_a_requests_time_at_the_engine_where_the_server_counted_it(tmp_path):
    """summary.json's server_metrics (vLLM's /metrics around a repeat): the engine's time per
    request (queued + prefill + decode, engine-core stamps) against the server's E2EL, the
    rest being the API server's, beside the client's mean E2EL and ITL. Two runs whose
    engine times agree and whose deliveries differ show it in the table; a run without the
    server's metrics leaves its cells empty, and a tree without any has no table."""
    store = ResultsStore(tmp_path / "res", "talk")
    for run, backend in (("custom", "CUSTOM"), ("flash", "FLASH_ATTN")):
        write_run(store, "talk", run, [make_records([100, 120], 10), make_records([110, 130], 10)], backend=backend)
    write_run(store, "talk", "cpu", [make_records([100, 120], 10)])
    metrics = {"custom": [(12_000.0, 1_000.0, 400.0, 5_400.0, 22.0), (13_000.0, 1_000.0, 400.0, 5_400.0, 22.0)],
               "flash": [(10_000.0, 1_100.0, 380.0, 5_420.0, 21.0), (10_000.0, 1_100.0, 380.0, 5_420.0, 23.0)]}
    for run, repeats in metrics.items():
        for k, (e2el, queue, prefill, decode, itl) in enumerate(repeats, start=1):
            path = store.repeat_dir(run, k) / "summary.json"
            server = {"mean_e2el_ms": e2el, "mean_queue_ms": queue, "mean_prefill_ms": prefill,
                      "mean_decode_ms": decode, "mean_itl_ms": itl, "requests": 2.0}
            path.write_text(json.dumps({**json.loads(path.read_text()), "server_metrics": server}))
    agg = aggregate(collect_results(tmp_path / "res")).set_index("run")
    assert agg.loc["custom", "server_e2el_ms"] == 12_500.0 and agg.loc["custom", "engine_e2el_ms"] == 6_800.0
    assert agg.loc["custom", "outside_engine_ms"] == 5_700.0 and agg.loc["flash", "outside_engine_ms"] == 3_100.0
    assert agg.loc["flash", "engine_itl_ms"] == 22.0 and pd.isna(agg.loc["cpu", "outside_engine_ms"])
    text = write_report(analyze([tmp_path / "res"], tmp_path / "figs"), tmp_path / "report.md").read_text()
    table = text[text.index("Where a request's time went"):].splitlines()
    assert [c.strip() for c in table[2].split("|")[1:-1]] == [
        "run", "client E2EL ms", "server E2EL ms", "in the engine ms", "outside the engine ms", "client ITL ms",
        "engine ITL ms"]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in table[4:7])}
    client_e2el = format_value(agg.loc["custom", "mean_e2el_ms"])
    assert rows["custom"] == [client_e2el, "12,500", "6,800", "5,700", format_value(agg.loc["custom", "mean_itl_ms"]),
                              "22"]
    assert rows["flash"][1:4] == ["10,000", "6,900", "3,100"]
    assert rows["cpu"][1:4] == ["-"] * 3 and rows["cpu"][5] == "-" and rows["cpu"][0] != "-"

    bare = ResultsStore(tmp_path / "bare", "demo")
    write_run(bare, "demo", "cpu", [make_records([100, 120], 10)])
    text = write_report(analyze([tmp_path / "bare"], tmp_path / "bare-figs"), tmp_path / "bare.md").read_text()
    assert "Where a request's time went" not in text
