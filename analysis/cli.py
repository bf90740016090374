"""`attnbench plot` and `attnbench report`."""

from __future__ import annotations

import warnings
from pathlib import Path

import click

from .collect import CollectError


def _common(f):
    opts = [
        click.argument("results", nargs=-1, type=click.Path(path_type=Path)),
        click.option("--microbench", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                     help="Microbenchmark CSV (repeatable)."),
        click.option("--vllm-bench", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                     help="JSON of `vllm bench serve --save-result` (repeatable)."),
        click.option("--baseline", help="Run to normalize serving results to (default: the FLEX_ATTENTION "
                                        "run, else v0-default / v0-style)."),
        click.option("--micro-baseline", help="Implementation to normalize microbenchmarks to "
                                              "(default: vllm_unified, sdpa or naive)."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
                     help="Where figures go (default: <first results dir>/figures)."),
        click.option("--keep-degraded", is_flag=True,
                     help="Count degraded repeats (over 1% of requests failed, or one timed out) in the means."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _run(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded):
    from .report import analyze  # lazy: matplotlib (through .figures) takes a second to import

    out_dir = out_dir or ((results[0] if results else Path(".")) / "figures")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            analysis = analyze(list(results), out_dir, microbench=list(microbench), vllm_bench=list(vllm_bench),
                               baseline=baseline, micro_baseline=micro_baseline, keep_degraded=keep_degraded)
        except CollectError as e:
            raise click.UsageError(str(e)) from None
    for w in caught:
        click.echo(f"warning: {w.message}", err=True)
    return analysis, out_dir


@click.command("plot")
@_common
def plot_cmd(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded):
    """Draw every figure the RESULTS (attnbench results trees) and CSV/JSON inputs support."""
    analysis, out_dir = _run(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded)
    pngs = [p for p in analysis.figures if p.suffix == ".png"]
    click.echo(f"{len(pngs)} figures (PNG + SVG + CSV) in {out_dir}")


@click.command("report")
@_common
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Markdown file (default: <first results dir>/report.md).")
def report_cmd(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded, report_path):
    """Figures plus a Markdown report with tables and conventions."""
    from .report import write_report  # lazy: matplotlib, as in _run

    analysis, out_dir = _run(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded)
    report_path = report_path or ((results[0] if results else out_dir) / "report.md")
    click.echo(f"report: {write_report(analysis, report_path)}")
