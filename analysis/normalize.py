"""Aggregate repeats and normalize to a baseline run (the talk's conventions).

For each (GPU, suite, run):
* throughput (request, output, total tokens/s): the mean over repeats, error bars at the
  min and max over repeats;
* latency (TTFT, TPOT, ITL, E2EL, ms): the mean over repeats of each repeat's median, error
  bars at the mean over repeats of each repeat's 20th and 80th percentile over its requests
  (ITL: over its chunk gaps), as `vllm bench serve` reports them per run;
* energy (summary.json's ``energy``): output tokens per joule like a throughput, and the
  joules per token, per request and the power, means over the repeats whose reading is
  valid (the counter's distance from the integrated power samples: the worst repeat's);
* ITL across a request (ms): ``itl_first_tenth`` / ``itl_last_tenth``, the mean over repeats
  of each repeat's median gap over the first and the last tenth of its requests' gaps. At
  batch 1 a decode step bound by the GPU grows with the context it attends to; one bound by
  the host (kernels launched one by one from Python) stays flat.
Only ``ok`` repeats count (``keep_degraded`` adds the degraded ones). Everything comes from
the repeats' summaries, so a tree without its per-request records aggregates the same.
`normalize` divides values and error bars by the baseline run's value on the same GPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.runner.catalogue import METRICS, REPORTED

from .collect import ENGINE_COLUMNS, HOST_COLUMNS, Collected, CollectError

CONVENTION = ("bars: mean of repeats; error bars: min/max over repeats (throughput), "
              "p20/p80 over requests, mean of the repeats' (latency)")
KEYS = ["gpu", "suite", "run"]


def aggregate(data: Collected, keep_degraded: bool = False) -> pd.DataFrame:
    """One row per (gpu, suite, run): ``<metric>``, ``<metric>_lo``, ``<metric>_hi``, ``repeats``,
    ``left_out`` (repeats not counted, as "r2 degraded, r3 failed"), ``host_steal_s_min`` /
    ``_max`` (and the same for ``host_cpu_stall_s``) over the repeats that recorded them, and
    ``keep_up_min`` / ``keep_up_repeat``: the lowest `metrics.keep_up` of a rated load and its repeat."""
    counted = ("ok", "degraded") if keep_degraded else ("ok",)
    ok = data.runs[data.runs["status"].isin(counted)]
    if ok.empty:
        raise CollectError("no successful repeat to aggregate (every summary.json has a status other than ok)")
    rows = []
    for key, g in ok.groupby(KEYS, sort=False):
        row = dict(zip(KEYS, key))
        first = g.iloc[0]
        for col in ("workload", "model", "weights", "vllm_version", "date", "vendor", "engine", "attention_backend",
                    "graph_mode", "cuda_graphs", "max_num_seqs", "chunked_prefill", "output_len", "slo", "load_timing"):
            row[col] = first.get(col)
        row["repeats"] = len(g)
        every = data.runs[(data.runs["suite"] == key[1]) & (data.runs["run"] == key[2])]
        row["left_out"] = ", ".join(f"r{r.repeat} {r.status}" for r in every.itertuples()
                                    if r.status not in counted)
        row["degraded_kept"] = int((g["status"] == "degraded").sum())
        for col in ("failed", "jit_compiles"):  # summed over repeats: shown, never averaged away
            row[col] = int(g[col].fillna(0).sum()) if col in g else 0
        row["sessions"] = sorted({str(v) for v in g.get("session", pd.Series(dtype=str)).dropna() if str(v)})
        for col in HOST_COLUMNS:  # the CPU the client's machine lost per repeat (s), where recorded
            if col in g and g[col].notna().any():
                row[f"{col}_min"], row[f"{col}_max"] = g[col].min(), g[col].max()
        row.update(_energy(g))
        if "keep_up" in g and g["keep_up"].notna().any():  # the repeat that fell furthest behind its arrivals
            worst = g.loc[g["keep_up"].idxmin()]
            row["keep_up_min"], row["keep_up_repeat"] = worst["keep_up"], int(worst["repeat"])
        if "client_coalesced_chunks" in g:
            row["coalesced_chunks"] = g["client_coalesced_chunks"].mean()
        for metric in REPORTED:
            name, per_repeat = metric.name, metric.key("median")
            if per_repeat not in g:
                continue
            if not metric.is_latency:
                row[name], row[f"{name}_lo"], row[f"{name}_hi"] = g[name].mean(), g[name].min(), g[name].max()
                continue
            row[name] = g[per_repeat].mean()
            row[f"{name}_repeat_min"], row[f"{name}_repeat_max"] = g[per_repeat].min(), g[per_repeat].max()
            for bound, stat in (("lo", "p20"), ("hi", "p80")):
                column = metric.key(stat)
                row[f"{name}_{bound}"] = g[column].mean() if column in g else np.nan
        for column in sorted((c for c in g if c.startswith("ttft_turn_") and g[c].notna().any()),
                             key=lambda c: int(c.split("_")[2])):  # a multi-turn load's median TTFT per turn
            row[column] = g[column].mean()
        for tenth in ("itl_first_tenth", "itl_last_tenth"):
            column = f"{tenth}_ms"
            row[tenth] = g[column].mean() if column in g else np.nan
        for column in ("mean_e2el_ms", "mean_itl_ms", *ENGINE_COLUMNS):  # means, beside vLLM's own clocks
            if column in g and g[column].notna().any():
                row[column] = g[column].mean()
        rows.append(row)
    return pd.DataFrame(rows)


ENERGY_MEANS = ("joules_per_output_token", "net_joules_per_output_token", "joules_per_request",
                "net_joules_per_request", "mean_power_w", "peak_power_w", "idle_power_w")


def _energy(g: pd.DataFrame) -> dict:
    """A run's energy over its counted repeats whose reading is valid: the mean of each of
    `ENERGY_MEANS`, ``counter_vs_samples`` (the repeats' farthest from 0: how far the GPUs'
    counters and the integrated power samples were apart at worst), ``energy_repeats`` (how
    many), and ``energy_left_out`` (the repeats whose reading is not valid, with why; a run
    on no GPU is not listed)."""
    if "energy_valid" not in g:
        return {}
    valid = g[g["energy_valid"].eq(True)]
    out = {col: valid[col].mean() for col in ENERGY_MEANS if col in valid and valid[col].notna().any()}
    if "counter_vs_samples" in valid and valid["counter_vs_samples"].notna().any():
        out["counter_vs_samples"] = valid["counter_vs_samples"].loc[valid["counter_vs_samples"].abs().idxmax()]
    out["energy_repeats"] = len(valid)
    out["energy_left_out"] = "; ".join(
        f"r{r['repeat']}: {r['energy_note']}" for _, r in g.iterrows()
        if isinstance(r["energy_valid"], (bool, np.bool_)) and not r["energy_valid"]
        and not str(r["energy_note"]).startswith("no GPU energy"))
    return out


def split_experiments(agg: pd.DataFrame) -> pd.DataFrame:
    """A suite that holds several experiments (runs on different models or loads, e.g. a
    platform suite that includes the backend comparison, the V0/V1 table and a latency sweep)
    is split into one pseudo-suite per (model, workload), named ``<suite>-<prefix>`` after the
    run-name prefix its runs share (else its first run), so that each gets its own figures
    and is normalized only within itself. Suites of one experiment keep their name."""
    agg = agg.copy()
    for suite, g in agg.groupby("suite", sort=False):
        groups = g.groupby([g["model"].fillna(""), g["workload"].fillna("")], sort=False).groups
        if len(groups) < 2:
            continue
        for index in groups.values():
            runs = list(agg.loc[index, "run"])
            prefixes = {r.split("-")[0] for r in runs}
            label = prefixes.pop() if len(prefixes) == 1 else runs[0]
            agg.loc[index, "suite"] = f"{suite}-{label}"
    return agg


def metric_columns(agg: pd.DataFrame) -> list[str]:
    """The reported metrics (`catalogue.REPORTED`) this table has a value of, in catalogue order."""
    return [m.name for m in REPORTED if m.name in agg and agg[m.name].notna().any()]


def repeat_range(row, metric: str) -> tuple[float, float]:
    """(min, max) over a run's repeats: of the throughput itself, of each repeat's median
    for a latency."""
    if not METRICS[metric].is_latency:
        return row.get(f"{metric}_lo", float("nan")), row.get(f"{metric}_hi", float("nan"))
    return row.get(f"{metric}_repeat_min", float("nan")), row.get(f"{metric}_repeat_max", float("nan"))


def normalize(agg: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Values and error bars relative to run ``baseline`` on the same GPU (baseline = 1)."""
    if baseline not in set(agg["run"]):
        raise CollectError(f"baseline run {baseline!r} not found; runs are {sorted(set(agg['run']))}")
    out = []
    for gpu, g in agg.groupby("gpu", sort=False):
        base = g[g["run"] == baseline]
        if base.empty:
            continue  # this GPU has no baseline run: it cannot be normalized
        base = base.iloc[0]
        n = g.copy()
        for m in metric_columns(agg):
            for col in (m, f"{m}_lo", f"{m}_hi", f"{m}_repeat_min", f"{m}_repeat_max"):
                if col in n:
                    n[col] = n[col] / base[m]
        out.append(n)
    if not out:
        raise CollectError(f"baseline run {baseline!r} has no successful repeat")
    return pd.concat(out, ignore_index=True)
