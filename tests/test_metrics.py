"""Metric definitions checked on hand-computed examples."""

from __future__ import annotations

import pytest

from attnbench.runner.loadgen import RequestRecord
from attnbench.runner.metrics import request_latencies, summarize


def rec(i, sent, chunks, tokens, *, prompt=10, end=None, status="ok", phase="measure", sched=0.0, dispatch=None):
    return RequestRecord(index=i, phase=phase, prompt_len=prompt, output_len=sum(tokens),
                         scheduled_s=sched, dispatch_s=sched if dispatch is None else dispatch,
                         sent_s=sent, chunk_s=chunks, chunk_tokens=tokens,
                         end_s=end if end is not None else (chunks[-1] if chunks else sent),
                         prompt_tokens=prompt, completion_tokens=sum(tokens), status=status)


def test_single_request_latencies():
    # sent at 1.0 s, chunks at 1.1, 1.15, 1.25 (one token each)
    lat = request_latencies(rec(0, 1.0, [1.1, 1.15, 1.25], [1, 1, 1]))
    assert lat["ttft"] == pytest.approx(100.0)
    assert lat["e2el"] == pytest.approx(250.0)
    assert lat["tpot"] == pytest.approx((250 - 100) / 2)
    assert list(lat["itl"]) == pytest.approx([50.0, 100.0])


def test_multi_token_chunk_itl_definitions():
    # second chunk carries 4 tokens after 80 ms: one ITL sample of 80 ms (vLLM), or 4 of 20 ms
    lat = request_latencies(rec(0, 0.0, [0.1, 0.18], [1, 4]))
    assert list(lat["itl"]) == pytest.approx([80.0])
    assert list(lat["itl_per_token"]) == pytest.approx([20.0] * 4)
    assert lat["tpot"] == pytest.approx(80.0 / 4)  # (E2EL - TTFT) / (5 - 1)


def test_run_summary_hand_computed():
    records = [
        rec(0, 0.0, [0.2, 0.3, 0.4], [1, 1, 1], prompt=10),           # ttft 200, e2el 400
        rec(1, 0.5, [0.6, 0.8], [1, 1], prompt=20, end=2.0),          # ttft 100, e2el 300, ends at 2.0 s
        rec(2, 0.1, [], [], status="error"),                          # failed
        rec(3, 0.0, [0.05], [1], phase="warmup", end=5.0),            # not measured
    ]
    s = summarize(records, slo_ms={"ttft": 150})
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["duration"] == pytest.approx(2.0)  # last measured request's end
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 5
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.5)
    assert s["total_token_throughput"] == pytest.approx(17.5)
    assert s["mean_ttft_ms"] == pytest.approx(150.0) and s["median_ttft_ms"] == pytest.approx(150.0)
    assert s["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 100)
    assert s["mean_e2el_ms"] == pytest.approx(350.0)
    assert s["mean_tpot_ms"] == pytest.approx((100.0 + 200.0) / 2)  # 200/2 and 200/1
    assert s["median_itl_ms"] == pytest.approx(100.0)  # samples 100, 100, 200
    assert s["request_goodput"] == pytest.approx(0.5)  # only request 1 meets ttft <= 150 ms
    assert "p20_itl_ms" in s and "p80_e2el_ms" in s and "p90_tpot_ms" in s


def test_schedule_lag():
    records = [rec(i, 0.0 + i, [1.0 + i], [1], sched=float(i), dispatch=i + 0.002) for i in range(3)]
    s = summarize(records)
    assert s["median_schedule_lag_ms"] == pytest.approx(2.0)


def test_empty_run_has_no_nan_metrics():
    s = summarize([rec(0, 0.0, [], [], status="error")])
    assert s["completed"] == 0 and s["median_ttft_ms"] is None and s["request_throughput"] == 0.0


def test_the_catalogue_names_every_summary_key():
    """Every latency statistic of a summary is a catalogue key and the other way round, and
    the headings and axes the analysis shows come from the catalogue."""
    from attnbench.runner.catalogue import LATENCIES, METRICS, STATS, THROUGHPUTS, TTFT
    from attnbench.runner.summary import RepeatSummary

    s = summarize([rec(0, 0.0, [0.1, 0.2, 0.4], [1, 1, 1])])
    latency_keys = {k for k in s if k.endswith("_ms") and not k.endswith("schedule_lag_ms") and "tenth" not in k}
    assert latency_keys == {m.key(stat) for m in LATENCIES for stat in STATS}
    assert all(m.key() in s for m in THROUGHPUTS)
    assert set(RepeatSummary.model_fields) >= set(s)
    assert TTFT.heading == "TTFT ms" and TTFT.axis("s") == "TTFT (s)" and TTFT.column == "ttft_ms"
    assert METRICS["output_throughput"].heading == "output tok/s" and METRICS["request_throughput"].heading == "req/s"
    assert METRICS["tpot"].better == "lower" and METRICS["total_token_throughput"].better == "higher"


def test_itl_over_the_first_and_last_tenth_of_each_request():
    """A decode step that grows over a request: 20 gaps of 1..20 ms; the first tenth is gaps
    1-2, the last tenth gaps 19-20 (medians 1.5 and 19.5 ms), pooled over requests."""
    chunks = [sum(range(1, k + 1)) / 1e3 for k in range(21)]  # gap k is k ms
    s = summarize([rec(0, 0.0, [0.1 + c for c in chunks], [1] * 21), rec(1, 0.0, [0.1 + c for c in chunks], [1] * 21)])
    assert s["itl_first_tenth_ms"] == pytest.approx(1.5) and s["itl_last_tenth_ms"] == pytest.approx(19.5)
    assert summarize([rec(0, 0.0, [0.1], [1])])["itl_first_tenth_ms"] is None  # one chunk: no gap


@pytest.mark.parametrize("failed, timed_out, status", [(0, 0, "ok"), (1, 0, "ok"), (2, 0, "degraded"),
                                                       (1, 1, "degraded"), (60, 0, "degraded")])
def test_a_repeat_with_over_one_percent_failed_or_any_timeout_is_degraded(failed, timed_out, status):
    """100 requests sent: one failure is within 1%; two are not; a timeout never is."""
    from attnbench.runner.summary import RepeatHeader, summarize_repeat

    records = [rec(i, 0.0, [0.1, 0.2], [1, 1]) for i in range(100 - failed)]
    records += [rec(100 + i, 0.0, [], [], status="timeout" if i < timed_out else "error") for i in range(failed)]
    summary = summarize_repeat(records, RepeatHeader(run="r", repeat=1))
    assert summary.status == status and summary.timed_out == timed_out
    assert summary.measured == (status == "ok")
    if status == "degraded":
        assert ("timed out" if timed_out else "over 1%") in summary.error


def test_a_repeat_where_nothing_completed_failed():
    from attnbench.runner.summary import RepeatHeader, summarize_repeat

    summary = summarize_repeat([rec(0, 0.0, [], [], status="error")], RepeatHeader())
    assert summary.status == "failed" and summary.error.startswith("all 1 requests failed")


def queue(arrivals, service_s: float, servers: int) -> list[RequestRecord]:
    """Records of a first-come-first-served server with ``servers`` slots, each request
    taking ``service_s``: a server that keeps up or one that falls behind."""
    free = [0.0] * servers
    out = []
    for i, t in enumerate(arrivals):
        k = min(range(servers), key=free.__getitem__)
        start = max(t, free[k])
        free[k] = start + service_s
        out.append(rec(i, t, [start + 0.01, free[k]], [1, 1], sched=t))
    return out


@pytest.mark.parametrize("rate, expected", [(20.0, 1.0), (40.0, 25 / 40), (100.0, 0.25)])
def test_keep_up_is_the_share_of_arrivals_the_server_completes_once_past_the_ramp(rate, expected):
    """Arrivals for 60 s at a server of 50 slots x 2 s per request (25 req/s): it keeps up
    with 20 req/s, and completes its 25 req/s of 40 or 100."""
    summary = summarize(queue([i / rate for i in range(int(rate * 60))], 2.0, 50))
    assert summary["keep_up"] == pytest.approx(expected, abs=0.02)


def test_keep_up_near_1_under_poisson_arrivals_the_server_keeps_up_with():
    import numpy as np

    for seed in range(5):
        arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / 22, 22 * 60))
        assert summarize(queue(arrivals, 2.0, 50))["keep_up"] > 0.93


def test_keep_up_is_not_judged_on_a_burst_or_a_short_load():
    assert summarize(queue([0.0] * 100, 2.0, 10))["keep_up"] is None
    assert summarize(queue([i * 0.1 for i in range(99)], 2.0, 10))["keep_up"] is None  # 9.8 s of arrivals
    assert summarize(queue([i * 0.1 for i in range(101)], 0.05, 10))["keep_up"] == pytest.approx(1.0, abs=0.03)
