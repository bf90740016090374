"""`attnbench microbench`, `attnbench tune` and `attnbench kernels ...`: the kernel-side commands.

Loaded lazily by the top-level CLI, so client-only commands never import torch; and each
command imports torch and its modules only when it runs, so `--help` stays instant.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import click

from ..schema import L2_FLUSHES
from ..variants import CHOICES, check_variant


def require_device(device: str) -> None:
    """One line instead of torch's assertion when the device is not there."""
    import torch  # lazy: torch (module doc)

    if device.startswith("cuda") and not torch.cuda.is_available():
        build = f"a CPU build of torch {torch.__version__}" if torch.version.cuda is None and torch.version.hip is None \
            else f"torch {torch.__version__} sees no GPU"
        raise click.ClickException(f"--device {device}: no CUDA/ROCm GPU here ({build}); run it on a GPU host, "
                                   "or with --device cpu in Triton's interpreter (TRITON_INTERPRET=1, very slow)")


def _check_impls(suite, impls) -> None:
    """--impl names: any registered implementation (the suite's ``implementations`` are only
    what runs when none is named) or one of the suite's named configs."""
    from . import spec  # lazy, as each command's own import of it (pydantic)

    unknown = [i for i in impls if i not in spec.IMPLEMENTATIONS and i not in suite.configs]
    if unknown:
        raise click.BadParameter(f"{unknown}: expected registered implementations {sorted(spec.IMPLEMENTATIONS)} "
                                 f"or the suite's configs {sorted(suite.configs)}", param_hint="--impl")


@click.command("microbench")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out_csv", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="CSV to append rows to (created with a header if new).")
@click.option("--only", multiple=True, help="Case or sweep name to run (repeatable); default all.")
@click.option("--impl", "impls", multiple=True,
              help="Implementation to time (repeatable): any registered one or a suite config; default the suite's.")
@click.option("--device", default="cuda", show_default=True, help="torch device ('cpu' runs Triton's interpreter).")
@click.option("--l2-flush", type=click.Choice(L2_FLUSHES), default=None,
              help="Override the suite's timing.l2_flush: 'zero' (do_bench's flush, dirty L2), 'read' (clean L2) "
                   "or 'none' (no flush: each call finds its own data in L2 where it fits).")
@click.option("--rounds", type=click.IntRange(1, 10), default=None,
              help="Override the suite's timing.rounds: time a case's implementations in turn this many times, "
                   "each keeping its fastest round.")
@click.option("--resume", is_flag=True,
              help="Run only what --out lacks: each case's implementations without a row there (an error row is "
                   "run again), so an interrupted run, or one on another machine, finishes where it stopped.")
def microbench(suite_file: Path, out_csv: Path, only: tuple[str, ...], impls: tuple[str, ...], device: str,
               l2_flush: str | None, rounds: int | None, resume: bool):
    """Check every implementation against the fp32 reference, then time it (median, p20/p80,
    CUDA-graph replay, % of the roofline measured in the same run)."""
    from .microbench import run_microbench  # lazy: torch (module doc)
    from .spec import SpecError, load_microbench_spec

    try:
        suite = load_microbench_spec(suite_file)
    except SpecError as e:
        raise click.UsageError(str(e)) from None
    require_device(device)
    timing = {k: v for k, v in (("l2_flush", l2_flush), ("rounds", rounds)) if v is not None}
    if timing:
        suite = suite.model_copy(update={"timing": suite.timing.model_copy(update=timing)})
    _check_impls(suite, impls)

    def show(rows):
        for r in rows:
            if r["status"] == "ok":
                graph = f"  graph {r['graph_median_us']:9.1f} us" if r.get("graph_median_us") else ""
                roof = (f"  {r['pct_roofline']:5.1f}% of {r['bound']} floor {r['floor_us']:.1f} us"
                        if r.get("floor_us") else "")
                click.echo(f"{r['case']:<28} {r['implementation']:<16} {r['median_us']:9.1f} us "
                           f"[{r['p20_us']:.1f}, {r['p80_us']:.1f}]{graph}{roof}")
            else:
                click.echo(f"{r['case']:<28} {r['implementation']:<16} {r['status']}: {r['message']}")

    try:
        rows = run_microbench(suite, out_csv, device=device, implementations=list(impls) or None,
                              only=list(only) or None, resume=resume, on_rows=show)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"{out_csv} has every row already (--resume)" if resume and not rows else f"rows appended to {out_csv}")


@click.group("kernels")
def kernels_group():
    """Kernel utilities: ahead-of-time builds (no GPU), the API's host overhead, one case for a profiler."""


@kernels_group.command("compile")
@click.argument("targets", nargs=-1)
def compile_cmd(targets: tuple[str, ...]):
    """Build every kernel for TARGETS (sm_90, sm_100, gfx942, gfx90a) without a GPU."""
    from .aot import TARGETS, main  # lazy: torch and triton (module doc)

    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise click.BadParameter(f"{bad}; expected some of {sorted(TARGETS)}", param_hint="TARGETS")
    raise SystemExit(main(list(targets)))


@kernels_group.command("run")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--case", "case_name", required=True, help="Case of the suite.")
@click.option("--impl", "impl", required=True, help="A registered implementation or one of the suite's named configs.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Launches inside the NVTX range, after one checked run.")
@click.option("--device", default="cuda", show_default=True)
def run_cmd(suite_file: Path, case_name: str, impl: str, repeat: int, device: str):
    """Run one implementation on one case, for a profiler: checked once against the fp32
    reference, then REPEAT launches inside an NVTX range named 'attnbench', e.g.
    `ncu --nvtx --nvtx-include attnbench/ --set full -o prof attnbench kernels run ...`."""
    from .microbench import run_for_profiler  # lazy: torch (module doc)
    from .spec import SpecError, load_microbench_spec

    try:
        suite = load_microbench_spec(suite_file)
    except SpecError as e:
        raise click.UsageError(str(e)) from None
    _check_impls(suite, [impl])
    require_device(device)
    try:
        prepared = run_for_profiler(suite, case_name, impl, device, repeat)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    why = f" ({prepared.why})" if prepared.why else ""
    click.echo(f"{case_name} {impl}: {prepared.kernel} {prepared.config}{why}, checked, then {repeat} launches")


@click.command("tune")
@click.argument("suite_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--space", "space_file", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="YAML search space: variants -> {config field: [values]}.")
@click.option("--rows", "rows_csv", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="CSV of the sweep: written by the sweep, or read with --no-sweep.")
@click.option("--sweep/--no-sweep", default=True, show_default=True,
              help="Measure now, or fit from an earlier sweep's CSV.")
@click.option("--emit", "emit_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the fitted tree as Python here (e.g. kernels/dispatch/tuned_nvidia_h100_80gb_hbm3.py).")
@click.option("--against", "against_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="An emitted tree (e.g. the checked-in kernels/dispatch/tuned_<device>.py) read on the same "
                   "rows: its picks and their sum, to set beside the fitted tree's.")
@click.option("--device-name", default=None, help="Device named in the emitted module (default: this GPU).")
@click.option("--only", multiple=True, help="Case or sweep name to tune on (repeatable).")
@click.option("--max-depth", default=3, show_default=True, help="Depth of the decision tree.")
@click.option("--device", default="cuda", show_default=True)
def tune(suite_file, space_file, rows_csv, sweep, emit_file, against_file, device_name, only, max_depth, device):
    """Sweep kernel configs per case, fit a decision tree, emit it as heuristics code."""
    from ..dispatch.trees import TreeError, load_tree  # lazy: a fitted tree imports its module (module doc)
    from .spec import SpecError, load_microbench_spec
    from .tune import best_per_case, describe_pick, describe_total, emit_python, fit_tree, load_space, module_picks
    from .tune import regret
    from .tune import sweep as run_sweep

    try:
        suite = load_microbench_spec(suite_file)
    except SpecError as e:
        raise click.UsageError(str(e)) from None
    if sweep:
        try:
            space = load_space(space_file)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        require_device(device)
        rows = run_sweep(suite, space, rows_csv, device=device, only=list(only) or None)
    else:
        with open(rows_csv, newline="") as fh:
            rows = list(csv.DictReader(fh))
    for case, r in sorted(best_per_case(rows).items()):
        click.echo(f"{case:<28} {float(r['median_us']):9.1f} us  {r['config']}")
    if emit_file:
        if device_name is None:
            import torch  # lazy: torch (module doc)

            device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        tree, labels = fit_tree(rows, max_depth)
        picks = regret(tree, labels, rows)
        for p in picks:
            click.echo(describe_pick(p))
        click.echo(f"fitted tree: {describe_total(picks)}")
        Path(emit_file).write_text(emit_python(tree, labels, device_name, str(rows_csv), picks))
        click.echo(f"decision tree written to {emit_file}")
    if against_file:
        try:
            choose = load_tree(against_file)
        except TreeError as e:
            raise click.UsageError(f"--against {e}") from None
        picks = module_picks(choose, rows)
        for p in picks:
            click.echo(f"{against_file.name}: {describe_pick(p)}")
        click.echo(f"{against_file.name}: {describe_total(picks)}")


@kernels_group.command("overhead")
@click.option("--variant", "variants", multiple=True, help="Variant (repeatable); default auto and every step.")
@click.option("--calls", type=click.IntRange(min=1), default=2000, show_default=True, help="Calls per timed round.")
@click.option("--device", default="cuda", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON line per case and variant.")
@click.option("--profile", "with_profile", is_flag=True,
              help="Also print where the default call's host time goes (cProfile, top functions).")
def overhead_cmd(variants: tuple[str, ...], calls: int, device: str, as_json: bool, with_profile: bool):
    """Host time of the default `paged_attention` call vs the bare launch of the same config (us)."""
    from .overhead import CASES, measure, profile  # lazy: torch (module doc)

    require_device(device)
    try:
        chosen = [check_variant(v, "--variant") for v in variants] or list(CHOICES)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--variant") from None
    for case in CASES:
        for variant in chosen:
            o = measure(case, variant, device=device, calls=calls)
            click.echo(json.dumps(o.as_dict()) if as_json else
                       f"{case:<16} {variant:<15} API {o.api_us:6.1f} us  bare launch {o.bare_us:6.1f} us  "
                       f"added {o.added_us:5.1f} us   ({o.device})")
            if with_profile:  # on stderr, so that --json stays one JSON line per case
                click.echo(f"--- {case} {variant}: host time of the default call, by function\n"
                           + profile(case, variant, device=device, calls=calls), err=True)
