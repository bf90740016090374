"""The serving metrics attnbench reports, each declared once: its name, unit, labels, what
it counts and which direction is better.

`metrics` computes them; `analysis` (collect, normalize, report, figures) names its columns,
table headings and axes from here. Key names follow ``vllm bench serve --save-result``:
a throughput is its own key (``output_throughput``); a latency has one key per statistic
(``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``, ...). Tokens per joule comes from
a summary's ``energy`` reading, where it is valid; SLO attainment from its ``slo``; the
prefix-cache hit rate from the server's own counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PERCENTILES = (20, 50, 80, 90, 99)
STATS = ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))  # of a latency, over its samples


@dataclass(frozen=True)
class Metric:
    name: str
    per: Literal["run", "request", "gap"]  # one value per repeat, per request, per chunk gap
    unit: str  # "req/s", "tok/s", "ms", "%" or "tok/J"
    short: str  # table heading before the unit ("TTFT" -> "TTFT ms"; "" -> "req/s")
    long: str  # axis label before the unit ("TTFT" -> "TTFT (s)")
    better: Literal["higher", "lower"]
    definition: str

    @property
    def is_latency(self) -> bool:
        return self.per != "run"

    @property
    def column(self) -> str:
        """Its column in the analysis frames: per-request and per-gap values are ms."""
        return f"{self.name}_ms" if self.is_latency else self.name

    def key(self, stat: str = "median") -> str:
        """Its summary.json key: ``<stat>_<name>_ms`` for a latency (stat in `STATS`), the
        name itself for a throughput."""
        if not self.is_latency:
            return self.name
        if stat not in STATS:
            raise ValueError(f"stat: expected one of {STATS}, got {stat!r}")
        return f"{stat}_{self.name}_ms"

    @property
    def heading(self) -> str:
        """Table heading: "TTFT ms", "output tok/s", "req/s"."""
        return f"{self.short} {self.unit}".strip()

    @property
    def ratio_label(self) -> str:
        """Its name where it is shown as a ratio (no unit): "TTFT", "total tok/s"."""
        return self.short if self.is_latency else self.heading

    def axis(self, unit: str | None = None) -> str:
        """Axis label, e.g. "TTFT (s)" when a figure plots it in ``unit`` instead of its own."""
        return f"{self.long} ({unit or self.unit})"


REQUEST_THROUGHPUT = Metric("request_throughput", "run", "req/s", "", "request throughput", "higher",
                            "completed requests / duration")
OUTPUT_THROUGHPUT = Metric("output_throughput", "run", "tok/s", "output", "output token throughput", "higher",
                           "output tokens / duration")
TOTAL_TOKEN_THROUGHPUT = Metric("total_token_throughput", "run", "tok/s", "total", "total token throughput",
                                "higher", "(input + output tokens) / duration")
TTFT = Metric("ttft", "request", "ms", "TTFT", "TTFT", "lower",
              "first streamed chunk carrying choices minus the time the request was sent")
TPOT = Metric("tpot", "request", "ms", "TPOT", "TPOT", "lower",
              "(E2EL - TTFT) / (output tokens - 1), for requests of more than one output token")
E2EL = Metric("e2el", "request", "ms", "E2EL", "E2EL", "lower",
              "last chunk carrying choices minus the send time")
ITL = Metric("itl", "gap", "ms", "ITL", "ITL", "lower",
             "gap between consecutive chunks of a request, one sample per gap (vLLM's definition)")
ITL_PER_TOKEN = Metric("itl_per_token", "gap", "ms", "ITL/token", "ITL per token", "lower",
                       "a gap of a chunk of k tokens as k samples of gap / k (where per-chunk counts are known)")

TOKENS_PER_JOULE = Metric("output_tokens_per_joule", "run", "tok/J", "output", "output tokens per joule", "higher",
                          "output tokens / the energy of the server's GPUs over the load (summary.json's energy)")

SLO_ATTAINMENT = Metric("slo_attainment_pct", "run", "%", "SLO", "SLO attainment", "higher",
                        "measured requests that completed within every objective of benchmark.slo (runner/slo.py), %")

PREFIX_CACHE_HIT = Metric("prefix_cache_hit_pct", "run", "%", "prefix hit", "prefix-cache hit rate", "higher",
                          "prompt tokens the server found in its prefix cache over those it looked up (vLLM's "
                          "prefix_cache_hits / prefix_cache_queries over the repeat), %")

# ITL reads low when this share of a run's chunk gaps are coalesced (two chunks read at once:
# a 0 ms gap, which vLLM's definition keeps): at 20% the ITL's p20 reads 0, at 50% its
# median does, and neither is the server's real gap between tokens. There TPOT is the
# headline latency (`analysis.figures.headline_itl`) and the run's table marks the ITL.
COALESCED_HEADLINE_LIMIT = 0.2

THROUGHPUTS = (REQUEST_THROUGHPUT, OUTPUT_THROUGHPUT, TOTAL_TOKEN_THROUGHPUT)
LATENCIES = (TTFT, TPOT, E2EL, ITL, ITL_PER_TOKEN)  # every latency a summary holds
REPORTED = (*THROUGHPUTS, TTFT, TPOT, E2EL, ITL, SLO_ATTAINMENT, PREFIX_CACHE_HIT, TOKENS_PER_JOULE)  # the report's tables, figures
METRICS = {m.name: m for m in (*THROUGHPUTS, *LATENCIES, SLO_ATTAINMENT, PREFIX_CACHE_HIT, TOKENS_PER_JOULE)}
