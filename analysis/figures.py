"""The seed documents' figures, one function each (matplotlib, Okabe-Ito colours).

Every figure is written as PNG and SVG with the data it plots as CSV beside it, carries
units on its axes, a title and a footnote built from provenance (GPU, model, vLLM, date)
and the error-bar convention. A figure whose data is missing is skipped with a warning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.runner.catalogue import (COALESCED_HEADLINE_LIMIT, ITL, PREFIX_CACHE_HIT, TOKENS_PER_JOULE,
                                        TOTAL_TOKEN_THROUGHPUT, TPOT, TTFT)
from attnbench.runner.recipe import ENGINE_LABELS

from . import fig9
from .normalize import CONVENTION
from .plotting import OKABE_ITO, add_footnote, footnote, micro_footnote, plt, save_figure, skip

def headline_itl(df: pd.DataFrame):
    """ITL, or TPOT where coalesced chunks dominate some run of ``df``
    (`catalogue.COALESCED_HEADLINE_LIMIT`)."""
    share = df["coalesced_chunks"].max() if "coalesced_chunks" in df else 0.0
    return TPOT if share >= COALESCED_HEADLINE_LIMIT and TPOT.name in df else ITL


def run_label(row) -> str:
    """A run's name, with "V0-style settings on V1" under runs that are not the V0 engine
    but V0's scheduler settings on V1 (so no reader takes them for V0)."""
    engine = row.get("engine")
    return f"{row['run']}\n({ENGINE_LABELS[engine]})" if engine == "v0-style" else str(row["run"])


def _bar_panel(ax, df: pd.DataFrame, col: str, scale: float, ylabel: str):
    x = np.arange(len(df))
    vals = df[col].to_numpy(float) * scale
    lo = df.get(f"{col}_lo", pd.Series(np.nan, index=df.index)).to_numpy(float) * scale
    hi = df.get(f"{col}_hi", pd.Series(np.nan, index=df.index)).to_numpy(float) * scale
    err = np.vstack([np.clip(vals - lo, 0, None), np.clip(hi - vals, 0, None)])
    colors = [OKABE_ITO[i % len(OKABE_ITO)] for i in range(len(df))]
    # yerr as lists: matplotlib's check of an array's first row warns when a panel has one bar
    ax.bar(x, vals, color=colors, yerr=np.nan_to_num(err).tolist(), capsize=4, edgecolor="black", linewidth=0.5)
    ax.set_xticks(x, [run_label(row) for _, row in df.iterrows()], rotation=30, ha="right",
                  rotation_mode="anchor", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def measured(df: pd.DataFrame, metric) -> bool:
    """Some row of ``df`` has a value of ``metric``."""
    return metric.name in df and df[metric.name].notna().any()


def fig_serving_bars(agg: pd.DataFrame, out_dir: Path, suite: str) -> list[Path]:
    """Blog Fig. 8-10: total token throughput (tok/s), TTFT (s), ITL (ms) per configuration
    (TPOT instead of ITL where coalesced chunks dominate: `headline_itl`), and output
    tokens per joule where the GPUs' energy was measured, and the prefix-cache hit rate
    where the server counted one (prefix caching on)."""
    name = f"{suite}-serving"
    df = agg[agg["suite"] == suite]
    panels = [(TOTAL_TOKEN_THROUGHPUT, 1.0, None), (TTFT, 1e-3, "s"), (headline_itl(df), 1.0, None)]
    needed = [m.name for m, _, _ in panels]  # (metric, scale, unit) each
    if df.empty or any(c not in df or df[c].isna().all() for c in needed):
        return skip(name, f"needs {needed} for suite {suite!r}")
    extras = [m for m in (PREFIX_CACHE_HIT, TOKENS_PER_JOULE) if measured(df, m)]
    panels += [(m, 1.0, None) for m in extras]
    needed += [m.name for m in extras]
    also = " and ".join({PREFIX_CACHE_HIT: "prefix-cache hits", TOKENS_PER_JOULE: "energy"}[m] for m in extras)
    for gpu, g in df.groupby("gpu", sort=False):
        fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) - 0.2, 4.2))
        for ax, (metric, scale, unit) in zip(axes, panels):
            _bar_panel(ax, g, metric.name, scale, metric.axis(unit))
        fig.suptitle(f"{suite}: throughput, latency{', ' + also if also else ''} per configuration")
        add_footnote(fig, f"{footnote(g)}\n{CONVENTION}")
        cols = ["gpu", "run", "repeats"] + [c for m in needed for c in (m, f"{m}_lo", f"{m}_hi") if c in g]
        return save_figure(fig, g[cols], out_dir, name)  # one GPU per suite run
    return []


def fig_normalized_bars(norm: pd.DataFrame, out_dir: Path, suite: str, baseline: str) -> list[Path]:
    """Talk: end-to-end bars normalized to a baseline backend, one panel per GPU."""
    name = f"{suite}-normalized"
    df = norm[norm["suite"] == suite]
    metrics = [(m.name, m.ratio_label) for m in (TOTAL_TOKEN_THROUGHPUT, TTFT, headline_itl(df), TOKENS_PER_JOULE)]
    metrics = [(m, label) for m, label in metrics if m in df and not df[m].isna().all()]
    if df.empty or not metrics:
        return skip(name, f"no normalized data for suite {suite!r}")
    gpus = list(dict.fromkeys(df["gpu"]))
    fig, axes = plt.subplots(1, len(gpus), figsize=(5.5 * len(gpus) + 2, 4.2), squeeze=False)
    runs = list(dict.fromkeys(df["run"]))
    width = 0.8 / len(runs)
    for ax, gpu in zip(axes[0], gpus):
        g = df[df["gpu"] == gpu].set_index("run")
        for i, run in enumerate(runs):
            if run not in g.index:
                continue
            row = g.loc[run]
            vals = np.array([row[m] for m, _ in metrics], float)
            lo = np.array([row.get(f"{m}_lo", np.nan) for m, _ in metrics], float)
            hi = np.array([row.get(f"{m}_hi", np.nan) for m, _ in metrics], float)
            err = np.nan_to_num(np.vstack([np.clip(vals - lo, 0, None), np.clip(hi - vals, 0, None)]))
            ax.bar(np.arange(len(metrics)) + i * width, vals, width, yerr=err, capsize=3, label=run,
                   color=OKABE_ITO[i % len(OKABE_ITO)], edgecolor="black", linewidth=0.5)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(np.arange(len(metrics)) + width * (len(runs) - 1) / 2, [label for _, label in metrics])
        ax.set_ylabel(f"relative to {baseline} (= 1)")
        ax.set_title(gpu, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{suite}: normalized to {baseline} (throughput: higher is better; latency: lower)")
    add_footnote(fig, f"{footnote(df)}\n{CONVENTION}")
    cols = ["gpu", "run"] + [c for m, _ in metrics for c in (m, f"{m}_lo", f"{m}_hi") if c in df]
    return save_figure(fig, df[cols], out_dir, name)


def fig_latency_vs_output_len(agg: pd.DataFrame, out_dir: Path, suite: str) -> list[Path]:
    """Paper Fig. 9: end-to-end latency vs output length, one line per backend and kernel
    step, and the % of FA3 panel when FLASH_ATTN ran (`fig9`)."""
    name = f"{suite}-latency-vs-output"
    df = agg[(agg["suite"] == suite) & agg["output_len"].notna()] if "output_len" in agg else agg.iloc[0:0]
    if df.empty or df["output_len"].nunique() < 2 or "e2el" not in df:
        return skip(name, f"suite {suite!r} has no runs that differ in output length")
    return fig9.figure(fig9.sweep_table(df), out_dir, suite, footnote(df))


def _micro_ok(mb: pd.DataFrame) -> pd.DataFrame:
    return mb[(mb["status"] == "ok") & (mb["group"] != "")].copy()


def _micro_panels(ok: pd.DataFrame, panel_col: str, x_col: str, baseline: str, normalized: bool,
                  panel_label, x_label: str, title: str, out_dir: Path, name: str) -> list[Path]:
    panels = sorted(ok[panel_col].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 1.5, 4), squeeze=False)
    impls = list(dict.fromkeys(ok["implementation"]))
    plotted = []
    for ax, panel in zip(axes[0], panels):
        p = ok[ok[panel_col] == panel].sort_values(x_col)
        base = p[p["implementation"] == baseline]
        scale = base["latency_us"].iloc[0] if normalized and not base.empty else 1.0
        for i, impl in enumerate(impls):
            g = p[p["implementation"] == impl]
            if g.empty:
                continue
            y = g["latency_us"] / scale
            ax.plot(g[x_col], y, marker="o", markersize=3, linewidth=1, label=impl,
                    color=OKABE_ITO[i % len(OKABE_ITO)])
            plotted.append(g.assign(panel=panel, y=y.to_numpy()))
        if not normalized and "floor_us" in p and p["floor_us"].notna().any():
            floor = p.groupby(x_col)["floor_us"].first()
            ax.plot(floor.index, floor.to_numpy(), color="black", linestyle="--", label="roofline floor")
        ax.set_xscale("log", base=2 if x_col == "num_seqs" else 10)
        if x_col == "num_seqs":
            ticks = sorted(p[x_col].unique())
            ax.set_xticks(ticks, [str(int(t)) for t in ticks])
            ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_title(panel_label(panel), fontsize=10)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"latency relative to {baseline} at the leftmost point" if normalized else "latency (us)")
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.9))
    fig.tight_layout()
    fig.suptitle(title, y=1.02)
    note = "median of do_bench runs (L2 flushed); the better of eager and CUDA graph where both were timed"
    if not normalized:
        note += "; dashed: roofline floor max(bytes / copy bandwidth, FLOPs / matmul rate)"
    add_footnote(fig, f"{micro_footnote(ok)}\n{note}")
    data = pd.concat(plotted)[["panel", x_col, "implementation", "latency_us", "y", "floor_us"]]
    return save_figure(fig, data, out_dir, name)


def fig_microbench_by_batch(mb: pd.DataFrame, out_dir: Path, baseline: str, normalized: bool,
                            decode_share: float = 0.5) -> list[Path]:
    """Paper Fig. 6a: latency vs batch size, one panel per max sequence length."""
    name = f"microbench-by-batch-d{round(decode_share * 100)}-{'normalized' if normalized else 'absolute'}"
    ok = _micro_ok(mb)
    ok = ok[np.isclose(ok["decode_share"].astype(float), decode_share)]
    if ok.empty or ok["num_seqs"].nunique() < 2:
        return skip(name, f"no sweep rows with decode share {decode_share:.0%} over several batch sizes")
    if normalized and baseline not in set(ok["implementation"]):
        return skip(name, f"baseline implementation {baseline!r} not in the CSV")
    return _micro_panels(ok, "max_seqlen_k", "num_seqs", baseline, normalized,
                         lambda v: f"max sequence length {int(v)}", "batch size (sequences)",
                         f"Latency by batch size ({decode_share:.0%} decodes)", out_dir, name)


def fig_microbench_by_decode_share(mb: pd.DataFrame, out_dir: Path, baseline: str, normalized: bool) -> list[Path]:
    """Paper Fig. 6c: latency vs batch tokens (batch size x sequence length), one panel per decode share."""
    name = f"microbench-by-decode-share-{'normalized' if normalized else 'absolute'}"
    ok = _micro_ok(mb)
    if ok.empty or ok["decode_share"].nunique() < 2:
        return skip(name, "no sweep rows with several decode shares")
    if normalized and baseline not in set(ok["implementation"]):
        return skip(name, f"baseline implementation {baseline!r} not in the CSV")
    return _micro_panels(ok, "decode_share", "sum_seq_lens", baseline, normalized,
                         lambda v: f"{float(v):.0%} decode", "batch tokens (sum of sequence lengths)",
                         "Latency by batch composition", out_dir, name)
