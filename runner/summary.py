"""`RepeatSummary`: the summary.json of one measured repeat, as a typed record, and the one
place that builds it (`summarize_repeat`, `unmeasured_repeat`).

Its keys follow ``vllm bench serve --save-result`` wherever the quantity is the same
(``completed``, ``duration``, ``request_throughput``, ``median_ttft_ms``, ...: every
statistic of `catalogue.STATS` for every latency of `catalogue.LATENCIES`); attnbench adds
what was measured (`RepeatHeader`: suite, run and repeat for `attnbench run`, the URL for
`attnbench load`), its witnesses (`Witnesses`: vLLM's own metrics, kernel compiles, the
client's health) and the request file it summarizes (record count and sha256, so that a
short or edited file is noticed). Summaries of other attnbench versions load too (unknown
keys are kept).

A repeat's status (`STATUSES`):
  ok           every request completed, or failures at most `DEGRADED_FAILED_SHARE` of them
               and no timeout;
  degraded     more failures than that, any request timed out, or the server did work the
               client did not send (`witness.foreign_work`: another client, unless the
               load shares the server on purpose): its metrics describe a server that was
               not serving this load normally, so reports leave it out of the means and
               ``--resume`` measures it again;
  failed       no request completed, or the server did not start or died;
  interrupted  Ctrl-C or SIGTERM during the repeat.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from .catalogue import LATENCIES, STATS
from .energy import EnergyReading
from .loadgen import RequestRecord
from .metrics import summarize
from .slo import Slo, SloResult
from .witness import foreign_work, prefix_cache_hit_rate

STATUSES = ("ok", "degraded", "failed", "interrupted")
DEGRADED_FAILED_SHARE = 0.01  # more failed requests than this share makes a repeat degraded


class RepeatHeader(BaseModel):
    """What was measured, and how: the fields of a summary that do not come from its records."""

    suite: str | None = None
    run: str | None = None
    repeat: int | None = None
    session: str | None = None  # start of the `attnbench run` that measured it
    base_url: str | None = None
    model_id: str | None = None
    tokenizer_id: str | None = None
    num_prompts: int | None = None
    request_rate: float | None = None  # req/s; inf: all at once
    burstiness: float | None = None
    max_concurrency: int | None = None
    recipe_hash: str | None = None
    load_timing: str | None = None  # how the requests were timed, one line (runner/workload.py)
    prefix_cache_reset: bool | None = None  # with prefix caching on: the cache was emptied before the repeat
    provenance_file: str | None = None
    started_at: str | None = None  # UTC ISO times of the repeat's load
    finished_at: str | None = None


class Witnesses(BaseModel):
    """What others saw of the repeat: the server (`witness`, `serverlog`) and the client's
    machine (`host`)."""

    server_metrics: dict | None = None  # vLLM's /metrics over the repeat (`witness.between`)
    jit_compiles: list[str] | None = None  # kernel compiles the server logged meanwhile
    client_processes: int | None = None  # client processes that shared the load
    client_host: dict[str, float] | None = None  # CPU s the client's machine lost meanwhile
    energy: EnergyReading | None = None  # what the server's GPUs used meanwhile (`energy`)


class RecordsDigest(BaseModel):
    """The request file a summary was computed from: its record count and the sha256 of its
    bytes (`store.RecordWriter` keeps both while it writes)."""

    records: int
    records_sha256: str


class _Summary(RepeatHeader, Witnesses):
    model_config = ConfigDict(extra="allow")

    date: str | None = None  # UTC ISO time the summary was made
    backend: str  # the client: the OpenAI completions API, as vllm bench serve's "vllm" backend speaks it
    endpoint_type: str
    status: Literal[STATUSES] = "ok"  # type: ignore[valid-type]
    error: str = ""  # one line when status is not ok

    # counts and rates (vllm bench serve's names); warm-up requests excluded
    duration: float | None = None  # s, from the load's start to the end of the last request
    completed: int = 0
    failed: int = 0
    timed_out: int = 0  # of the failed: requests that ran out of time (`loadgen` timeouts)
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None  # req/s
    output_throughput: float | None = None  # tok/s
    total_token_throughput: float | None = None  # tok/s
    request_goodput: float | None = None  # req/s meeting every SLO of goodput_slo_ms
    goodput_slo_ms: dict[str, float] | None = None
    slo: SloResult | None = None  # the repeat against benchmark.slo's objectives (`slo`)
    itl_first_tenth_ms: float | None = None  # median ITL over the first tenth of each request's gaps
    itl_last_tenth_ms: float | None = None  # ... and over the last tenth
    keep_up: float | None = None  # completions per arrival over the arrivals' second half (`metrics.keep_up`)
    ttft_by_turn: dict[str, dict[str, float]] | None = None  # of a multi-turn load (`metrics.ttft_by_turn`)
    prefix_cache_hit_rate: float | None = None  # prompt tokens found in the server's prefix cache, 0-1 (`witness`)

    # the request file (None: a summary older than the digest, or nothing was written)
    records: int | None = None
    records_sha256: str | None = None

    # the client's own health
    client_loop_lag_ms: dict[str, float] | None = None  # p50 / p99 / max
    client_coalesced_chunks: float | None = None  # share of chunks read together with the one before
    max_chunk_tokens: int | None = None
    errors: list[str] = []  # distinct request errors (at most 20)
    first_error: str = ""

    @model_validator(mode="before")
    @classmethod
    def _client(cls, data):
        """The client's names, in every summary (vllm bench serve's keys)."""
        if isinstance(data, dict):
            data = {"backend": "vllm", "endpoint_type": "openai", **data}
        return data

    @property
    def measured(self) -> bool:
        """Its metrics count: ``ok`` (a degraded repeat is reported apart, not averaged in)."""
        return self.status == "ok"

    def as_json(self) -> dict:
        """What summary.json holds: every key that was set (None included), none that was not."""
        return self.model_dump(exclude_unset=True)


# a latency's statistics (ms), one field each: mean_ttft_ms, median_ttft_ms, ..., p99_itl_ms,
# and the client's own schedule lag (mean_schedule_lag_ms, ...)
_STAT_FIELDS = {m.key(stat): (float | None, None) for m in LATENCIES for stat in STATS}
_STAT_FIELDS.update({f"{stat}_schedule_lag_ms": (float | None, None) for stat in STATS})
RepeatSummary = create_model("RepeatSummary", __base__=_Summary, __doc__=__doc__, **_STAT_FIELDS)


def repeat_status(completed: int, failed: int, timed_out: int, first_error: str) -> tuple[str, str]:
    """(status, one-line error) of a repeat measured to its end (module doc)."""
    total = completed + failed
    if not completed:
        return "failed", f"all {failed} requests failed; first error: {first_error}"
    if timed_out:
        return "degraded", (f"{timed_out} of {total} requests timed out ({failed} failed in all); "
                            f"first error: {first_error}")
    if failed > DEGRADED_FAILED_SHARE * total:
        return "degraded", (f"{failed} of {total} requests failed (over {DEGRADED_FAILED_SHARE:.0%}); "
                            f"first error: {first_error}")
    return "ok", ""


def summarize_repeat(records: Sequence[RequestRecord], header: RepeatHeader, *,
                     witnesses: Witnesses | None = None, digest: RecordsDigest | None = None,
                     slo_ms: dict[str, float] | None = None, loop_lag_ms: Sequence[float] | None = None,
                     slo: Slo | None = None, status: str | None = None, error: str = "",
                     shared_server: bool = False) -> RepeatSummary:
    """The summary of a repeat from its request records (measured ones count) and what the
    caller knows about it. ``status`` and ``error`` override the status the records give
    (`repeat_status`, then the server's count of its work, unless ``shared_server``: other
    clients load it on purpose): a repeat the server died in, or one interrupted, says so
    whatever its records say."""
    metrics = summarize(records, slo_ms, loop_lag_ms, slo)
    hit_rate = prefix_cache_hit_rate(witnesses.server_metrics) if witnesses is not None else None
    if hit_rate is not None:
        metrics["prefix_cache_hit_rate"] = hit_rate
    if witnesses is not None and witnesses.energy is not None:  # per output token and completed request
        energy = witnesses.energy.per_work(metrics["total_output_tokens"] or 0, metrics["completed"])
        witnesses = witnesses.model_copy(update={"energy": energy})
    if status is None:
        status, error = repeat_status(metrics["completed"], metrics["failed"], metrics["timed_out"],
                                      metrics["first_error"])
        if status == "ok" and witnesses is not None and not shared_server:
            measured = [r for r in records if r.phase == "measure"]
            counted = not metrics["failed"] and all(r.completion_tokens is not None for r in measured)
            foreign = foreign_work(witnesses.server_metrics, len(measured),
                                   metrics["total_output_tokens"] if counted else None)
            if foreign:
                status, error = "degraded", foreign
    return RepeatSummary(**header.model_dump(exclude_none=True), **metrics,
                         **(witnesses.model_dump(exclude_none=True, exclude_unset=True) if witnesses else {}),
                         **(digest.model_dump() if digest else {}), date=utc_now(), status=status, error=error)


def unmeasured_repeat(header: RepeatHeader, status: str, error: str) -> RepeatSummary:
    """The summary of a repeat that sent nothing: its server did not start or was not the
    engine the recipe asked for."""
    return RepeatSummary(**header.model_dump(exclude_none=True), date=utc_now(), status=status, error=error)


def utc_now() -> str:
    """The time now as the summaries write it: UTC, ISO 8601, whole seconds."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
