"""The SLO knee of each backend (runs with ``benchmark.knee``; runner/knee.py), read from
the runs' knee.json files.

* `collect_knees`: one row per knee run (its search's result, serve settings, provenance)
  and one per probe (`probes`);
* `table_lines`: the report's table: knee rate, bracket, probes, whether it converged,
  how well the server kept up at the knee (`metrics.keep_up`), output throughput and tokens
  per joule at the burst and at the knee, the verdict;
* `figure_curves`: SLO attainment and goodput against the offered rate, one line per run,
  the target and each knee marked;
* `figure_backends`: per run side by side: output throughput at the burst, the knee rate,
  and output tokens per joule at the burst and at the knee.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.runner.knee import KNEE_FILE, KneeResult

from .collect import _provenance_columns, _serve_settings, _suite_dirs, read_record, run_meta
from .plotting import OKABE_ITO, add_footnote, footnote, plt, save_figure, skip


def collect_knees(root: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, probes) of every knee run under a results root or suite folder; empty frames
    where there is none."""
    root = Path(root)
    runs, probes = [], []
    for suite_dir in _suite_dirs(root) if root.is_dir() else []:
        for path in sorted(suite_dir.glob(f"*/{KNEE_FILE}")):
            result = read_record(path, KneeResult, "knee.json")
            recipe, prov = run_meta(path.parent)
            key = {"suite": suite_dir.name, "run": result.run}
            burst = result.probes[0] if result.probes else None
            at_knee = next((p for p in result.probes if p.rate == result.knee_rate), None)
            runs.append({**key, **_serve_settings(recipe), **_provenance_columns(prov, recipe),
                         "slo": ", ".join(result.slo), "target": result.target, "probes": len(result.probes),
                         "knee_rate": result.knee_rate, "upper_rate": result.upper_rate,
                         "converged": result.converged, "verdict": result.verdict,
                         "burst_output_throughput": burst.output_throughput if burst else None,
                         "burst_request_throughput": burst.request_throughput if burst else None,
                         "burst_tokens_per_joule": burst.output_tokens_per_joule if burst else None,
                         "knee_attainment": at_knee.attainment if at_knee else None,
                         "knee_keep_up": at_knee.keep_up if at_knee else None,
                         "knee_output_throughput": at_knee.output_throughput if at_knee else None,
                         "knee_tokens_per_joule": at_knee.output_tokens_per_joule if at_knee else None})
            probes += [{**key, **p.model_dump()} for p in result.probes]
    return pd.DataFrame(runs), pd.DataFrame(probes)


def _fmt(v, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table_lines(runs: pd.DataFrame) -> list[str]:
    """The knee table of one suite, and each run's verdict."""
    head = ("| run | backend | probes | knee req/s | fails at req/s | converged | kept up at the knee "
            "| burst output tok/s | knee output tok/s | burst tok/J | knee tok/J |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for _, r in runs.iterrows():
        lines.append(f"| {r['run']} | {r['attention_backend']} | {r['probes']} | {_fmt(r['knee_rate'], '.3g')} | "
                     f"{_fmt(r['upper_rate'], '.3g')} | {'yes' if r['converged'] else 'no'} | "
                     f"{_fmt(r['knee_keep_up'], '.0%')} | {_fmt(r['burst_output_throughput'], ',.0f')} | "
                     f"{_fmt(r['knee_output_throughput'], ',.0f')} | {_fmt(r['burst_tokens_per_joule'], '.3g')} | "
                     f"{_fmt(r['knee_tokens_per_joule'], '.3g')} |")
    slos = sorted(set(runs["slo"]))
    lines += ["", *(f"- SLO: {slo}, met by {runs[runs['slo'] == slo]['target'].iloc[0]:.0%} of requests "
                    "(the knee: the highest offered rate measured where it held)." for slo in slos)]
    lines += [f"- `{r['run']}`: {r['verdict']}." for _, r in runs.iterrows()]
    return lines + [""]


def _offered(probes: pd.DataFrame) -> np.ndarray:
    """Each probe's offered rate; the burst's (inf) drawn at the rate it completed."""
    return np.where(np.isinf(probes["rate"].astype(float)), probes["request_throughput"], probes["rate"])


def figure_curves(runs: pd.DataFrame, probes: pd.DataFrame, out_dir: Path, suite: str) -> list[Path]:
    """SLO attainment (%) and goodput (req/s) against the offered rate, per run."""
    name = f"{suite}-knee"
    if probes.empty or probes["attainment"].isna().all():
        return skip(name, f"no knee probes for suite {suite!r}")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for i, (_, run) in enumerate(runs.iterrows()):
        p = probes[probes["run"] == run["run"]].assign(offered=lambda d: _offered(d)).sort_values("offered")
        colour, label = OKABE_ITO[i % len(OKABE_ITO)], f"{run['run']} ({run['attention_backend']})"
        burst = np.isinf(p["rate"].astype(float))
        for ax, col, scale in ((axes[0], "attainment", 100.0), (axes[1], "goodput", 1.0)):
            # the rated probes as a curve; the burst (no rate of its own) as a lone mark, not joined
            ax.plot(p.loc[~burst, "offered"], p.loc[~burst, col] * scale, "o-", color=colour, label=label,
                    markersize=4)
            ax.plot(p.loc[burst, "offered"], p.loc[burst, col] * scale, "x", color=colour, markersize=9)
            if pd.notna(run["knee_rate"]):
                at = p[p["rate"] == run["knee_rate"]]
                ax.plot(at["offered"], at[col] * scale, "*", color=colour, markersize=16, markeredgecolor="black")
    for target in sorted(set(runs["target"])):
        axes[0].axhline(target * 100, color="black", linestyle="--", linewidth=0.8)
    axes[0].set_ylabel("SLO attainment (% of requests)")
    axes[1].set_ylabel("goodput (requests within the SLO / s)")
    for ax in axes:
        ax.set_xlabel("offered request rate (req/s; x: the burst, at the rate it completed)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{suite}: SLO attainment and goodput against load (star: the knee; dashed: the target)")
    add_footnote(fig, f"{footnote(runs)}\nSLO: {'; '.join(sorted(set(runs['slo'])))}")
    cols = ["run", "repeat", "rate", "status", "attainment", "holds", "goodput", "request_throughput",
            "output_throughput", "output_tokens_per_joule"]
    return save_figure(fig, probes[[c for c in cols if c in probes]], out_dir, name)


def figure_backends(runs: pd.DataFrame, out_dir: Path, suite: str) -> list[Path]:
    """Per run: output tok/s at the burst, the knee (req/s), output tok/J at burst and knee."""
    name = f"{suite}-knee-backends"
    if runs.empty:
        return skip(name, f"no knee runs for suite {suite!r}")
    panels = [("burst_output_throughput", "output tok/s at a burst"), ("knee_rate", "knee (req/s within the SLO)")]
    energy = runs[["burst_tokens_per_joule", "knee_tokens_per_joule"]].notna().any().any()
    fig, axes = plt.subplots(1, 3 if energy else 2, figsize=(13 if energy else 9, 4.2))
    x = np.arange(len(runs))
    colours = [OKABE_ITO[i % len(OKABE_ITO)] for i in range(len(runs))]
    labels = [f"{r}\n{b}" for r, b in zip(runs["run"], runs["attention_backend"])]
    for ax, (col, ylabel) in zip(axes, panels):
        ax.bar(x, runs[col].astype(float).fillna(0), color=colours, edgecolor="black", linewidth=0.5)
        ax.set_ylabel(ylabel)
    if energy:
        width = 0.38
        axes[2].bar(x - width / 2, runs["burst_tokens_per_joule"].astype(float).fillna(0), width, color=colours,
                    edgecolor="black", linewidth=0.5, label="at a burst")
        axes[2].bar(x + width / 2, runs["knee_tokens_per_joule"].astype(float).fillna(0), width, color=colours,
                    edgecolor="black", linewidth=0.5, hatch="//", label="at the knee")
        axes[2].set_ylabel("output tokens per joule (tok/J)")
        axes[2].set_ylim(top=axes[2].get_ylim()[1] * 1.2)  # room for the legend above the bars
        axes[2].legend(fontsize=8, loc="upper center", ncol=2)
    for ax in axes:
        ax.set_xticks(x, labels, rotation=30, ha="right", rotation_mode="anchor", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{suite}: throughput, knee{' and energy' if energy else ''} per backend")
    add_footnote(fig, f"{footnote(runs)}\nSLO: {'; '.join(sorted(set(runs['slo'])))}; a missing knee bar: "
                      "none found (report)")
    cols = ["run", "attention_backend", "burst_output_throughput", "knee_rate", "upper_rate", "converged",
            "burst_tokens_per_joule", "knee_tokens_per_joule"]
    return save_figure(fig, runs[cols], out_dir, name)
