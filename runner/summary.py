"""`RepeatSummary`: the summary.json of one measured repeat, as a typed record.

Its keys follow ``vllm bench serve --save-result`` wherever the quantity is the same
(``completed``, ``duration``, ``request_throughput``, ``median_ttft_ms``, ...: every
statistic of `catalogue.STATS` for every latency of `catalogue.LATENCIES`); attnbench adds
its witnesses (vLLM's own metrics, kernel compiles, the client's health) and what was
measured (suite, run and repeat for `attnbench run`; the URL for `attnbench load`).
`repeat.measure_repeat` makes one; `store` writes it; `execute`, `commands` and the
analysis read it. Summaries of other attnbench versions load too (unknown keys are kept).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from .catalogue import LATENCIES, STATS

STATUSES = ("ok", "failed", "interrupted")


class _Summary(BaseModel):
    model_config = ConfigDict(extra="allow")

    # what was measured: `attnbench run` names the suite's run and repeat, `attnbench load` the URL
    suite: str | None = None
    run: str | None = None
    repeat: int | None = None
    date: str | None = None  # UTC ISO time the summary was made
    session: str | None = None  # start of the `attnbench run` that measured it
    backend: str
    endpoint_type: str
    base_url: str | None = None
    model_id: str | None = None
    tokenizer_id: str | None = None
    num_prompts: int | None = None
    request_rate: float | None = None  # req/s; inf: all at once
    burstiness: float | None = None
    max_concurrency: int | None = None
    recipe_hash: str | None = None
    provenance_file: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    status: Literal[STATUSES] = "ok"  # type: ignore[valid-type]
    error: str = ""  # one line when status is not ok

    # counts and rates (vllm bench serve's names); warm-up requests excluded
    duration: float | None = None  # s, from the load's start to the end of the last request
    completed: int = 0
    failed: int = 0
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None  # req/s
    output_throughput: float | None = None  # tok/s
    total_token_throughput: float | None = None  # tok/s
    request_goodput: float | None = None  # req/s meeting every SLO of goodput_slo_ms
    goodput_slo_ms: dict[str, float] | None = None

    # witnesses
    server_metrics: dict | None = None  # vLLM's /metrics over the repeat (`witness.between`)
    jit_compiles: list[str] | None = None  # kernel compiles the server logged meanwhile
    client_processes: int | None = None  # client processes that shared the load
    client_host: dict[str, float] | None = None  # CPU s the client's machine lost meanwhile (`host.host_between`)
    client_loop_lag_ms: dict[str, float] | None = None  # p50 / p99 / max
    client_coalesced_chunks: float | None = None  # share of chunks read together with the one before
    max_chunk_tokens: int | None = None
    errors: list[str] = []  # distinct request errors (at most 20)
    first_error: str = ""

    @model_validator(mode="before")
    @classmethod
    def _client(cls, data):
        """The client: the OpenAI completions API, as vllm bench serve's "vllm" backend speaks it."""
        if isinstance(data, dict):
            data = {"backend": "vllm", "endpoint_type": "openai", **data}
        return data

    def settled(self) -> "RepeatSummary":
        """Status and error from the counts: a repeat in which no request completed failed,
        and says why in one line."""
        if self.completed:
            return self.model_copy(update={"status": "ok", "error": ""})
        return self.model_copy(update={"status": "failed", "error": f"all {self.failed} requests failed; "
                                                                    f"first error: {self.first_error}"})

    def as_json(self) -> dict:
        """What summary.json holds: every key that was set (None included), none that was not."""
        return self.model_dump(exclude_unset=True)


# a latency's statistics (ms), one field each: mean_ttft_ms, median_ttft_ms, ..., p99_itl_ms,
# and the client's own schedule lag (mean_schedule_lag_ms, ...)
_STAT_FIELDS = {m.key(stat): (float | None, None) for m in LATENCIES for stat in STATS}
_STAT_FIELDS.update({f"{stat}_schedule_lag_ms": (float | None, None) for stat in STATS})
RepeatSummary = create_model("RepeatSummary", __base__=_Summary, __doc__=__doc__, **_STAT_FIELDS)
