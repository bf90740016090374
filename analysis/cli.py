"""`attnbench plot`, `attnbench report` and `attnbench crosscheck`."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import click

from attnbench.runner.commands import model_options, suite_with_models
from attnbench.runner.crosscheck import LOADS, CrossCheck, CrossCheckError, run_crosscheck
from attnbench.runner.datasets import DatasetError
from attnbench.runner.models import ModelFolderError, ensure_model
from attnbench.runner.recipe import RecipeError
from attnbench.runner.server import ServerError, ServerProcess, build_launch
from attnbench.runner.store import atomic_write_text

from . import crosscheck, crosscheck_runs
from .collect import CollectError
from .crosscheck_runs import COMPARISON_FILE


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
@click.option("--note", "notes", multiple=True,
              help="A line for the top of the report (repeatable), e.g. where archived records are.")
def report_cmd(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded, report_path, notes):
    """Figures plus a Markdown report with tables and conventions."""
    from .report import write_report  # lazy: matplotlib, as in _run

    analysis, out_dir = _run(results, microbench, vllm_bench, baseline, micro_baseline, out_dir, keep_degraded)
    report_path = report_path or ((results[0] if results else out_dir) / "report.md")
    click.echo(f"report: {write_report(analysis, report_path, notes)}")


@click.group("crosscheck")
def crosscheck_group():
    """attnbench's load client beside `vllm bench serve` on one server: run a campaign,
    compare the two clients, keep what a repository keeps of it."""


@crosscheck_group.command("run")
@click.argument("suite_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--only", "run_name", help="With SUITE_FILE: the run whose server to start (default: the first).")
@model_options
@click.option("--url", help="A server already listening (instead of SUITE_FILE), e.g. http://127.0.0.1:8000.")
@click.option("--model", help="With --url: its served model name.")
@click.option("--tokenizer", type=click.Path(file_okay=False, path_type=Path),
              help="Folder with the model's tokenizer.json (default with SUITE_FILE: the run's).")
@click.option("--server-pid", type=int, help="With --url: the server's process, for its CPU time per run.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The campaign's folder (an existing one is finished, not started over).")
@click.option("--prompts", type=click.IntRange(min=2), default=500, show_default=True)
@click.option("--dataset-path", type=click.Path(dir_okay=False, path_type=Path),
              help="ShareGPT JSON to send (default: synthetic ShareGPT-shaped prompts).")
@click.option("--pairs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=20.0, show_default=True,
              help="Poisson load, req/s (both clients together side by side).")
@click.option("--load", "loads", multiple=True, type=click.Choice(["burst", "poisson"]),
              help="Loads to run (repeatable; default both).")
@click.option("--side-by-side", is_flag=True, help="Both clients at once, each on half of the prompts.")
@click.option("--client-processes", "fixed", multiple=True, type=click.IntRange(1, 64),
              help="Add to every pair a run of `attnbench load --client-processes N` (repeatable).")
@click.option("--lead", "lead_s", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Side by side: seconds from launching both clients to their shared start.")
def crosscheck_run(suite_file, run_name, models, models_dir, url, model, tokenizer, server_pid, out_dir, prompts,
                   dataset_path, pairs, rate, loads, side_by_side, fixed, lead_s):
    """Run both clients against one server (started from SUITE_FILE's run, or at --url)
    and write OUT/comparison.md."""
    if bool(suite_file) == bool(url):
        raise click.UsageError("give SUITE_FILE (attnbench starts its run's server) or --url (a running server)")
    if url and not (model and tokenizer):
        raise click.UsageError("--url needs --model and --tokenizer")
    try:  # everything the options can get wrong, before a server starts
        plan = CrossCheck(url.rstrip("/") if url else "", model or "", tokenizer or Path(), out_dir, prompts=prompts,
                          pairs=pairs, rate=rate, loads=tuple(loads) or LOADS, side_by_side=side_by_side,
                          fixed_processes=tuple(fixed), dataset_path=dataset_path, server_pid=server_pid, lead_s=lead_s)
    except CrossCheckError as e:
        raise click.UsageError(str(e)) from None
    server = None
    try:
        if suite_file:
            suite = suite_with_models(suite_file, models, models_dir)
            try:
                recipe = suite.select([run_name])[0] if run_name else suite.runs[0]
            except RecipeError as e:
                raise click.BadParameter(str(e), param_hint="--only") from None
            try:
                ensure_model(recipe.model.path, recipe.model.build)
            except ModelFolderError as e:
                raise click.ClickException(str(e)) from None
            out_dir.mkdir(parents=True, exist_ok=True)
            server = ServerProcess(build_launch(recipe), out_dir / "server.log", recipe.serve.startup_timeout_s)
            server.__enter__()
            plan = replace(plan, url=server.plan.base_url, model=recipe.model.name, server_pid=server.proc.pid,
                           tokenizer=tokenizer or Path(recipe.model.tokenizer_path))
        run_crosscheck(plan, log=lambda line: click.echo(line, err=True))
    except (CrossCheckError, ServerError, DatasetError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        if server is not None:
            server.stop()
    path = out_dir / COMPARISON_FILE
    atomic_write_text(path, "\n".join(crosscheck.report(out_dir)) + "\n")
    click.echo(f"comparison: {path}")


@crosscheck_group.command("compare")
@click.argument("campaigns", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the comparison here (default: print it).")
def crosscheck_compare(campaigns, out_file):
    """The two clients compared over one or several CAMPAIGNS (folders of `crosscheck run`
    or of `crosscheck archive`); several are read apart, then pooled per request rate."""
    try:
        text = "\n".join(crosscheck.report(*campaigns)) + "\n"
    except crosscheck_runs.CrossCheckDataError as e:
        raise click.UsageError(str(e)) from None
    if out_file:
        atomic_write_text(out_file, text)
        click.echo(f"comparison: {out_file}")
    else:
        click.echo(text, nl=False)


@crosscheck_group.command("archive")
@click.argument("src", type=click.Path(file_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def crosscheck_archive(src, dest):
    """Keep what a repository keeps of campaign SRC in DEST: one row per client run
    (crosscheck.json), campaign.json and comparison.md; `compare` reads DEST like SRC."""
    try:
        click.echo(f"archived: {crosscheck_runs.archive(src, dest)}")
    except crosscheck_runs.CrossCheckDataError as e:
        raise click.UsageError(str(e)) from None
