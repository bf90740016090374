"""Runner subcommands of `attnbench`: run, serve, load, calibrate, recipes, model."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path

import click
from pydantic import ValidationError

from attnbench.validation import validation_lines

from .calibrate import calibrate, serve_stub
from .datasets import DatasetError, LocalTokenizer, build_requests, to_sharegpt
from .energy import EnergyMeter, server_gpus
from .execute import run_suite
from .loadgen import LoadConfig
from .loadpool import resolve_processes
from .models import ModelFolderError, ensure_model, write_dummy_model, write_tiny_model
from .preflight import PreflightError, check_accelerator, check_datasets, preflight
from .recipe import BenchmarkSettings, DatasetSpec, RecipeError, load_suite
from .repeat import measure_repeat
from .server import ServerError, ServerProcess, build_launch
from .slo import Slo, parse_objectives
from .store import REQUESTS_FILE, SUMMARY_FILE, RecordWriter, ResultsStore, atomic_write_json
from .summary import RepeatHeader
from .tasks import parse_task, split_tasks, task_runs, write_plan
from .workload import Workload


class ProcessCount(click.ParamType):
    """A client-process count, 1-64, or ``auto``."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto":
            return value
        if not (str(value).isdigit() and 1 <= int(value) <= 64):
            self.fail(f"expected a count from 1 to 64 or 'auto', got {value!r}", param, ctx)
        return int(value)


class GpuList(click.ParamType):
    """GPUs as a comma-separated list of indices or UUIDs (``0,1``; ``GPU-8f3...``)."""

    name = "LIST"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        gpus = [g.strip() for g in str(value).split(",")]
        if not all(g.isdigit() or re.fullmatch(r"(GPU|MIG)-[0-9A-Fa-f-]+", g) for g in gpus):
            self.fail(f"expected GPU indices or UUIDs separated by commas (e.g. 0,1), got {value!r}", param, ctx)
        return gpus


def _slo_or_fail(objectives: tuple[str, ...], target: float | None) -> Slo | None:
    """--slo / --slo-target as an `Slo` (None without objectives), or a usage error naming them."""
    if not objectives:
        if target is not None:
            raise click.BadParameter("needs at least one --slo objective", param_hint="--slo-target")
        return None
    try:
        return Slo(objectives=parse_objectives(objectives), target=target)
    except ValidationError as e:
        raise click.BadParameter(e.errors()[0]["msg"].removeprefix("Value error, "), param_hint="--slo") from None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--slo") from None


def _suite_or_fail(path: Path):
    try:
        return load_suite(path)
    except RecipeError as e:
        raise click.UsageError(str(e)) from None


def _term_as_interrupt() -> None:
    """SIGTERM ends a run like Ctrl-C: servers stop, partial results stay on disk."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def model_options(f):
    """--models / --models-dir, shared by `run` and `serve`."""
    f = click.option("--models-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".models"),
                     show_default=True, help="Where dummy model folders are made.")(f)
    return click.option("--models", type=click.Choice(["as-written", "dummy"]), default="as-written",
                        show_default=True, help="dummy: serve each run's published shape (model.arch) with "
                        "random weights, no download.")(f)


def suite_with_models(suite_file: Path, models: str, models_dir: Path):
    suite = _suite_or_fail(suite_file)
    return suite.with_dummy_models(models_dir) if models == "dummy" else suite


@click.command("run")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--only", multiple=True, help="Run name or pattern (e.g. 'fig9-steps-*') to run (repeatable); default: every run.")
@click.option("--engine", "engines", multiple=True, type=click.Choice(["v1", "v0", "v0-style"]),
              help="Only the runs of this serve.engine (repeatable): V0 runs need an image or venv of vLLM <= 0.10.")
@click.option("--repeats", type=click.IntRange(min=1), help="Override every run's repeat count.")
@click.option("--out", "out_root", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Results root; the suite writes to OUT/<suite>/<run>/r<k>/.")
@click.option("--task", "task_spec", metavar="i/N",
              help="Run only task i of N (0-based; a task is one server configuration with its runs, "
                   "see `attnbench tasks`), resuming what is there: for scheduler job arrays.")
@click.option("--resume", is_flag=True, help="Finish a results folder: skip repeats whose summary.json says ok.")
@click.option("--overwrite", is_flag=True, help="Delete the suite's results folder first and start over.")
@model_options
@click.option("--sharegpt", type=click.Path(dir_okay=False, path_type=Path),
              help="Use this ShareGPT JSON for every run's prompts.")
def run_cmd(suite_file, only, engines, task_spec, repeats, out_root, resume, overwrite, models, models_dir,
            sharegpt):
    """Serve each run of SUITE_FILE with vLLM, warm up, measure the repeats, stop the server.

    Refuses to write into a folder that already holds results unless --resume (finish it)
    or --overwrite (start over) is given; checks datasets and the GPU first."""
    if resume and overwrite:
        raise click.UsageError("--resume and --overwrite exclude each other")
    suite = suite_with_models(suite_file, models, models_dir)
    if sharegpt:
        suite = suite.with_sharegpt(sharegpt)
    try:
        runs = suite.select(list(only) or None)
    except RecipeError as e:
        raise click.BadParameter(str(e), param_hint="--only") from None
    if engines:
        runs = [r for r in runs if r.serve.engine in engines]
        if not runs:
            click.echo(f"{suite_file}: no selected run has engine {' or '.join(engines)}; nothing to do")
            return
    store = ResultsStore(out_root, suite.name)
    if task_spec:
        try:
            index, count = parse_task(task_spec)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--task") from None
        if overwrite:
            raise click.UsageError("--task resumes what earlier tasks measured; it excludes --overwrite")
        tasks = split_tasks(runs)
        if not (store.suite_dir / "tasks.json").exists():
            write_plan(store, suite, tasks, repeats)
        runs, resume = task_runs(tasks, index, count), True
        if not runs:
            click.echo(f"task {index}/{count}: the suite has {len(tasks)} tasks; nothing for this one")
            return
    suite = suite.model_copy(update={"runs": runs})
    try:
        preflight(suite, runs, store, resume=resume, overwrite=overwrite)
    except PreflightError as e:
        raise click.ClickException(str(e)) from None
    _term_as_interrupt()
    try:
        outcomes = run_suite(suite, out_root, repeats=repeats, resume=resume, overwrite=overwrite)
    except KeyboardInterrupt:
        click.echo(f"interrupted: server stopped, results so far are under {out_root / suite.name}", err=True)
        sys.exit(130)
    failed = [o for o in outcomes if o.status != "ok"]
    click.echo(f"results: {out_root / suite.name}")
    if failed:
        click.echo(f"{len(failed)} of {len(outcomes)} repeats failed", err=True)
        sys.exit(1)


@click.command("serve")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--only", "run_name", help="Run to serve (default: the suite's first run).")
@model_options
@click.option("--port", type=click.IntRange(1, 65535), help="Port to bind (default: the recipe's, else a free one).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("server.log"),
              show_default=True)
def serve_cmd(suite_file, run_name, models, models_dir, port, log_path):
    """Start one run's vLLM server and hold it until Ctrl-C (e.g. to load it with
    `attnbench load` and another client side by side)."""
    suite = suite_with_models(suite_file, models, models_dir)
    try:
        recipe = suite.select([run_name])[0] if run_name else suite.runs[0]
    except RecipeError as e:
        raise click.BadParameter(str(e), param_hint="--only") from None
    try:
        check_accelerator(suite, [recipe])
    except PreflightError as e:
        raise click.ClickException(str(e)) from None
    try:
        ensure_model(recipe.model.path, recipe.model.build)
    except ModelFolderError as e:
        raise click.ClickException(str(e)) from None
    plan = build_launch(recipe, port=port)
    _term_as_interrupt()
    try:
        with ServerProcess(plan, log_path, recipe.serve.startup_timeout_s):
            click.echo(f"{recipe.name}: serving {recipe.model.name} at {plan.base_url} (log {log_path}); "
                       f"Ctrl-C stops it")
            signal.pause() if hasattr(signal, "pause") else input()
    except ServerError as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:
        click.echo("server stopped")


PROMPT_KINDS = ("synthetic", "sharegpt", "random")  # prompt sets a file of first turns can hold (`dataset export`)
WORKLOAD_KINDS = (*PROMPT_KINDS, "shared_prefix", "multiturn", "trace")  # what `load` sends (docs/running.md)


def dataset_options(kinds: tuple[str, ...]):
    """The prompt-set options shared by `load` and `dataset export` (``--dataset`` one of ``kinds``)."""
    def decorate(f):
        for option in reversed([
            click.option("--tokenizer", "tokenizer_dir", required=True,
                         type=click.Path(file_okay=False, path_type=Path),
                         help="Folder with the model's tokenizer.json (token counts, synthetic text)."),
            click.option("--dataset", type=click.Choice(kinds), default="synthetic", show_default=True),
            click.option("--dataset-path", help="ShareGPT JSON (sharegpt, multiturn) or JSONL trace (trace)."),
            click.option("--input-len", type=int, help="random: prompt tokens; shared_prefix: each suffix's."),
            click.option("--output-len", type=int, help="Fixed output tokens (random, shared_prefix: required)."),
            click.option("--num-prompts", type=click.IntRange(min=1), default=200, show_default=True,
                         help="Requests (multiturn: conversations; trace: lines from the top)."),
            click.option("--seed", type=int, default=0, show_default=True),
        ]):
            f = option(f)
        return f
    return decorate


def workload_options(f):
    """`load`'s settings of the shared_prefix, multiturn and trace kinds (recipe fields of
    the same names: docs/running.md, "Workloads"); unset ones keep the recipe defaults."""
    for option in reversed([
        click.option("--num-prefixes", type=int, help="shared_prefix: distinct prefixes."),
        click.option("--prefix-len", type=int, help="shared_prefix: tokens of each prefix."),
        click.option("--conversations", type=int, help="multiturn: conversations at a time."),
        click.option("--think-time", "think_time_s", type=float, help="multiturn: s from an answer to the next turn."),
        click.option("--max-turns", type=int, help="multiturn: user turns per conversation at most."),
        click.option("--speedup", type=float, help="trace: replay the timestamps this many times faster."),
        click.option("--block-size", type=int, help="trace: tokens per hash id."),
    ]):
        f = option(f)
    return f


# a recipe field -> the `load` option that sets it, for errors in the options' names
LOAD_OPTIONS = {"path": "--dataset-path", "input_len": "--input-len", "output_len": "--output-len",
                "num_prefixes": "--num-prefixes", "prefix_len": "--prefix-len", "conversations": "--conversations",
                "think_time_s": "--think-time", "max_turns": "--max-turns", "speedup": "--speedup",
                "block_size": "--block-size", "request_rate": "--request-rate",
                "client_processes": "--client-processes", "max_concurrency": "--max-concurrency"}


def _in_option_names(err: ValidationError) -> str:
    """A validation error of the settings `load` builds, in its options' names, one line."""
    lines = []
    for line in validation_lines(err):
        line = line.removeprefix("(top level): ").replace("dataset kind '", "--dataset '").replace("kind '", "--dataset '")
        for field, option in LOAD_OPTIONS.items():
            line = re.sub(rf"(^|\bdataset\.|')({field})(:|'|\b)", lambda m: option + (m[3] if m[3] == ":" else ""),
                          line)
            line = re.sub(rf"\bleave {field} out", f"leave {option} out", line)
        lines.append(line)
    return "; ".join(lines)


def _workload_or_fail(tokenizer_dir: Path, dataset_fields: dict, **benchmark):
    """The settings and load of an `attnbench load` (runner/workload.py), or a usage error
    in the options' names."""
    try:
        spec = DatasetSpec(**{k: v for k, v in dataset_fields.items() if v is not None})
        b = BenchmarkSettings(dataset=spec, **benchmark)
        return b, Workload.of(b, tokenizer_dir)
    except ValidationError as e:
        raise click.UsageError(_in_option_names(e)) from None
    except DatasetError as e:
        raise click.UsageError(str(e)) from None


def _requests_or_fail(dataset, dataset_path, input_len, output_len, num_prompts, tokenizer_dir, seed):
    try:
        spec = DatasetSpec(kind=dataset, path=dataset_path, input_len=input_len, output_len=output_len)
        return build_requests(spec, num_prompts, tokenizer_dir, seed)
    except ValidationError as e:  # what the options lack, in the options' names
        raise click.UsageError(_in_option_names(e)) from None
    except DatasetError as e:
        raise click.UsageError(str(e)) from None


def _sharegpt_with_spares(dataset, dataset_path, input_len, output_len, num_prompts, tokenizer_dir, seed):
    """ShareGPT requests for an export: spares if the file has them, else exactly what was
    asked for (so a shortfall names the number the user asked for)."""
    try:
        return _requests_or_fail(dataset, dataset_path, input_len, output_len, 2 * num_prompts + 10,
                                 tokenizer_dir, seed)
    except click.UsageError:
        return _requests_or_fail(dataset, dataset_path, input_len, output_len, num_prompts, tokenizer_dir, seed)


def _in_the_future(ctx, param, value: float | None) -> float | None:
    """``--start-at``: a wall-clock time still to come."""
    if value is not None and value <= time.time():
        raise click.BadParameter(f"{value:.3f} is {time.time() - value:.1f} s in the past; give a Unix time "
                                 "(epoch s) still to come, e.g. $(date -d '+20 s' +%s.%N)", ctx, param)
    return value


@click.command("load")
@click.option("--url", required=True, help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
@click.option("--model", required=True, help="Served model name.")
@dataset_options(WORKLOAD_KINDS)
@workload_options
@click.option("--request-rate", type=click.FloatRange(min=0, min_open=True), default=float("inf"), show_default=True,
              help="requests/s (above 0); inf = all at once")
@click.option("--arrival", type=click.Choice(["constant", "poisson", "gamma"]), default="poisson", show_default=True)
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="gamma arrivals' shape (above 0): under 1 burstier, 1 Poisson, over 1 smoother")
@click.option("--max-concurrency", type=click.IntRange(min=1))
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True)
@click.option("--per-chunk-usage", is_flag=True,
              help="Ask vLLM for usage in every chunk (exact tokens per chunk; loads its API server).")
@click.option("--client-processes", type=ProcessCount(), default="auto", show_default=True,
              help="Spread the streams over this many client processes (1-64); auto: one per 128 "
                   "requests that can be in flight, at most 8 and half the CPUs.")
@click.option("--start-at", type=float, callback=_in_the_future, metavar="EPOCH_S",
              help="Start the schedule at this wall-clock time (Unix epoch s), not when ready: "
                   "clients given one start send as one load (e.g. `date -d '+20 s' +%s.%N`).")
@click.option("--shared-server", is_flag=True,
              help="Other clients load the server meanwhile on purpose (e.g. several given one --start-at): "
                   "do not hold it against this load when the server's /metrics count more work than it sent.")
@click.option("--request-timeout", "request_timeout_s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="The most one request may take (s).")
@click.option("--idle-timeout", "idle_timeout_s", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Stop the load when the server sends nothing for this long (s) with "
              "requests in flight: a hung server.")
@click.option("--slo", "slo_objectives", multiple=True, metavar="'pNN METRIC <= X ms'",
              help="An objective at a percentile (repeatable), e.g. --slo 'p90 ttft <= 500 ms' --slo "
                   "'p90 tpot <= 50 ms': summary.json gets each one's value and the share of requests "
                   "meeting all (attainment).")
@click.option("--slo-target", type=click.FloatRange(0, 1, min_open=True),
              help="The attainment the SLO asks for (a share; default: the highest percentile / 100).")
@click.option("--energy", "energy_vendor", type=click.Choice(["none", "nvidia", "amd"]), default="none",
              show_default=True, help="Read the energy of this vendor's GPUs on this host during the load "
              "(the server's host: NVML or amdsmi).")
@click.option("--energy-gpus", type=GpuList(), metavar="LIST",
              help="The server's GPUs for --energy, as indices or UUIDs (e.g. 0,1); default: the first "
                   "visible one.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder for requests.jsonl and summary.json.")
def load_cmd(url, model, tokenizer_dir, dataset, dataset_path, input_len, output_len, num_prompts, num_prefixes,
             prefix_len, conversations, think_time_s, max_turns, speedup, block_size,
             request_rate, arrival, burstiness, max_concurrency, ignore_eos, per_chunk_usage, client_processes,
             start_at, shared_server, request_timeout_s, idle_timeout_s, slo_objectives, slo_target, energy_vendor,
             energy_gpus, seed, out_dir):
    """Load an already running server and write requests.jsonl + summary.json.

    Exits 1 when no request completed (the line names the first error, e.g. connection
    refused) or the load was degraded (over 1% of requests failed, one timed out, or the
    server's /metrics count more requests or tokens than this load sent or received:
    another client's, unless --shared-server), 130 on Ctrl-C (the records so far stay in
    requests.jsonl)."""
    slo = _slo_or_fail(slo_objectives, slo_target)
    fields = dict(kind=dataset, path=dataset_path, input_len=input_len, output_len=output_len,
                  num_prefixes=num_prefixes, prefix_len=prefix_len, conversations=conversations,
                  think_time_s=think_time_s, max_turns=max_turns, speedup=speedup, block_size=block_size)
    b, workload = _workload_or_fail(tokenizer_dir, fields, num_prompts=num_prompts, request_rate=request_rate,
                                    arrival=arrival, burstiness=burstiness, max_concurrency=max_concurrency,
                                    client_processes=client_processes, seed=seed)
    cfg = LoadConfig(url.rstrip("/"), model, ignore_eos, max_concurrency, request_timeout_s, idle_timeout_s,
                     per_chunk_usage=per_chunk_usage, start_at=start_at)
    processes = resolve_processes(client_processes, workload.size, max_concurrency)
    header = RepeatHeader(base_url=cfg.base_url, model_id=model, num_prompts=num_prompts, request_rate=request_rate,
                          burstiness=burstiness, max_concurrency=max_concurrency,
                          load_timing=workload.timing(b, request_rate))
    out_dir.mkdir(parents=True, exist_ok=True)
    meter = None
    if energy_vendor != "none":
        meter = EnergyMeter.open(energy_vendor, energy_gpus or server_gpus(energy_vendor, 1))
        if meter.reader is None:
            click.echo(f"warning: {meter.why}; every other metric as usual", err=True)
    with RecordWriter(out_dir / REQUESTS_FILE) as writer:
        try:
            measured = measure_repeat(cfg, workload.requests, workload.offsets(b, request_rate), writer, header,
                                      desc="load", processes=processes, slo=slo, meter=meter,
                                      conversations=workload.conversations, shared_server=shared_server)
        except KeyboardInterrupt:
            click.echo(f"interrupted; records so far in {writer.path}", err=True)
            sys.exit(130)
        finally:
            if meter is not None:
                meter.close()
    summary = measured.summary
    atomic_write_json(out_dir / SUMMARY_FILE, summary.as_json())
    if summary.status == "failed":
        raise click.ClickException(f"all {summary.failed} requests to {cfg.base_url} failed; "
                                   f"first error: {summary.first_error}")
    headline = {k: getattr(summary, k) for k in ("status", "completed", "failed", "request_throughput",
                                                 "output_throughput", "median_ttft_ms", "median_itl_ms")}
    if summary.energy is not None and summary.energy.valid:
        headline["joules_per_output_token"] = summary.energy.joules_per_output_token
    if summary.slo is not None:
        headline["slo_attainment"] = summary.slo.attainment
    click.echo(json.dumps(headline))
    if summary.energy is not None and meter.reader is not None and not summary.energy.valid:
        click.echo(f"warning: the energy reading is not valid (the other metrics are): {summary.energy.note}",
                   err=True)
    if summary.status == "degraded":
        click.echo(f"error: degraded load: {summary.error}", err=True)
        sys.exit(1)
    if summary.failed:
        click.echo(f"warning: {summary.failed} of {workload.size} requests failed (the metrics cover the "
                   f"{summary.completed} that completed); first error: {summary.first_error}", err=True)


@click.command("calibrate")
@click.option("--concurrency", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--requests", "num_requests", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Chunks per request.")
@click.option("--pace-ms", type=click.FloatRange(min=0), default=20.0, show_default=True,
              help="Stub's gap between chunks in the overhead phase.")
@click.option("--client-processes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Client processes sharing the streams (1: pinned to one CPU).")
@click.option("--stub-processes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Stub processes sharing one port, each on its own CPU (more when one stub is the "
                   "bottleneck: ~1,000 paced streams and up).")
@click.option("--url", help="Use a running stub (`attnbench stub-server`) instead of starting one.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def calibrate_cmd(concurrency, num_requests, tokens, pace_ms, client_processes, stub_processes, url, as_json):
    """Measure the load generator's own overhead against a zero-work streaming server."""
    result = calibrate(concurrency, num_requests, tokens, pace_ms, url=url, client_processes=client_processes,
                       stub_processes=stub_processes)
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else "\n".join(result.lines()))


@click.command("stub-server")
@click.option("--port", type=int, required=True)
@click.option("--reuse-port", is_flag=True, help="Share the port with other stub processes (SO_REUSEPORT).")
def stub_server_cmd(port, reuse_port):
    """Run the zero-work streaming server of `calibrate` in the foreground."""
    serve_stub(port, reuse_port)


@click.group("recipes")
def recipes_group():
    """Validate suite files and show what they would run."""


@recipes_group.command("validate")
@click.argument("suite_files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def recipes_validate(suite_files):
    """Check SUITE_FILES; errors name the file, the field and the bad value."""
    bad = 0
    for path in suite_files:
        try:
            suite = load_suite(path)
            check_datasets(suite, suite.runs)
            click.echo(f"ok    {path}: {len(suite.runs)} runs")
        except (RecipeError, PreflightError) as e:
            bad += 1
            click.echo(f"error {e}", err=True)
    if bad:
        sys.exit(1)


FREE_PORT_SHOWN = 1  # a stand-in port number for `recipes show` (printed as PORT)


@recipes_group.command("show")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--only", multiple=True)
@click.option("--models", type=click.Choice(["as-written", "dummy"]), default="as-written", show_default=True)
def recipes_show(suite_file, only, models):
    """Print each run's exact server argv and environment (secret values redacted), and its load."""
    suite = _suite_or_fail(suite_file)
    if models == "dummy":
        suite = suite.with_dummy_models()
    for recipe in suite.select(list(only) or None):
        plan = build_launch(recipe, port=recipe.serve.port or FREE_PORT_SHOWN)
        b = recipe.benchmark
        click.echo(f"# {recipe.name}: {recipe.description}".rstrip(": "))
        click.echo(f"server: {plan.shell_line(None if recipe.serve.port else 'PORT')}")
        if not recipe.serve.port:
            click.echo("port:   PORT is a free port picked when the server starts (serve.port fixes one)")
        if b.knee is None:
            click.echo(f"load:   {b.num_prompts} prompts ({b.dataset.kind}), rate {b.request_rate} req/s "
                       f"({b.arrival}), max concurrency {b.max_concurrency}, ignore_eos {b.ignore_eos}, "
                       f"{b.warmup_requests} warm-up, {b.repeats} repeats, seed {b.seed}")
        else:
            click.echo(f"load:   knee search: up to {b.knee.max_probes} probes of {b.num_prompts} prompts "
                       f"({b.dataset.kind}), a burst then {b.arrival} arrivals at the rates the search picks, to "
                       f"within {b.knee.tolerance:.0%}; max concurrency {b.max_concurrency}, ignore_eos "
                       f"{b.ignore_eos}, {b.warmup_requests} warm-up before each probe, seed {b.seed}")
        if b.slo is not None:
            click.echo(f"slo:    {', '.join(str(o) for o in b.slo.objectives)}; attainment target "
                       f"{b.slo.attainment_target:.0%} of requests")
        click.echo(f"recipe hash: {recipe.digest()}\n")


@click.group("model")
def model_group():
    """Make model folders locally (no model hub)."""


@model_group.command("dummy")
@click.option("--arch", required=True, type=click.Choice(["llama-3.1-8b", "mistral-small-24b", "qwen3-32b", "qwen3-8b"]))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
def model_dummy(arch, out_dir):
    """A real architecture's config.json + a local tokenizer, no weights (serve with load_format: dummy)."""
    click.echo(f"wrote {write_dummy_model(out_dir, arch)} ({arch}, dummy weights: use load_format: dummy)")


@model_group.command("tiny")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
def model_tiny(out_dir, seed):
    """A 2-layer Llama with random weights and a local tokenizer (the CPU demo's model)."""
    click.echo(f"wrote {write_tiny_model(out_dir, seed)}")


@click.group("dataset")
def dataset_group():
    """Prompt sets outside a run."""


@dataset_group.command("export")
@dataset_options(PROMPT_KINDS)
@click.argument("out_file", type=click.Path(dir_okay=False, path_type=Path))
def dataset_export(tokenizer_dir, dataset, dataset_path, input_len, output_len, num_prompts, seed, out_file):
    """Write NUM_PROMPTS prompts as ShareGPT JSON, every one passing vLLM's ShareGPT filter,
    for other clients to send the same prompts (`vllm bench serve --dataset-name sharegpt
    --dataset-path OUT_FILE --num-prompts NUM_PROMPTS`)."""
    # draw spares where the source has them: the few prompts near the filter's limits are left out
    spec_args = (dataset, dataset_path, input_len, output_len)
    drawn = _requests_or_fail(*spec_args, 2 * num_prompts + 10, tokenizer_dir, seed) \
        if dataset != "sharegpt" else _sharegpt_with_spares(*spec_args, num_prompts, tokenizer_dir, seed)
    conversations = to_sharegpt(drawn, LocalTokenizer(tokenizer_dir), seed, limit=num_prompts)
    if len(conversations) < num_prompts:
        raise click.UsageError(f"only {len(conversations)} of {len(drawn)} drawn prompts pass vLLM's "
                               f"ShareGPT filter; ask for fewer (--num-prompts) or other lengths")
    atomic_write_json(out_file, conversations)
    click.echo(f"wrote {out_file}: {len(conversations)} conversations")
