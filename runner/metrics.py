"""Serving metrics from request records, with the definitions of `vllm bench serve` (each
metric's name, unit and one-line definition are in `catalogue`).

Per request (ms), over successful measured requests:
  TTFT   time to first token: first streamed chunk carrying ``choices`` minus the time the
         request was sent.
  E2EL   end-to-end latency: last chunk carrying ``choices`` minus the send time.
  TPOT   time per output token after the first: (E2EL - TTFT) / (output_tokens - 1), for
         requests with more than one output token.
  ITL    inter-token latency, one sample per chunk gap (vLLM's definition). When a chunk
         carries k > 1 tokens that gap is one sample; ``itl_per_token`` instead spreads it
         as k samples of gap / k (the definition GuideLLM-style tools use); it covers the
         requests whose per-chunk token counts are known.
Per run:
  duration                from the load's start to the end of the last measured request (s)
  request_throughput      completed requests / duration (req/s)
  output_throughput       output tokens / duration (tok/s)
  total_token_throughput  (input + output tokens) / duration (tok/s)
  request_goodput         requests meeting every given SLO (ms) / duration (req/s)
  slo                     attainment of percentile objectives ("p90 ttft <= 500 ms"; `slo`)
  itl_first_tenth, itl_last_tenth
                          the median ITL over the first and over the last tenth of every
                          request's gaps (ms): at batch 1 a decode step bound by the GPU
                          grows with the context it attends to, one bound by the host stays flat
  schedule_lag            client release time minus scheduled time: the load generator's
                          own delay (ms)
  client_loop_lag         how late the client's event loop woke a 5 ms timer (ms): a
                          busy client delays every chunk it has not read yet
  client_coalesced_chunks share of chunks that arrived in the same socket read as the chunk
                          before them (they share one arrival time)
  keep_up                 of a load whose arrivals span at least `KEEP_UP_WINDOW_S`: the
                          requests completed during the second half of that span per request
                          that arrived in it. About 1 where the server keeps up with the
                          offered rate (by then requests leave as fast as they arrive); its
                          service rate / the offered rate where it does not, and a queue grows
  ttft_by_turn            of a multi-turn load: per user turn (1, 2, ...), its completed
                          requests and their mean, median and p90 TTFT (ms); a later turn
                          carries the history before it, which a prefix cache holds
Token counts are the server's ``usage`` (prompt_tokens, completion_tokens) when present.
Summary keys follow ``vllm bench serve --save-result`` (``mean_ttft_ms``, ``p99_itl_ms``, ...).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .catalogue import LATENCIES, STATS, Metric
from .loadgen import RequestRecord
from .slo import Slo

KEEP_UP_WINDOW_S = 10.0  # s of arrivals below which `keep_up` is not judged (a request may live that long)


def request_latencies(r: RequestRecord) -> dict:
    """TTFT, E2EL, TPOT (ms) and ITL samples (ms) of one successful request."""
    ttft = (r.chunk_s[0] - r.sent_s) * 1e3
    e2el = (r.chunk_s[-1] - r.sent_s) * 1e3
    out_tokens = output_tokens(r)
    gaps = np.diff(r.chunk_s) * 1e3
    known = len(r.chunk_tokens) == len(r.chunk_s)
    per_token = np.repeat(gaps / np.maximum(r.chunk_tokens[1:], 1), np.maximum(r.chunk_tokens[1:], 1)) \
        if len(gaps) and known else np.array([])
    return {
        "ttft": ttft, "e2el": e2el,
        "tpot": (e2el - ttft) / (out_tokens - 1) if out_tokens > 1 else None,
        "itl": gaps, "itl_per_token": per_token,
    }


def output_tokens(r: RequestRecord) -> int:
    return r.completion_tokens if r.completion_tokens is not None else int(sum(r.chunk_tokens))


def input_tokens(r: RequestRecord) -> int:
    return r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len


def _stat(stat: str, v: np.ndarray) -> float:
    if stat == "mean":
        return float(v.mean())
    if stat == "median":
        return float(np.median(v))
    if stat == "std":
        return float(v.std())
    return float(np.percentile(v, int(stat[1:])))  # "p99" -> 99th percentile


def latency_stats(metric: Metric | str, values) -> dict:
    """Every statistic of `catalogue.STATS` over ``values`` (ms), under its summary key
    (``mean_ttft_ms``, ...); None each when there are no values. ``metric`` may also be a
    bare name for a quantity outside the catalogue (``schedule_lag``)."""
    v = np.asarray(values, dtype=float)
    key = metric.key if isinstance(metric, Metric) else (lambda stat: f"{stat}_{metric}_ms")
    return {key(stat): (_stat(stat, v) if v.size else None) for stat in STATS}


def first_error(records: Iterable[RequestRecord]) -> str:
    """The error of the earliest-sent failed request, on one line ('' if none failed)."""
    failed = sorted((r for r in records if r.status != "ok"), key=lambda r: r.sent_s)
    return " ".join(failed[0].error.split())[:300] if failed else ""


def itl_tenths(per: list[dict]) -> tuple[float | None, float | None]:
    """Median ITL (ms) over the first and over the last tenth of every request's gaps
    (``per``: `request_latencies` of each request); None where no gap falls there."""
    first, last = [], []
    for p in per:
        gaps = p["itl"]
        where = np.arange(len(gaps)) / max(len(gaps), 1)  # 0 for the first gap, < 1 for the last
        first.append(gaps[where < 0.1])
        last.append(gaps[where >= 0.9])
    first_all, last_all = np.concatenate(first) if first else [], np.concatenate(last) if last else []
    return (float(np.median(first_all)) if len(first_all) else None,
            float(np.median(last_all)) if len(last_all) else None)


def keep_up(recs: Sequence[RequestRecord]) -> float | None:
    """Requests completed in the second half of the arrivals' span per request that arrived
    in it (module doc); None when the arrivals span less than `KEEP_UP_WINDOW_S` (a burst)."""
    start = min((r.scheduled_s for r in recs), default=0.0)
    end = max((r.scheduled_s for r in recs), default=0.0)
    if end - start < KEEP_UP_WINDOW_S:
        return None
    middle = (start + end) / 2
    arrived = sum(middle <= r.scheduled_s <= end for r in recs)
    left = sum(r.status == "ok" and middle <= r.end_s <= end for r in recs)
    return left / arrived if arrived else None


def ttft_by_turn(ok: Sequence[RequestRecord], per: Sequence[dict]) -> dict[str, dict]:
    """{turn: {"completed", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms"}} over the
    successful requests ``ok`` (``per``: their `request_latencies`), turns as strings (JSON keys)."""
    by_turn: dict[int, list[float]] = {}
    for r, p in zip(ok, per):
        by_turn.setdefault(r.turn, []).append(p["ttft"])
    out = {}
    for turn in sorted(t for t in by_turn if t is not None):
        v = np.asarray(by_turn[turn])
        out[str(turn)] = {"completed": int(v.size), "mean_ttft_ms": float(v.mean()),
                          "median_ttft_ms": float(np.median(v)), "p90_ttft_ms": float(np.percentile(v, 90))}
    return out


def summarize(records: Iterable[RequestRecord], slo_ms: dict[str, float] | None = None,
              loop_lag_ms: Sequence[float] | None = None, slo: Slo | None = None) -> dict:
    """The metrics of one repeat (measured requests only), under their summary.json keys;
    ``loop_lag_ms`` (the client's event-loop lag samples) adds its p50, p99 and max;
    ``slo`` adds the repeat against those objectives (`slo.SloResult`).
    `summary.summarize_repeat` makes them part of a `RepeatSummary`."""
    recs = [r for r in records if r.phase == "measure"]
    ok = [r for r in recs if r.status == "ok" and r.chunk_s]
    per = [request_latencies(r) for r in ok]
    duration = max((r.end_s for r in recs), default=0.0)
    n_in = sum(input_tokens(r) for r in ok)
    n_out = sum(output_tokens(r) for r in ok)
    summary = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "timed_out": sum(r.status == "timeout" for r in recs),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": n_out / duration if duration else 0.0,
        "total_token_throughput": (n_in + n_out) / duration if duration else 0.0,
    }
    for metric in LATENCIES:
        if metric.per == "request":
            summary.update(latency_stats(metric, [p[metric.name] for p in per if p[metric.name] is not None]))
        else:  # one sample per chunk gap
            summary.update(latency_stats(metric, np.concatenate([p[metric.name] for p in per]) if per else []))
    summary["itl_first_tenth_ms"], summary["itl_last_tenth_ms"] = itl_tenths(per)
    summary["keep_up"] = keep_up(recs)
    if slo_ms:
        good = sum(all(p[k] is not None and p[k] <= limit for k, limit in slo_ms.items()) for p in per)
        summary["request_goodput"] = good / duration if duration else 0.0
        summary["goodput_slo_ms"] = dict(slo_ms)
    if slo is not None:
        summary["slo"] = slo.evaluate(per, len(recs)).model_dump()
    summary.update(latency_stats("schedule_lag", [(r.dispatch_s - r.scheduled_s) * 1e3 for r in recs]))
    if loop_lag_ms is not None:
        lag = np.asarray(loop_lag_ms or [0.0])
        summary["client_loop_lag_ms"] = {"p50": float(np.median(lag)), "p99": float(np.percentile(lag, 99)),
                                         "max": float(lag.max())}
    chunks = sum(len(r.chunk_s) for r in ok)
    summary["client_coalesced_chunks"] = sum(r.coalesced for r in ok) / chunks if chunks else 0.0
    summary["max_chunk_tokens"] = max((max(r.chunk_tokens) for r in ok if r.chunk_tokens), default=0)
    if any(r.turn is not None for r in recs):
        summary["ttft_by_turn"] = ttft_by_turn(ok, per)
    summary["errors"] = sorted({r.error for r in recs if r.status != "ok"})[:20]
    summary["first_error"] = first_error(recs)
    return summary
