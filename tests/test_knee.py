"""The knee search (runner/knee.py) against servers whose knee is known: within the
tolerance in at most 8 probes for knees between a quarter and twice the burst's
throughput, an honest verdict elsewhere, the path kept; a probe the server fell behind
does not hold (`metrics.keep_up`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbench.runner.knee import KneeResult, KneeSettings, Probe, bracket, next_rate
from attnbench.runner.summary import RepeatSummary


def search(attainment, burst: float, target: float = 0.9, settings: KneeSettings = KneeSettings(),
           status=lambda rate: "ok") -> KneeResult:
    """Run the search against ``attainment(rate)`` (the burst's rate is inf) on a server
    that completes ``burst`` req/s at a burst."""
    probes: list[Probe] = []
    while (rate := next_rate(probes, settings)) is not None:
        a = attainment(rate)
        probes.append(Probe(repeat=len(probes) + 1, rate=rate, status=status(rate), attainment=a,
                            holds=a >= target and status(rate) == "ok",
                            request_throughput=burst if math.isinf(rate) else rate))
    return KneeResult.of("run", probes, settings, ["p90 ttft <= 500 ms"], target)


@pytest.mark.parametrize("share", np.random.default_rng(44).uniform(0.26, 1.99, 16).round(3))
def test_a_knee_between_a_quarter_and_twice_the_bursts_throughput_is_found_in_8_probes(share):
    burst = 37.0
    knee = share * burst
    result = search(lambda rate: 1.0 if rate <= knee else 0.5, burst)
    assert result.converged and len(result.probes) <= 8, result.verdict
    assert knee * 0.95 <= result.knee_rate <= knee  # a measured rate that held, within 5% below
    assert result.upper_rate > knee and result.upper_rate <= result.knee_rate * 1.05
    assert math.isinf(result.probes[0].rate) and result.probes[1].rate == burst
    assert result.verdict.startswith(f"knee {result.knee_rate:.3g} req/s")


def test_a_smooth_attainment_curve_meets_its_target_at_the_knee():
    burst, true_knee, width = 20.0, 13.0, 1.0
    middle = true_knee + width * math.log(9)  # a logistic fall with load, 0.9 exactly at the true knee

    def attainment(rate):
        return 1 / (1 + math.exp((rate - middle) / width))
    assert attainment(true_knee) == pytest.approx(0.9)
    result = search(lambda r: 0.0 if math.isinf(r) else attainment(r), burst)
    assert result.converged and len(result.probes) <= 8
    assert true_knee * 0.95 <= result.knee_rate <= true_knee


def test_a_tighter_tolerance_takes_more_probes():
    knee = 0.61 * 10
    loose = search(lambda r: 1.0 if r <= knee else 0.0, 10.0, settings=KneeSettings(tolerance=0.2))
    tight = search(lambda r: 1.0 if r <= knee else 0.0, 10.0, settings=KneeSettings(tolerance=0.01, max_probes=16))
    assert len(loose.probes) < len(tight.probes) and tight.converged
    assert tight.upper_rate <= tight.knee_rate * 1.01


def test_an_slo_that_holds_at_a_burst_takes_one_probe():
    result = search(lambda r: 1.0, 25.0)
    assert len(result.probes) == 1 and result.converged and result.knee_rate is None
    assert result.verdict == "the SLO holds even at a burst: the knee is at or above the burst's throughput, 25 req/s"


def test_a_knee_too_low_for_the_probes_says_so():
    result = search(lambda r: 1.0 if r <= 0.5 else 0.0, 40.0)
    assert len(result.probes) == 8 and not result.converged and result.knee_rate is None
    assert result.verdict == "the SLO held at no rate down to 0.625 req/s in 8 probes: the knee is lower"


def test_out_of_probes_gives_the_bracket():
    result = search(lambda r: 1.0 if r <= 7.3 else 0.0, 10.0, settings=KneeSettings(max_probes=4))
    assert len(result.probes) == 4 and not result.converged
    assert [p.rate for p in result.probes[1:]] == [10.0, 5.0, pytest.approx(math.sqrt(50))]
    assert (result.knee_rate, result.upper_rate) == (pytest.approx(math.sqrt(50)), 10.0)
    assert "between 7.07 and 10 req/s after 4 probes" in result.verdict and "max_probes" in result.verdict


def test_a_probe_that_measured_nothing_ends_the_search():
    result = search(lambda r: 0.0, 10.0, status=lambda r: "failed" if r == 5.0 else "ok")
    assert [p.rate for p in result.probes] == [math.inf, 10.0, 5.0] and not result.converged
    assert result.verdict == "probe r3 measured nothing (failed): no knee"


def test_a_degraded_probe_does_not_hold():
    knee = 6.0
    result = search(lambda r: 1.0 if r <= knee else 0.0, 10.0, status=lambda r: "degraded" if r > 9 else "ok")
    assert result.converged and knee * 0.95 <= result.knee_rate <= knee


def test_a_noisy_server_that_held_above_a_failing_rate_is_kept_in_the_path():
    probes = [Probe(repeat=1, rate=math.inf, status="ok", attainment=0.1, request_throughput=10.0),
              Probe(repeat=2, rate=10.0, status="ok", attainment=0.95, holds=True),
              Probe(repeat=3, rate=8.0, status="ok", attainment=0.8),
              Probe(repeat=4, rate=4.0, status="ok", attainment=0.99, holds=True)]
    assert bracket(probes) == (4.0, 8.0)
    assert next_rate(probes, KneeSettings()) == pytest.approx(math.sqrt(32))


@pytest.mark.parametrize("rate, num_prompts, probe_s, expected", [
    (math.inf, 500, 60.0, 500),  # the burst: every request at once, however many
    (5.0, 500, 60.0, 500),  # 500 requests arrive over 100 s: more than a minute already
    (46.5, 500, 60.0, 2790),  # 500 would arrive in 11 s, a transient the server's batch absorbs
    (0.3, 4, 10.0, 4),
    (2.01, 4, 10.0, 21),
])
def test_a_rated_probe_sends_at_least_probe_s_of_arrivals(rate, num_prompts, probe_s, expected):
    assert KneeSettings(probe_s=probe_s).requests_at(rate, num_prompts) == expected


def test_the_h100_flash_attn_search_finds_its_knee_above_the_bursts_throughput():
    """What minute-long probes measured on the H100 (FLASH_ATTN, 2026-11-27): 25.1 req/s at
    the burst, yet the server kept up with 34 req/s of Poisson arrivals (97% of the second
    half's arrivals completed in it) within the SLO; at 50 req/s it completed 41%."""
    rates = [(math.inf, 0.008, 25.12, None), (25.12, 0.999, 22.9, 0.984), (50.24, 0.103, 28.4, 0.413),
             (35.53, 0.720, 29.6, 0.886), (29.87, 0.998, 25.4, 0.980), (32.58, 0.977, 27.7, 0.978),
             (34.02, 0.910, 29.3, 0.967)]
    probes = [Probe(repeat=k, rate=r, status="ok", attainment=a, keep_up=u, request_throughput=x,
                    holds=a >= 0.9 and math.isfinite(r) and u >= 0.9) for k, (r, a, x, u) in enumerate(rates, start=1)]
    result = KneeResult.of("knee-flash", probes, KneeSettings(), ["p90 ttft <= 500 ms"], 0.9)
    assert result.burst_throughput == 25.12 and result.knee_rate == 34.02 and result.converged
    assert result.verdict == "knee 34 req/s: the SLO holds there and not at 35.5 req/s (7 probes)"


def test_a_probe_that_met_the_slo_while_a_queue_grew_does_not_hold():
    """500 requests at 46.5 req/s arrive in 11 s: the running batch takes them in and the SLO
    is met, yet the server completes only 70% of what arrives. Such a rate does not hold,
    and the verdict says why."""
    settings = KneeSettings()

    def probe(k, rate, attainment, keep_up):
        summary = RepeatSummary(repeat=k, request_rate=rate, status="ok", completed=500, duration=20.0,
                                request_throughput=25.0, keep_up=keep_up,
                                slo={"objectives": ["p90 ttft <= 500 ms"], "values_ms": {}, "within": {},
                                     "attainment": attainment, "target": 0.9, "holds": attainment >= 0.9})
        return Probe.of(summary, settings.keep_up)
    burst, queued, kept = probe(1, math.inf, 0.0, None), probe(2, 46.5, 0.97, 0.70), probe(3, 23.2, 0.99, 0.99)
    assert not burst.holds and not queued.holds and kept.holds
    assert probe(4, 30.0, 0.95, 0.91).holds and not probe(5, 30.0, 0.85, 1.0).holds
    assert [next_rate([burst], settings), next_rate([burst, queued], settings)] == [25.0, 23.25]
    result = KneeResult.of("knee", [burst, queued, kept], KneeSettings(max_probes=3), ["p90 ttft <= 500 ms"], 0.9)
    assert result.knee_rate == 23.2 and result.upper_rate == 46.5
    assert result.verdict.endswith("; at 46.5 req/s (r2) the SLO was met but the server completed only 70% of "
                                   "its arrivals: a queue was growing")


def test_the_search_path_survives_json():
    result = search(lambda r: 1.0 if r <= 3.3 else 0.2, 9.0)
    again = KneeResult.model_validate_json(result.model_dump_json())
    assert again == result and math.isinf(again.probes[0].rate)


def test_the_report_sets_throughput_energy_and_the_knee_side_by_side(tmp_path):
    """Knee runs of two backends (knee.json, recipe, provenance as the runner writes them):
    the report's knee table, and the two figures' data: the curves per probe, and per
    backend the burst's throughput, the knee and tokens per joule at the burst and the knee."""
    import json

    import yaml

    from attnbench.analysis.report import analyze, write_report
    from attnbench.runner.recipe import Recipe

    suite = tmp_path / "res" / "h100"
    for run, backend, knee, tpj in (("knee-flash", "FLASH_ATTN", 12.0, (10.9, 8.1)),
                                    ("knee-flex", "FLEX_ATTENTION", 3.1, (5.1, 3.9))):
        result = search(lambda r, k=knee: 1.0 if r <= k else 0.4, burst=knee * 1.6)
        probes = [p.model_copy(update={"output_throughput": 100 * p.request_throughput,
                                       "goodput": p.attainment * p.request_throughput,
                                       "keep_up": None if math.isinf(p.rate) else 0.97,
                                       "output_tokens_per_joule": tpj[0] if math.isinf(p.rate) else tpj[1]})
                  for p in result.probes]
        result = result.model_copy(update={"run": run, "probes": probes})
        (suite / run / "r1").mkdir(parents=True)
        (suite / run / "knee.json").write_text(result.model_dump_json())
        recipe = Recipe.model_validate({"name": run, "model": {"path": "/m/llama"}, "serve": {"attention_backend": backend},
                                        "benchmark": {"slo": {"objectives": ["p90 ttft <= 500 ms"]}, "knee": {}}})
        (suite / run / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
        (suite / run / "provenance.json").write_text(json.dumps({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}))
        (suite / run / "r1" / "summary.json").write_text(json.dumps({"run": run, "repeat": 1, "status": "ok"}))
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    runs = analysis.knees.set_index("run")
    assert runs.loc["knee-flash", "knee_rate"] == pytest.approx(12.0, rel=0.05)
    assert runs.loc["knee-flash", "knee_rate"] <= 12.0 and runs.loc["knee-flex", "knee_rate"] <= 3.1
    assert (runs.loc["knee-flex", "burst_tokens_per_joule"], runs.loc["knee-flex", "knee_tokens_per_joule"]) == (5.1, 3.9)
    assert runs.loc["knee-flash", "burst_output_throughput"] == pytest.approx(100 * 12.0 * 1.6)
    text = write_report(analysis, tmp_path / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| knee-flash |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    knee_output = f"{100 * runs.loc['knee-flash', 'knee_rate']:,.0f}"
    assert cells[:2] == ["knee-flash", "FLASH_ATTN"] and cells[5:] == ["yes", "97%", "1,920", knee_output, "10.9", "8.1"]
    assert cells[3] == f"{runs.loc['knee-flash', 'knee_rate']:.3g}"
    names = sorted(p.name for p in analysis.knee_figures["h100"])
    assert names == ["h100-knee-backends.csv", "h100-knee-backends.png", "h100-knee-backends.svg",
                     "h100-knee.csv", "h100-knee.png", "h100-knee.svg"]
    import pandas as pd
    curves = pd.read_csv(tmp_path / "figs" / "h100-knee.csv")
    assert len(curves) == sum(runs["probes"]) and set(curves["run"]) == {"knee-flash", "knee-flex"}
