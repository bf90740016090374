"""The knee search (runner/knee.py) against servers whose knee is known: within the
tolerance in at most 8 probes for knees between a quarter of the capacity and the
capacity, an honest verdict elsewhere, the path kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbench.runner.knee import KneeResult, KneeSettings, Probe, bracket, next_rate


def search(attainment, capacity: float, target: float = 0.9, settings: KneeSettings = KneeSettings(),
           status=lambda rate: "ok") -> KneeResult:
    """Run the search against ``attainment(rate)`` (the burst's rate is inf)."""
    probes: list[Probe] = []
    while (rate := next_rate(probes, settings)) is not None:
        a = attainment(rate)
        probes.append(Probe(repeat=len(probes) + 1, rate=rate, status=status(rate), attainment=a,
                            holds=a >= target and status(rate) == "ok",
                            request_throughput=capacity if math.isinf(rate) else min(rate, capacity)))
    return KneeResult.of("run", probes, settings, ["p90 ttft <= 500 ms"], target)


@pytest.mark.parametrize("share", np.random.default_rng(44).uniform(0.26, 0.99, 12).round(3))
def test_a_knee_between_a_quarter_of_capacity_and_capacity_is_found_in_8_probes(share):
    capacity = 37.0
    knee = share * capacity
    result = search(lambda rate: 1.0 if rate <= knee else 0.5, capacity)
    assert result.converged and len(result.probes) <= 8, result.verdict
    assert knee * 0.95 <= result.knee_rate <= knee  # a measured rate that held, within 5% below
    assert result.upper_rate > knee and result.upper_rate <= result.knee_rate * 1.05
    assert math.isinf(result.probes[0].rate) and result.probes[1].rate == capacity
    assert result.verdict.startswith(f"knee {result.knee_rate:.3g} req/s")


def test_a_smooth_attainment_curve_meets_its_target_at_the_knee():
    capacity, true_knee, width = 20.0, 13.0, 1.0
    middle = true_knee + width * math.log(9)  # a logistic fall with load, 0.9 exactly at the true knee

    def attainment(rate):
        return 1 / (1 + math.exp((rate - middle) / width))
    assert attainment(true_knee) == pytest.approx(0.9)
    result = search(lambda r: 0.0 if math.isinf(r) else attainment(r), capacity)
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
    assert result.verdict == "the SLO holds even at a burst: the knee is at or above the capacity, 25 req/s"


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


def test_a_knee_above_the_bursts_capacity_is_not_reported_as_found():
    """What 500 requests per probe measured on the H100 (FLASH_ATTN, 2026-11-27): capacity
    25.3 req/s at the burst, yet the SLO 'held' at 46.5 req/s, 11 s of arrivals that the
    server's batch took in. Such a knee is a transient, and the verdict says so."""
    rates = [(math.inf, 0.036, 25.34), (25.34, 1.0, 18.4), (50.67, 0.664, 22.9), (35.83, 1.0, 21.0),
             (42.61, 0.972, 21.9), (46.47, 0.978, 22.7), (48.52, 0.792, 22.8)]
    probes = [Probe(repeat=k, rate=r, status="ok", attainment=a, holds=a >= 0.9 and math.isfinite(r),
                    request_throughput=x) for k, (r, a, x) in enumerate(rates, start=1)]
    result = KneeResult.of("knee-flash", probes, KneeSettings(), ["p90 ttft <= 500 ms"], 0.9)
    assert result.capacity == 25.34 and result.knee_rate == 46.47 and not result.converged
    assert result.verdict == ("knee 46.5 req/s: the SLO holds there and not at 48.5 req/s (7 probes); but that is "
                              "above the 25.3 req/s the server completes at a burst, a rate it cannot sustain: "
                              "longer probes (benchmark.knee.probe_s) will find the knee lower")
    at_capacity = search(lambda r: 1.0 if r <= 26.0 else 0.0, 25.0)  # the burst's capacity held: a knee
    assert at_capacity.converged and at_capacity.knee_rate == at_capacity.capacity == 25.0


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
        result = search(lambda r, k=knee: 1.0 if r <= k else 0.4, capacity=knee * 1.6)
        probes = [p.model_copy(update={"output_throughput": 100 * p.request_throughput,
                                       "goodput": p.attainment * p.request_throughput,
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
    assert cells[:2] == ["knee-flash", "FLASH_ATTN"] and cells[5:] == ["yes", "1,920", "10.9", "8.1"]
    assert cells[3] == f"{runs.loc['knee-flash', 'knee_rate']:.3g}"
    names = sorted(p.name for p in analysis.knee_figures["h100"])
    assert names == ["h100-knee-backends.csv", "h100-knee-backends.png", "h100-knee-backends.svg",
                     "h100-knee.csv", "h100-knee.png", "h100-knee.svg"]
    import pandas as pd
    curves = pd.read_csv(tmp_path / "figs" / "h100-knee.csv")
    assert len(curves) == sum(runs["probes"]) and set(curves["run"]) == {"knee-flash", "knee-flex"}
