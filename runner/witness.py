"""The server as a third witness: vLLM's own request metrics from its ``/metrics`` page.

A client sees a request from the outside (send, chunk arrivals); vLLM times it from the
inside: TTFT from the request's arrival at the API server to its first token, ITL between
the engine steps that produced consecutive tokens of a request (one sample per token per
step, whatever the HTTP stream merged), E2EL, queueing, prefill and decode time. Scraping
the Prometheus page before and after a load and subtracting gives the server's view of
exactly that load; where a client and the server disagree, the client (or the path
between them) added the difference.

All times here are milliseconds. A histogram's median is interpolated inside its bucket
(vLLM's buckets are coarse, e.g. 10/25/50 ms for ITL); its mean is exact (sum / count).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# name in summaries -> vLLM's histogram (seconds)
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
}
# name in summaries -> vLLM's counter (family name, without ``_total``)
COUNTERS = {
    "requests": "vllm:request_success",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "preemptions": "vllm:num_preemptions",
    "prefix_cache_queries": "vllm:prefix_cache_queries",  # prompt tokens looked up in the prefix cache
    "prefix_cache_hits": "vllm:prefix_cache_hits",  # ... and found there
}


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound (s) -> cumulative count
    total_s: float = 0.0
    count: float = 0.0


@dataclass
class Snapshot:
    """One scrape of a vLLM server's metrics, summed over its engines and label sets."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "Snapshot":
        snap = cls()
        wanted_h = {v: k for k, v in HISTOGRAMS.items()}
        wanted_c = {v: k for k, v in COUNTERS.items()}
        for family in text_string_to_metric_families(text):
            if family.name in wanted_h:
                h = snap.histograms.setdefault(wanted_h[family.name], Histogram())
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        h.buckets[le] = h.buckets.get(le, 0.0) + s.value
                    elif s.name.endswith("_sum"):
                        h.total_s += s.value
                    elif s.name.endswith("_count"):
                        h.count += s.value
            elif family.name in wanted_c:
                name = wanted_c[family.name]
                snap.counters[name] = snap.counters.get(name, 0.0) + sum(
                    s.value for s in family.samples if s.name.endswith("_total"))
        return snap


SCRAPE_ATTEMPTS = 3  # a page that fails this often in a row is taken as absent
SCRAPE_RETRY_S = 0.5  # wait before the second attempt; doubled before each later one


def scrape_text(base_url: str, timeout_s: float = 5.0) -> str | None:
    """The server's /metrics page now, or None if it has none that answers.

    A failure that may pass (a 5xx answer, a refused or timed-out connection) is tried
    again, up to `SCRAPE_ATTEMPTS` times: with several API servers vLLM merges its metrics from
    files each process creates, and a scrape that meets a file just being created answers
    500 (prometheus/client_python#1199). A 4xx answer means there is no such page."""
    for attempt in range(SCRAPE_ATTEMPTS):
        if attempt:
            time.sleep(SCRAPE_RETRY_S * 2 ** (attempt - 1))
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            if e.code < 500:
                return None
        except (urllib.error.URLError, OSError, ValueError):
            pass
    return None


def scrape(base_url: str, timeout_s: float = 5.0) -> Snapshot | None:
    """The server's metrics now, or None if it has no readable /metrics page (`scrape_text`)."""
    text = scrape_text(base_url, timeout_s)
    try:
        return Snapshot.parse(text) if text is not None else None
    except ValueError:
        return None


def _median_ms(buckets: list[tuple[float, float]], count: float) -> float | None:
    """Linear interpolation of the median inside the bucket that holds it."""
    if count <= 0:
        return None
    half, prev_le, prev_n = count / 2, 0.0, 0.0
    for le, n in buckets:
        if n >= half:
            if le == float("inf"):
                return prev_le * 1e3
            return (prev_le + (le - prev_le) * (half - prev_n) / max(n - prev_n, 1e-12)) * 1e3
        prev_le, prev_n = le, n
    return None


def between(before: Snapshot, after: Snapshot) -> dict:
    """What the server measured between two scrapes: ``<name>_count``, ``mean_<name>_ms``,
    ``median_<name>_ms`` per histogram, and the counters' increments."""
    out: dict = {}
    for name, h_after in after.histograms.items():
        h_before = before.histograms.get(name, Histogram())
        count = h_after.count - h_before.count
        out[f"{name}_count"] = count
        out[f"mean_{name}_ms"] = (h_after.total_s - h_before.total_s) / count * 1e3 if count > 0 else None
        buckets = sorted((le, n - h_before.buckets.get(le, 0.0)) for le, n in h_after.buckets.items())
        out[f"median_{name}_ms"] = _median_ms(buckets, count)
    for name, value in after.counters.items():
        out[name] = value - before.counters.get(name, 0.0)
    return out


def foreign_work(server_metrics: dict | None, sent: int, output_tokens: int | None) -> str:
    """One line when the server did more during a load than its client asked of it, ""
    when not (or unknown: no server metrics).

    More requests finished than ``sent``, or more tokens generated than the
    ``output_tokens`` that came back (given when every request was answered with its
    count: a request still running at the second scrape shows only there): another client
    loaded the server meanwhile, or a request of an earlier load was still running. Either
    way the load's throughput and latencies are not its own. (vLLM V1 counts a token when
    it is appended to its request, trimmed at the request's stop, speculative decoding
    included: the same count as the usage a client reads. V0 derives it from each step's
    batch, which undercounts speculative tokens, never overcounts.)"""
    if not server_metrics:
        return ""
    requests, generated = server_metrics.get("requests"), server_metrics.get("generation_tokens")
    if requests is not None and requests > sent:
        return (f"the server finished {requests:.0f} requests during the load, which sent {sent}: "
                "another client loaded it meanwhile, or an earlier load's request was still running")
    if output_tokens is not None and generated is not None and generated > output_tokens:
        return (f"the server generated {generated:.0f} tokens during the load, which received {output_tokens}: "
                "another client loaded it meanwhile, or an earlier load's request was still running")
    return ""


def prefix_cache_hit_rate(server_metrics: dict | None) -> float | None:
    """The share of the repeat's prompt tokens the server found in its prefix cache
    (``prefix_cache_hits`` / ``prefix_cache_queries`` between the scrapes, vLLM V1's
    counters in tokens), 0 to 1; None where the server counts no lookups (no /metrics,
    prefix caching off, or a server that does not count them)."""
    queries = (server_metrics or {}).get("prefix_cache_queries")
    if not queries:
        return None
    return server_metrics.get("prefix_cache_hits", 0.0) / queries
