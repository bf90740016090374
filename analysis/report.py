"""`attnbench plot` / `attnbench report`: every figure that the data supports, and a
Markdown report (tables of runs x metrics, normalized tables, the figures, the
measurement conventions)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.kernels.schema import COMPARATORS
from attnbench.runner.catalogue import ITL, REPORTED, TOKENS_PER_JOULE
from attnbench.runner.recipe import ENGINE_LABELS, KneeSettings

from . import fig9, figures, knee
from .collect import Collected, CollectError, collect_results, collect_vllm_bench, load_microbench
from .knee import collect_knees
from .normalize import CONVENTION, aggregate, metric_columns, normalize, repeat_range, split_experiments

DEFAULT_BASELINES = ("FLEX_ATTENTION", "v0-default", "v0-style")
MICRO_BASELINES = ("vllm_unified", "sdpa", "naive")


@dataclass
class MicroResult:
    name: str  # the CSV's stem; its figures live in out_dir/<name>/
    frame: pd.DataFrame
    figures: list[Path]


@dataclass
class Analysis:
    out_dir: Path
    agg: pd.DataFrame | None = None
    normalized: dict[str, tuple[str, pd.DataFrame]] = field(default_factory=dict)  # suite -> (baseline, frame)
    serving_figures: dict[str, list[Path]] = field(default_factory=dict)  # suite -> files
    micro: list[MicroResult] = field(default_factory=list)
    knees: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per knee run (analysis/knee.py)
    knee_probes: pd.DataFrame = field(default_factory=pd.DataFrame)
    knee_figures: dict[str, list[Path]] = field(default_factory=dict)  # suite -> files
    uncounted: list[str] = field(default_factory=list)  # runs with no repeat in the means: a warning each

    @property
    def figures(self) -> list[Path]:
        return [p for ps in (*self.serving_figures.values(), *self.knee_figures.values()) for p in ps] + \
            [p for m in self.micro for p in m.figures]


def pick_baseline(agg: pd.DataFrame, suite: str, requested: str | None) -> str | None:
    """The requested baseline run if this suite has it, else a FlexAttention run, else a
    V0 default run (``analyze`` has checked that a requested baseline exists somewhere)."""
    runs = agg[agg["suite"] == suite]
    if requested:
        return requested if requested in set(runs["run"]) else None
    flex = runs[runs["attention_backend"] == "FLEX_ATTENTION"]
    if not flex.empty:
        return flex["run"].iloc[0]
    for name in DEFAULT_BASELINES:  # also as included with a prefix (``blog-v0-default``)
        for run in runs["run"]:
            if run == name or run.endswith(f"-{name}"):
                return run
    return None


def analyze(results: list[Path], out_dir: Path, *, microbench: list[Path] = (), vllm_bench: list[Path] = (),
            baseline: str | None = None, micro_baseline: str | None = None, keep_degraded: bool = False) -> Analysis:
    """Collect everything given, draw every figure the data supports (degraded repeats
    count only with ``keep_degraded``)."""
    if not results and not microbench and not vllm_bench:
        raise CollectError("nothing to analyze: give a results directory, --microbench CSV or --vllm-bench JSON")
    out = Analysis(out_dir)
    parts = [collect_results(r) for r in results] + [collect_vllm_bench(p) for p in vllm_bench]
    knee_runs, knee_probes = zip(*(collect_knees(r) for r in results)) if results else ((), ())
    out.knees = pd.concat(knee_runs, ignore_index=True) if knee_runs else pd.DataFrame()
    out.knee_probes = pd.concat(knee_probes, ignore_index=True) if knee_probes else pd.DataFrame()
    for suite in dict.fromkeys(out.knees.get("suite", [])):
        runs, probes = out.knees[out.knees["suite"] == suite], out.knee_probes[out.knee_probes["suite"] == suite]
        out.knee_figures[suite] = knee.figure_curves(runs, probes, out_dir, suite) + \
            knee.figure_backends(runs, out_dir, suite)
    if parts:
        data = Collected.concat(parts)
        searched = data.runs.get("knee", pd.Series(False, index=data.runs.index)).fillna(False).astype(bool)
        data = Collected(data.runs[~searched], data.sources)  # knee probes: their own section
        parts = parts if not data.runs.empty else []
    if parts:
        out.agg = split_experiments(aggregate(data, keep_degraded))
        out.uncounted = _uncounted(data, set(out.agg["run"]))
        if baseline and baseline not in set(out.agg["run"]):
            raise CollectError(f"baseline run {baseline!r} not found; runs are {sorted(set(out.agg['run']))}")
        for suite in dict.fromkeys(out.agg["suite"]):
            drawn = figures.fig_serving_bars(out.agg, out_dir, suite)
            base = pick_baseline(out.agg, suite, baseline)
            if base:
                norm = normalize(out.agg[out.agg["suite"] == suite], base)
                out.normalized[suite] = (base, norm)
                drawn += figures.fig_normalized_bars(norm, out_dir, suite, base)
            if out.agg[out.agg["suite"] == suite]["output_len"].nunique() > 1:  # a latency sweep
                drawn += figures.fig_latency_vs_output_len(out.agg, out_dir, suite)
            out.serving_figures[suite] = drawn
    for csv in microbench:
        mb = load_microbench(csv)
        impls = set(mb["implementation"])
        if micro_baseline and micro_baseline not in impls:
            raise CollectError(f"{csv}: baseline implementation {micro_baseline!r} not found; have {sorted(impls)}")
        mbase = micro_baseline or next((b for b in MICRO_BASELINES if b in impls), sorted(impls)[0])
        sub = out_dir / Path(csv).stem
        drawn = []
        sweep = mb[(mb["group"] != "") & (mb["status"] == "ok")]
        if not sweep.empty:  # the paper's Fig. 6-8 grids; hand-written cases only get the table
            for normalized in (True, False):
                for share in sorted(sweep["decode_share"].astype(float).unique()):
                    drawn += figures.fig_microbench_by_batch(mb, sub, mbase, normalized, share)
                drawn += figures.fig_microbench_by_decode_share(mb, sub, mbase, normalized)
        out.micro.append(MicroResult(Path(csv).stem, mb, drawn))
    return out


def _figure_links(paths: list[Path], report: Path) -> list[str]:
    lines = []
    for p in paths:
        if p.suffix == ".png":
            rel = Path(*p.resolve().parts[len(report.parent.resolve().parts):]) \
                if p.resolve().is_relative_to(report.parent.resolve()) else p.resolve()
            lines += [f"![{p.stem}]({rel})", f"(data: `{rel.with_suffix('.csv')}`)", ""]
    return lines


HEADINGS = {m.name: m.heading for m in REPORTED}  # table headings: "TTFT ms", "output tok/s"


def format_value(value, metric: str = "", ratio: bool = False) -> str:
    """A number as a reader wants it: grouped digits, precision by size and metric
    (tok/s as whole numbers, req/s with 2 decimals, ms with 0-2, energy per token with 3
    significant digits), ratios with 2 decimals."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if ratio:
        return f"{value:.2f}"
    if metric in (TOKENS_PER_JOULE.name, "joules_per_output_token", "net_joules_per_output_token"):
        return f"{value:.3g}"
    if metric == "request_throughput":
        return f"{value:,.2f}" if value >= 0.1 else f"{value:.4f}"
    size = abs(value)
    if float(value).is_integer() and (size >= 1 or value == 0):
        return f"{int(value):,}"
    return f"{value:,.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.2f}"


def _fmt_table(df: pd.DataFrame, ratio: bool = False) -> str:
    cells = {c: [ENGINE_LABELS.get(v, v) if c == "engine" else format_value(v, c, ratio and c in HEADINGS)
                 for v in df[c]] for c in df.columns}
    return pd.DataFrame(cells).rename(columns=HEADINGS).to_markdown(index=False, disable_numparse=True)


def noise_lines(norm: pd.DataFrame, base: str) -> list[str]:
    """Per run and metric: the ratio to the baseline with both runs' repeat-to-repeat
    ranges, and whether the difference is outside them (the ranges do not overlap)."""
    lines = []
    base_rows = norm[norm["run"] == base]
    for _, row in norm[norm["run"] != base].iterrows():
        b = base_rows[base_rows["gpu"] == row["gpu"]]
        if b.empty:
            continue
        b = b.iloc[0]
        parts = []
        for m in metric_columns(norm):
            lo, hi = repeat_range(row, m)
            blo, bhi = repeat_range(b, m)
            if pd.isna(row.get(m)) or pd.isna(lo) or pd.isna(blo):
                continue
            if row.get("repeats", 1) < 2 or b.get("repeats", 1) < 2:
                verdict = "one repeat: spread unknown"
            elif hi < blo or lo > bhi:
                verdict = "outside the spread"
            else:
                verdict = "inside the spread: not a measured difference"
            parts.append(f"{HEADINGS[m]} {row[m]:.2f} [{lo:.2f}-{hi:.2f} vs {blo:.2f}-{bhi:.2f}], {verdict}")
        if parts:
            lines.append(f"- `{row['run']}` vs `{base}` (ratio [its min-max over repeats vs the baseline's]): "
                         + "; ".join(parts) + ".")
    return lines + [""] if lines else []


STOLEN_NOTE_S = 1.0  # CPU seconds stolen from the client's machine in one repeat that earn a note
# `keep_up` below which a repeat's server did not keep up: the knee search's own default bound
FELL_BEHIND = KneeSettings.model_fields["keep_up"].default


def _warnings(s: pd.DataFrame) -> list[str]:
    """Runs whose numbers need a second look: repeats left out of the means (degraded,
    failed, or whose request file is not the one summarized) or kept in although degraded,
    failed requests (left out of the metrics, counted here), kernel compiles during a
    measurement (a latency spike), chunk gaps that are mostly coalesced reads (ITL reads
    low; `figures.headline_itl`), and repeats during which the hypervisor took
    `STOLEN_NOTE_S` or more CPU seconds from the client's machine (on a shared cloud host the
    server's own latencies move with the host's speed), and rated loads the server fell behind
    (`keep_up` under `FELL_BEHIND`: a queue grew, so the latencies depend on how long the
    load ran, not only on its rate)."""
    lines = []
    itl_headline = figures.headline_itl(s)
    if itl_headline is not ITL:
        worst = s.loc[s["coalesced_chunks"].idxmax()]
        lines.append(f"- **note**: up to {worst['coalesced_chunks']:.0%} of chunk gaps were coalesced (`{worst['run']}`: "
                     "chunks read together, a 0 ms gap by vLLM's ITL definition), so ITL reads low here; the "
                     f"figures draw {itl_headline.short} as the headline latency instead.")
    sessions = sorted({x for v in s.get("sessions", []) if isinstance(v, list) for x in v})
    if len(sessions) > 1:
        by_session = {x: [r["run"] for _, r in s.iterrows() if x in (r.get("sessions") or [])] for x in sessions}
        lines.append(f"- **note**: these results come from {len(sessions)} sessions of `attnbench run`: " + "; ".join(
            f"{x}: {', '.join(f'`{run}`' for run in runs)}" for x, runs in by_session.items()))
    for _, row in s.iterrows():
        if row.get("left_out"):
            lines.append(f"- **warning**: `{row['run']}`: left out of its means: {row['left_out']} "
                         "(`attnbench run --resume` measures them again).")
        if row.get("degraded_kept", 0):
            lines.append(f"- **warning**: `{row['run']}`: {int(row['degraded_kept'])} degraded repeat(s) counted "
                         "in its means (--keep-degraded).")
        if row.get("failed", 0):
            lines.append(f"- **warning**: `{row['run']}`: {int(row['failed'])} requests failed over its "
                         f"repeats; its metrics cover only the completed ones.")
        stolen = row.get("host_steal_s_max")
        if stolen is not None and not pd.isna(stolen) and stolen >= STOLEN_NOTE_S:
            lines.append(f"- **note**: `{row['run']}`: the hypervisor took {row['host_steal_s_min']:.1f}-{stolen:.1f} "
                         "CPU seconds from the client's machine per repeat (steal, /proc/stat): on a shared host "
                         "the server's latencies move with it; compare repeats' `host_steal_s` before reading "
                         "their difference.")
        if row.get("energy_left_out"):
            lines.append(f"- **warning**: `{row['run']}`: energy not valid in {row['energy_left_out']} (its other "
                         f"metrics count; its energy is the mean of the {int(row.get('energy_repeats', 0))} "
                         "valid repeat(s)).")
        behind = row.get("keep_up_min")
        if behind is not None and not pd.isna(behind) and behind < FELL_BEHIND:
            lines.append(f"- **warning**: `{row['run']}`: the server fell behind its arrivals "
                         f"(r{int(row['keep_up_repeat'])} completed {behind:.0%} of the requests that arrived in the load's second half; `keep_up`): "
                         "a queue grew, so its latencies grow with the load's length, not only its rate.")
        if row.get("jit_compiles", 0):
            lines.append(f"- **warning**: `{row['run']}`: the server logged {int(row['jit_compiles'])} kernel "
                         "compile(s) during measurement (vLLM's JIT monitor): a latency spike inside the numbers.")
    return lines + [""] if lines else []


def _slo_lines(s: pd.DataFrame) -> list[str]:
    """The objectives behind the SLO column, per set of runs that share them."""
    if "slo" not in s or s["slo"].isna().all():
        return []
    lines = [f"- SLO {slo} for {', '.join(f'`{r}`' for r in g['run'])}: the SLO % column is the share of "
             "requests that completed within every objective (runner/slo.py)."
             for slo, g in s.groupby("slo", sort=False)]
    return lines + [""]


ENERGY_HEADINGS = {"run": "run", "energy_repeats": "repeats", TOKENS_PER_JOULE.name: "output tok/J",
                   "joules_per_output_token": "J/tok", "net_joules_per_output_token": "J/tok net of idle",
                   "joules_per_request": "J/request", "mean_power_w": "mean W", "peak_power_w": "peak W",
                   "idle_power_w": "idle W", "counter_vs_samples": "counter vs samples (worst)"}


def _turn_table(s: pd.DataFrame) -> list[str]:
    """A multi-turn load's median TTFT (ms) per user turn, per run (means over repeats):
    each later turn sends the history before it, which a prefix cache serves."""
    turns = [c for c in s if c.startswith("ttft_turn_") and s[c].notna().any()]
    if not turns:
        return []
    t = s[["run", *turns]][s[turns].notna().any(axis=1)]
    cells = {c: [format_value(v) for v in t[c]] for c in t.columns}
    headings = {c: f"turn {c.split('_')[2]}" for c in turns}
    return ["Median TTFT (ms) by turn of the multi-turn runs (turn k sends turns 1..k-1 and their answers "
            "before it):", "", pd.DataFrame(cells).rename(columns=headings).to_markdown(index=False,
                                                                                       disable_numparse=True), ""]


def _timing_lines(s: pd.DataFrame) -> list[str]:
    """How each run's load was timed (runner/workload.py), where not every run's is a schedule."""
    if "load_timing" not in s or not any(str(v).startswith(("trace", "closed")) for v in s["load_timing"]):
        return []
    return [f"- `{r.run}`: {r.load_timing}." for r in s.itertuples() if r.load_timing] + [""]


def _energy_table(s: pd.DataFrame) -> list[str]:
    """The GPUs' energy per run, where measured (`runner.energy`; means over valid repeats)."""
    if TOKENS_PER_JOULE.name not in s or s[TOKENS_PER_JOULE.name].isna().all():
        return []
    t = s[[c for c in ENERGY_HEADINGS if c in s]].copy()
    if "counter_vs_samples" in t:
        t["counter_vs_samples"] = [f"{v:+.1%}" if pd.notna(v) else "-" for v in t["counter_vs_samples"]]
    cells = {c: [format_value(v, c) for v in t[c]] for c in t.columns}
    return ["Energy of the server's GPUs over the load (counter where the GPUs have one; idle: their power "
            "right before the load, server waiting; net: energy - idle power x duration):", "",
            pd.DataFrame(cells).rename(columns=ENERGY_HEADINGS).to_markdown(index=False, disable_numparse=True), ""]


ENGINE_HEADINGS = {"run": "run", "mean_e2el_ms": "client E2EL ms", "server_e2el_ms": "server E2EL ms",
                   "engine_e2el_ms": "in the engine ms", "outside_engine_ms": "outside the engine ms",
                   "mean_itl_ms": "client ITL ms", "engine_itl_ms": "engine ITL ms"}


def _engine_table(s: pd.DataFrame) -> list[str]:
    """Where a request's time went, by vLLM's own clocks beside the client's (means over
    requests and repeats; `collect._engine_columns`), where the server had /metrics."""
    if "outside_engine_ms" not in s or s["outside_engine_ms"].isna().all():
        return []
    t = s[[c for c in ENGINE_HEADINGS if c in s]]
    cells = {c: [format_value(v, c) for v in t[c]] for c in t.columns}
    return ["Where a request's time went (means over requests): the client's E2EL and ITL beside vLLM's own "
            "(its /metrics around each repeat). In the engine: queued + prefill + decode, stamped by the engine "
            "core; outside the engine: the rest of the server's E2EL, spent in the API server (tokenizing, then "
            "detokenizing and streaming the outputs). Latencies that differ between runs outside the engine "
            "only are not the attention backend's:", "",
            pd.DataFrame(cells).rename(columns=ENGINE_HEADINGS).to_markdown(index=False, disable_numparse=True), ""]


def _fig9_tables(s: pd.DataFrame) -> list[str]:
    """Paper Fig. 9: % of FA3 per line and length, and the paper's claims beside ours."""
    table = fig9.sweep_table(s)
    pct = fig9.percent_of_reference(table)
    if pct is None:
        return []
    cells = pct.apply(lambda col: col.map(lambda v: "-" if pd.isna(v) else f"{v:.1f}"))
    cells.columns = [f"{c:,}" for c in pct.columns]
    lines = ["% of FA3 performance (FA3's latency / the line's latency x 100; output tokens across; "
             "-: not measured):", "", cells.reset_index().to_markdown(index=False, disable_numparse=True), ""]
    claim_rows = fig9.claims(table)
    lines += ["The paper's Fig. 9 claims (H100) beside this run:", "",
              claim_rows.to_markdown(index=False), ""]
    steps = fig9.decode_steps(table)
    lines += ["Decode steps (ITL, ms) in each line's longest request: the median over its first and "
              "its last tenth, and p20-p80 over all of it. A step bound by the GPU grows with the "
              "context it attends to; one bound by the host (an eager attention's kernels launched one "
              "by one) stays near the host's floor and carries the host's jitter.", "",
              steps.to_markdown(index=False, floatfmt=".2f"), ""]
    return lines


REFERENCE_IMPL, AUTO_IMPL = "fa3", "auto"
NOT_OURS = {*COMPARATORS, AUTO_IMPL}  # implementations that are not one of the package's own kernels
AUTO_SLACK = 1.03  # `auto` this much slower than the package's best kernel for a case is flagged


def against_fa3_and_best(mb: pd.DataFrame) -> list[str]:
    """Per case: `auto` over FA3 on the same paged cache, and over the fastest of the
    package's own kernels (its steps, Hopper kernels and named configs) for that case, with
    the rule that chose `auto`'s config where the CSV has it (``why``); then
    the geometric mean and the worst of each over the cases, the cases where `auto` trails
    the package's best by more than 3%, and every case where one of ours did not run
    correctly. Nothing when the CSV has no `auto` rows."""
    ok = mb[mb["status"] == "ok"]
    if AUTO_IMPL not in set(ok["implementation"]):
        return []
    times = ok.pivot_table(index="case", columns="implementation", values="latency_us", aggfunc="min", sort=False)
    auto_rows = ok[ok["implementation"] == AUTO_IMPL].set_index("case")
    ran = auto_rows["kernel"]
    why = auto_rows["why"].fillna("") if "why" in auto_rows else pd.Series(dtype=str)  # CSVs since 2026-11-27
    ours = [c for c in times.columns if c not in NOT_OURS]
    configs = ok.drop_duplicates(["case", "implementation"]).set_index(["case", "implementation"])["config"]
    rows, vs_fa3, vs_best, same_config = [], {}, {}, {}
    for case, t in times.iterrows():
        auto = t.get(AUTO_IMPL)
        if pd.isna(auto):
            continue
        best_name = t[ours].idxmin() if ours and t[ours].notna().any() else None
        best = t[best_name] if best_name else float("nan")
        fa3 = t.get(REFERENCE_IMPL, float("nan"))
        if not pd.isna(fa3):
            vs_fa3[case] = auto / fa3
        if best_name:
            vs_best[case] = auto / best
            if _same_launch(configs.get((case, AUTO_IMPL)), configs.get((case, best_name))):
                same_config[case] = best_name
        rows.append({"case": case, "auto us": auto, "auto ran": ran.get(case, ""), "fa3 us": fa3,
                     "auto / fa3": vs_fa3.get(case, float("nan")), "package's best": best_name or "-",
                     "best us": best, "auto / best": vs_best.get(case, float("nan")),
                     **({"why auto chose it": why.get(case, "")} if len(why) else {})})
    lines = ["`auto` against FA3 and against the package's best kernel for each case (latency ratios: "
             "below 1 is faster):", "", pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"), ""]
    for name, ratios in (("FA3", vs_fa3), ("the package's best kernel", vs_best)):
        if ratios:
            worst = max(ratios, key=ratios.get)
            geomean = float(np.exp(np.mean(np.log(list(ratios.values())))))
            lines.append(f"- `auto` / {name} over {len(ratios)} cases: geomean {geomean:.3f}x, "
                         f"worst {ratios[worst]:.3f}x (`{worst}`).")
    slow = {c: r for c, r in vs_best.items() if r > AUTO_SLACK}

    def slow_case(case: str, ratio: float) -> str:
        same = (f"; auto ran `{same_config[case]}`'s config, so this is two timings of one launch"
                if case in same_config else "")
        return f"`{case}` ({ratio:.3f}x{same})"

    lines.append(f"- `auto` more than {AUTO_SLACK - 1:.0%} slower than the package's best kernel: "
                 + (", ".join(slow_case(c, r) for c, r in sorted(slow.items(), key=lambda kv: -kv[1]))
                    if slow else "none") + ".")
    failed = mb[~mb["implementation"].isin(COMPARATORS) & mb["status"].isin(["error", "mismatch"])]
    if not failed.empty:
        lines.append("- ours that did not run correctly: " + "; ".join(
            f"`{r.case}` {r.implementation}: {r.status} ({str(r.message)[:120]})" for r in failed.itertuples()) + ".")
    return lines + [""]


def _same_launch(auto_config, best_config) -> bool:
    """Whether two rows' ``config`` (the JSON of the launch config, blank for a comparator)
    name the same launch: then `auto` and that kernel ran the same code on the same batch."""
    if not (isinstance(auto_config, str) and auto_config and isinstance(best_config, str) and best_config):
        return False
    return json.loads(auto_config) == json.loads(best_config)


def _uncounted(data: Collected, counted_runs: set[str]) -> list[str]:
    """A warning for each run none of whose repeats is in the means (every one failed,
    degraded, damaged or unfinished): it has no row in the tables, so it is named here."""
    lines = []
    for run, g in data.runs[~data.runs["run"].isin(counted_runs)].groupby("run", sort=False):
        repeats = ", ".join(f"r{r.repeat} {r.status}" for r in g.sort_values("repeat").itertuples())
        lines.append(f"- **warning**: `{run}`: no repeat counted ({repeats}); it is in no table or figure "
                     "(`attnbench run --resume` measures it again).")
    return lines


def write_report(analysis: Analysis, path: Path, notes: tuple[str, ...] = ()) -> Path:
    """One Markdown report: provenance, tables, figures, conventions; ``notes`` (lines the
    caller adds, such as where archived records are) under the title."""
    lines = ["# attnbench report", "", f"Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.", ""]
    lines += [f"{note}" for note in notes] + ([""] if notes else [])
    lines += ["## Conventions", "",
              "- TTFT: first streamed chunk minus send time; ITL: gap between chunks (one sample per "
              "chunk); TPOT: (E2EL - TTFT) / (output tokens - 1); E2EL: last chunk minus send time "
              "(the definitions of `vllm bench serve`).",
              "- Throughput: tokens (input + output for total) over the load's duration, warm-ups excluded.",
              f"- Aggregation over repeats: {CONVENTION}.",
              "- Normalized tables divide by the baseline run on the same GPU.", ""]
    lines += analysis.uncounted + ([""] if analysis.uncounted else [])
    if analysis.agg is not None:
        agg = analysis.agg
        for suite in dict.fromkeys(agg["suite"]):
            s = agg[agg["suite"] == suite]
            lines += [f"## {suite}", "", f"{figures.footnote(s)}", ""]
            cols = ["run", "repeats", "engine", "attention_backend", "graph_mode", "cuda_graphs"] \
                + metric_columns(s) + ["failed"]
            lines += [_fmt_table(s[[c for c in cols if c in s]]), ""]
            lines += _slo_lines(s)
            lines += _timing_lines(s)
            lines += _turn_table(s)
            lines += _energy_table(s)
            lines += _engine_table(s)
            lines += _warnings(s)
            if s["output_len"].nunique() > 1:
                lines += _fig9_tables(s)
            if suite in analysis.normalized:
                base, norm = analysis.normalized[suite]
                lines += [f"Normalized to `{base}`:", "",
                          _fmt_table(norm[["gpu", "run"] + metric_columns(norm)], ratio=True), ""]
                lines += noise_lines(norm, base)
            lines += _figure_links(analysis.serving_figures.get(suite, []), path)
    for suite in dict.fromkeys(analysis.knees.get("suite", [])):
        lines += [f"## {suite}: the SLO knee", "", f"{figures.footnote(analysis.knees[analysis.knees['suite'] == suite])}",
                  "", *knee.table_lines(analysis.knees[analysis.knees["suite"] == suite])]
        lines += _figure_links(analysis.knee_figures.get(suite, []), path)
    for micro in analysis.micro:
        mb = micro.frame
        ok = mb[mb["status"] == "ok"]
        lines += [f"## Microbenchmark: {micro.name}", "", figures.micro_footnote(mb), ""]
        if not ok.empty:
            pivot = ok.pivot_table(index="case", columns="implementation", values="latency_us", sort=False)
            lines += ["Median latency (us; the better of eager and CUDA graph where both were timed):", "",
                      pivot.reset_index().to_markdown(index=False, floatfmt=".1f"), ""]
        lines += against_fa3_and_best(mb)
        not_ok = mb[mb["status"] != "ok"]
        if not not_ok.empty:
            lines += [f"{len(not_ok)} rows not timed: " + ", ".join(
                f"{k} x{v}" for k, v in not_ok["status"].value_counts().items()), ""]
        lines += _figure_links(micro.figures, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
