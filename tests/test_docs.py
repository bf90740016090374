"""The documentation agrees with the tool: every `attnbench` command quoted in README.md and
docs/ parses (its subcommands and options exist), every local link resolves, the numbers the
docs state about the shipped suites and the committed results are what the tool computes from
them, and the README stays a newcomer's page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from attnbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PLACEHOLDER = re.compile(r"\[|\||\.\.\.| / ")  # a synopsis, not a command


def _code_lines(page: Path) -> list[str]:
    """The command lines of a page's ```bash blocks, continuation lines joined, comments cut."""
    lines, block, joined = [], False, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if not block:
            continue
        joined += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            lines.append(joined.split("  #")[0].split(" # ")[0].strip())
            joined = ""
    return lines


def _quoted_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for line in _code_lines(page):
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("attnbench ") and not PLACEHOLDER.search(part):
                    found.append((str(page.relative_to(ROOT)), part))
    return found


COMMANDS = _quoted_commands()


def test_the_docs_quote_commands():
    assert len(COMMANDS) >= 25, COMMANDS


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_every_quoted_command_parses(page, command):
    """The subcommand path exists and its options and arguments parse (placeholder paths may
    not exist; nothing else may fail)."""
    args = shlex.split(command)[1:]
    cmd, ctx = main, click.Context(main, info_name="attnbench")
    while isinstance(cmd, click.Group):
        name, *args = args
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"{page}: `{command}`: no command {name!r}"
        cmd, ctx = sub, click.Context(sub, info_name=name, parent=ctx)
    try:
        cmd.make_context(cmd.name, list(args), parent=ctx.parent)
    except click.BadParameter as e:
        assert "does not exist" in str(e), f"{page}: `{command}`: {e}"
    except click.UsageError as e:
        pytest.fail(f"{page}: `{command}`: {e}")


LINK = re.compile(r"\]\(([^)#][^)]*?)(#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_local_link_resolves(page):
    broken = [target for target, _ in LINK.findall(page.read_text())
              if not target.startswith("http") and not (page.parent / target).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_is_a_newcomers_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text
    assert text.index("make demo") < text.index("make bench-h100") < text.index("## Where things are")


def _run(*args) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_platform_suite_table_counts_what_the_tool_counts():
    """docs/recipes.md's runs and tasks per platform suite are what `recipes validate` and
    `tasks` say."""
    table = (ROOT / "docs/recipes.md").read_text()
    rows = re.findall(r"^\| `(\w+)\.yaml` \| (\d+) \| (\d+) \|", table, re.M)
    assert {name for name, _, _ in rows} == {"h100", "mi300x"}
    for name, runs, tasks in rows:
        assert f": {runs} runs" in _run("recipes", "validate", f"recipes/{name}.yaml")
        assert f"{tasks} tasks:" in _run("tasks", f"recipes/{name}.yaml")


def test_the_h100_report_regenerates_with_the_numbers_the_docs_state(tmp_path):
    """`attnbench report` on the committed tree (summaries only) gives the Fig. 9 claims the
    README and docs/results/h100/README.md state."""
    _run("report", "docs/results/h100/h100", "--out", str(tmp_path / "figures"), "--report", str(tmp_path / "r.md"))
    report = (tmp_path / "r.md").read_text()
    static = re.search(r"\| CUSTOM \(static_grid\)\s+\| ([\d.]+)\s+\| ([\d.]+)\s+\| ([\d.]+)\s+\| ([\d.]+)\s+\| ([\d.]+)",
                       report)
    values = [float(v) for v in static.groups()]
    assert (min(values), max(values)) == (98.0, 102.7)
    for page in ("README.md", "docs/results/h100/README.md"):
        assert "98.0-102.7%" in (ROOT / page).read_text()
    assert re.search(r"\| naive, % of FA3 +\| 19\.7% +\| 18\.1% +\|", report)
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == \
        sorted(p.name for p in (ROOT / "docs/results/h100/figures").glob("*.png"))


def test_the_crosscheck_verdicts_the_docs_state_come_from_the_archived_campaigns():
    burst = _run("crosscheck", "compare", "docs/results/h100/crosscheck/burst-alternating")
    assert "| output_throughput | " in burst and "| 1.6% |" in burst.split("| output_throughput |")[1].split("\n")[0]
    assert "+1.6%" in (ROOT / "docs/crosscheck.md").read_text()


def test_refitting_the_shipped_tree_from_its_committed_sweep_gives_the_same_tree(tmp_path):
    """docs/perf/kernels-h100.md: fitting again from the CSV on a CPU gives the shipped tree."""
    page = (ROOT / "docs/perf/kernels-h100.md").read_text()
    assert "--rows docs/perf/h100/tune-2026-11-25-reduce1.csv --no-sweep --max-depth 5 --emit tuned.py" in \
        " ".join(page.split())
    _run("tune", "recipes/microbench/llama3-8b-tune.yaml", "--space", "recipes/microbench/tune-space.yaml",
         "--rows", "docs/perf/h100/tune-2026-11-25-reduce1.csv", "--no-sweep", "--max-depth", "5",
         "--device-name", "NVIDIA H100 80GB HBM3", "--emit", str(tmp_path / "tuned.py"))
    shipped = (ROOT / "kernels/dispatch/tuned_nvidia_h100_80gb_hbm3.py").read_text()

    def body(text: str) -> str:  # the tree, not the header naming where its rows came from
        return text[text.index("def choose"):]

    assert body((tmp_path / "tuned.py").read_text()) == body(shipped)


def test_the_readme_h100_numbers_come_from_the_committed_data():
    """README's H100 paragraph: TRITON_ATTN and FA3 ~3.4x FlexAttention within 3% of each
    other (the committed summaries); prefill at 76-78% of the roofline and 1.07x FA3's time
    (the committed roofline runs)."""
    import numpy as np

    from attnbench.analysis.collect import collect_results, load_microbench
    from attnbench.analysis.normalize import aggregate, normalize, split_experiments

    readme = (ROOT / "README.md").read_text()
    assert "3.3%\n  apart (FA3 ahead), both ~3.4x FlexAttention" in readme
    assert "76-78% of the" in readme and "1.07x FA3" in readme
    agg = split_experiments(aggregate(collect_results(ROOT / "docs/results/h100/h100")))
    norm = normalize(agg[agg["suite"] == "h100-backends"], "backends-flex").set_index("run")
    triton, flash = norm.loc["backends-triton", "total_token_throughput"], norm.loc["backends-flash", "total_token_throughput"]
    assert round((triton + flash) / 2, 1) == 3.4 and round((flash / triton - 1) * 100, 1) == 3.3
    pct, vs_fa3 = [], []
    for csv in (ROOT / "docs/perf/h100").glob("roofline-2026-11-25-tuned*.csv"):
        mb = load_microbench(csv)  # warm rows are named IMPL@none
        mb = mb.assign(implementation=mb["implementation"].str.split("@").str[0]).set_index(["case", "implementation"])
        auto = mb.loc[("prefill-b1-8k", "auto")]
        pct.append(auto["floor_us"] / auto["latency_us"] * 100)  # the better of eager and graph
        vs_fa3.append(mb.loc[("prefill-b1-8k", "auto"), "latency_us"] / mb.loc[("prefill-b1-8k", "fa3"), "latency_us"])
    assert len(pct) == 4 and 75.5 <= min(pct) and max(pct) <= 78.5
    assert np.round(np.median(vs_fa3), 2) == 1.07


def test_the_h100_energy_figures_come_from_the_committed_summaries():
    """README and docs/results/h100/README.md, section d: tokens per joule per backend and
    the counter within 1.8% of the integrated power samples in every repeat, as the
    committed summaries of docs/results/h100/energy hold them."""
    from attnbench.analysis.collect import collect_results
    from attnbench.analysis.normalize import aggregate

    runs = collect_results(ROOT / "docs/results/h100/energy/h100").runs
    assert len(runs) == 12 and runs["energy_valid"].all()
    assert runs["counter_vs_samples"].abs().max() <= 0.018
    agg = aggregate(collect_results(ROOT / "docs/results/h100/energy/h100")).set_index("run")
    per_joule = agg["output_tokens_per_joule"].round(1).to_dict()
    assert per_joule == {"backends-custom": 10.6, "backends-flash": 10.9, "backends-flex": 5.1, "backends-triton": 10.8}
    readme = (ROOT / "README.md").read_text()
    assert ("FA3 10.9 output tokens per joule,\n  vLLM's Triton backend 10.8, attnbench's kernels 10.6, FlexAttention 5.1"
            in readme)
    assert "agree within 1.8%" in readme
    results = (ROOT / "docs/results/h100/README.md").read_text()
    for run in ("flash", "custom", "flex", "triton"):
        row = next(line for line in results.splitlines() if line.startswith(f"| backends-{run} |") and "tok/J" not in line
                   and line.count("|") == 8)
        assert f"| {per_joule[f'backends-{run}']:.1f} |" in row, row


def test_the_h100_knees_come_from_the_committed_searches():
    """README and docs/results/h100/README.md, section e: each backend's knee, the rate that
    failed above it, and the tokens per joule at the burst and at the knee, as the committed
    knee.json files hold them; every committed search converged."""
    from attnbench.analysis.knee import collect_knees

    runs, _ = collect_knees(ROOT / "docs/results/h100/knee/h100")
    runs = runs.set_index("run")
    assert runs["converged"].all()
    results = (ROOT / "docs/results/h100/README.md").read_text()
    for run, r in runs.iterrows():
        row = next(line for line in results.splitlines() if line.startswith(f"| {run} |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert [float(cells[2]), float(cells[3]), int(cells[4])] == [
            pytest.approx(r["knee_rate"], rel=0.002), pytest.approx(r["upper_rate"], rel=0.002), r["probes"]], row
        assert cells[-1] == f"{r['burst_tokens_per_joule']:.3g} / {r['knee_tokens_per_joule']:.3g}", row
    readme = (ROOT / "README.md").read_text()
    assert f"FA3 holds\n  {runs.loc['knee-flash', 'knee_rate']:.0f} req/s ({runs.loc['knee-flash', 'knee_tokens_per_joule']:.1f}" in readme
    assert f"attnbench's kernels {runs.loc['knee-custom', 'knee_rate']:.1f}, vLLM's Triton\n  backend {runs.loc['knee-triton', 'knee_rate']:.1f}, FlexAttention {runs.loc['knee-flex', 'knee_rate']:.1f} req/s" in readme


def test_the_h100_workload_numbers_come_from_the_committed_summaries():
    """README and docs/results/h100/README.md, section f: hit rate, median TTFT and TPOT,
    output tokens per second and per joule of each workload run, as the committed summaries
    of docs/results/h100/workloads hold them."""
    from attnbench.analysis.collect import collect_results
    from attnbench.analysis.normalize import aggregate

    def three_figures(x):  # 19.0 and 5.10 keep their zero, 361 takes no point
        return f"{x:#.3g}".rstrip(".")

    agg = aggregate(collect_results(ROOT / "docs/results/h100/workloads/h100")).set_index("run")
    assert len(agg) == 9 and (agg["failed"] == 0).all()
    results = (ROOT / "docs/results/h100/README.md").read_text()
    for run, r in agg.iterrows():
        row = next(line for line in results.splitlines() if line.startswith(f"| {run} |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        hit = "-" if r["prefix_cache_hit_pct"] != r["prefix_cache_hit_pct"] else f"{r['prefix_cache_hit_pct']:.1f}"
        assert cells[3:] == [hit, three_figures(r["ttft"]), three_figures(r["tpot"]), f"{r['output_throughput']:,.0f}",
                             three_figures(r["output_tokens_per_joule"])], row
    ttft = agg["ttft"].round().astype(int)
    readme = (ROOT / "README.md").read_text()
    off_on = {b: f"{ttft[f'workloads-prefix-off-{b}']} -> {ttft[f'workloads-prefix-on-{b}']} ms"
              for b in ("flash", "custom", "triton")}
    assert (f"TTFT falls {off_on['flash']} on FA3, {off_on['custom']} on attnbench's kernels,\n"
            f"  {off_on['triton']}") in readme
    chat = agg["output_throughput"]
    behind = [f"{100 * (1 - chat[f'workloads-chat-{b}'] / chat['workloads-chat-flash']):.1f}% less"
              for b in ("custom", "triton")]
    assert f"FA3 {chat['workloads-chat-flash']:,.0f} output tok/s, attnbench's kernels {behind[0]}" in readme
    assert f"vLLM's Triton backend {behind[1]}" in readme


def test_the_h100_kernels_beside_fa3_come_from_the_committed_summaries():
    """docs/results/h100/README.md, section g: total tokens per second (mean, min-max), TTFT,
    ITL, GPU power and output tokens per joule of CUSTOM and FLASH_ATTN on Llama (with and
    without n-gram speculative decoding), Qwen and Gemma-2, and CUSTOM's ratios, as the
    committed summaries of docs/results/h100/shapes hold them."""
    from attnbench.analysis.collect import collect_results
    from attnbench.analysis.normalize import aggregate

    agg = aggregate(collect_results(ROOT / "docs/results/h100/shapes/h100")).set_index("run")
    assert len(agg) == 8 and (agg["failed"] == 0).all() and (agg["repeats"] == 3).all()
    text = (ROOT / "docs/results/h100/README.md").read_text()
    results = text[text.index("## g. "):text.index("## Wall time")]  # section d names two of the runs too
    for run, r in agg.iterrows():
        row = next(line for line in results.splitlines() if line.startswith(f"| {run} |"))
        cells = [c.strip() for c in row.split("|")[1:-1]]
        tok = (f"{r['total_token_throughput']:,.0f} ({r['total_token_throughput_lo']:,.0f}-"
               f"{r['total_token_throughput_hi']:,.0f})")
        assert cells[3:] == [tok, f"{r['ttft']:,.0f}", f"{r['itl']:.1f}", f"{r['mean_power_w']:.0f}",
                             f"{r['output_tokens_per_joule']:.1f}"], row
    tok = agg["total_token_throughput"]
    behind = 100 * (1 - tok["shapes-llama8b-custom"] / tok["shapes-llama8b-flash"])
    assert f"**Llama-3.1-8B: CUSTOM is {behind:.1f}% behind FA3**" in results
    engine = agg["engine_e2el_ms"]
    assert (f"(mean {engine['shapes-llama8b-custom']:,.0f} against {engine['shapes-llama8b-flash']:,.0f}: "
            f"{engine['shapes-llama8b-custom'] / engine['shapes-llama8b-flash']:.3f}x)") in results
    ratio = tok["shapes-qwen7b-custom"] / tok["shapes-qwen7b-flash"]
    assert f"CUSTOM puts out {ratio:.2f}x FA3's tokens per second there" in results
    gemma = tok["shapes-gemma9b-custom"] / tok["shapes-gemma9b-flash"]
    assert f"CUSTOM puts out {100 * (1 - gemma):.1f}% fewer tokens per second than FA3 ({gemma:.2f}x)" in results
    spec = (f"{tok['shapes-spec-custom']:,.0f} against {tok['shapes-spec-flash']:,.0f}\n  total tok/s "
            f"({tok['shapes-spec-custom'] / tok['shapes-spec-flash']:.2f}x")
    assert spec in results


def test_the_held_out_grid_numbers_come_from_the_committed_csvs():
    """README and docs/perf/kernels-h100.md: `auto` over FA3 on the held-out grid, geomean
    and worst, with the shipped tree and without it, as the report computes them from
    docs/perf/h100/heldout-{tuned,untuned}.csv, and on the H200 (no tree) from
    docs/perf/h200/heldout-untuned.csv and the random grid's heldout-random.csv."""
    from attnbench.analysis.collect import load_microbench
    from attnbench.analysis.report import against_fa3_and_best

    def geomean_and_worst(csv_path: str) -> tuple[str, str]:
        lines = against_fa3_and_best(load_microbench(ROOT / csv_path))
        summary = next(line for line in lines if line.startswith("- `auto` / FA3 over 45 cases"))
        return re.search(r"geomean (\d\.\d+)x, worst (\d\.\d+)x", summary).groups()

    stated = {tree: geomean_and_worst(f"docs/perf/h100/heldout-{tree}.csv") for tree in ("tuned", "untuned")}
    readme = (ROOT / "README.md").read_text()
    assert (f"{stated['tuned'][0]}x FA3's time in geometric mean with the shipped\n  tree, {stated['untuned'][0]}x "
            f"without it; worst {float(stated['tuned'][1]):.1f}x") in readme
    perf = (ROOT / "docs/perf/kernels-h100.md").read_text()
    row = re.search(r"\| FA3, geomean \(worst\) \| (\d\.\d{3})x \((\d\.\d{2})x, [^)]+\) \| "
                    r"(\d\.\d{3})x \((\d\.\d{2})x,", perf).groups()
    assert row == (f"{float(stated['tuned'][0]):.3f}", f"{float(stated['tuned'][1]):.2f}",
                   f"{float(stated['untuned'][0]):.3f}", f"{float(stated['untuned'][1]):.2f}")
    geomean, worst = geomean_and_worst("docs/perf/h200/heldout-untuned.csv")
    assert f"H200, for which no tree is fitted, {geomean}x (worst {float(worst):.1f}x" in readme
    assert f"`auto` over FA3 {geomean}x in geometric mean, worst {float(worst):.2f}x" in perf
    lines = against_fa3_and_best(load_microbench(ROOT / "docs/perf/h200/heldout-random.csv"))
    summary = next(line for line in lines if line.startswith("- `auto` / FA3 over 48 cases"))
    geomean, worst = re.search(r"geomean (\d\.\d+)x, worst (\d\.\d+)x", summary).groups()
    assert f"(`heldout-random.yaml`), {geomean}x\n  FA3's time on the H200 (worst {float(worst):.1f}x" in readme
    assert f"**{geomean}x in geometric mean, worst {float(worst):.2f}x**" in perf
