"""SLOs at a percentile (runner/slo.py): the form users write, attainment counted against
every measured request, the recipe field, `attnbench load --slo` and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from attnbench.runner.loadgen import RequestRecord
from attnbench.runner.recipe import Recipe
from attnbench.runner.slo import Objective, Slo
from attnbench.runner.summary import RepeatHeader, summarize_repeat


@pytest.mark.parametrize("text, expected", [
    ("p90 ttft <= 500 ms", ("ttft", 90.0, 500.0)),
    ("P99.9 TPOT<=12.5ms", ("tpot", 99.9, 12.5)),
    ("  p50   e2el <=  2000 ms ", ("e2el", 50.0, 2000.0)),
])
def test_objectives_read_as_users_write_them(text, expected):
    o = Objective.parse(text)
    assert (o.metric, o.percentile, o.limit_ms) == expected
    assert Objective.parse(str(o)) == o  # its own spelling reads back


@pytest.mark.parametrize("text, message", [
    ("p90 ttft < 500 ms", "expected 'pNN METRIC <= LIMIT ms' with METRIC one of ttft, tpot, e2el"),
    ("p90 ttft <= 500", "expected 'pNN METRIC <= LIMIT ms'"),
    ("ttft <= 500 ms", "expected 'pNN METRIC <= LIMIT ms'"),
    ("p90 itl <= 50 ms", "metric 'itl' is not one of ttft, tpot, e2el"),
    ("p100 ttft <= 50 ms", "the percentile must lie between 0 and 100"),
    ("p0 ttft <= 50 ms", "the percentile must lie between 0 and 100"),
    ("p90 ttft <= 0 ms", "the limit must be above 0 ms"),
])
def test_a_bad_objective_says_what_was_expected(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Objective.parse(text)


def lat(ttft, tpot):
    return {"ttft": ttft, "tpot": tpot, "e2el": None}


def test_attainment_counts_every_measured_request_and_the_target_defaults_to_the_highest_percentile():
    rng = np.random.default_rng(7)
    ttft, tpot = rng.gamma(2.0, 150.0, 200), rng.gamma(4.0, 10.0, 200)
    per = [lat(a, b) for a, b in zip(ttft, tpot)]
    slo = Slo(objectives=["p90 ttft <= 500 ms", "p95 tpot <= 60 ms"])
    assert slo.attainment_target == 0.95
    r = slo.evaluate(per, measured=210)  # 10 more were sent and failed: they meet nothing
    within_both = int(np.sum((ttft <= 500) & (tpot <= 60)))
    assert r.attainment == pytest.approx(within_both / 210)
    assert r.values_ms == {"p90 ttft <= 500 ms": pytest.approx(np.percentile(ttft, 90)),
                           "p95 tpot <= 60 ms": pytest.approx(np.percentile(tpot, 95))}
    assert r.within == {"p90 ttft <= 500 ms": bool(np.percentile(ttft, 90) <= 500),
                        "p95 tpot <= 60 ms": bool(np.percentile(tpot, 95) <= 60)}
    assert r.holds == (r.attainment >= 0.95) and r.target == 0.95


def test_a_request_without_a_tpot_does_not_meet_a_tpot_objective():
    slo = Slo(objectives=["p50 tpot <= 10 ms"], target=0.5)
    r = slo.evaluate([lat(1, None), lat(1, 5.0)], measured=2)  # a one-token request has no TPOT
    assert r.attainment == 0.5 and r.holds and r.values_ms == {"p50 tpot <= 10 ms": 5.0}


def test_nothing_measured_attains_nothing():
    r = Slo(objectives=["p90 ttft <= 1 ms"]).evaluate([], measured=0)
    assert r.attainment == 0.0 and not r.holds and r.values_ms == {"p90 ttft <= 1 ms": None}
    assert r.within == {"p90 ttft <= 1 ms": False}


def recipe(slo) -> dict:
    return {"name": "r", "model": {"path": "/m"}, "benchmark": {"slo": slo}}


def test_the_recipe_keeps_objectives_as_stated():
    r = Recipe.model_validate(recipe({"objectives": ["p90 ttft <= 500 ms", "p90 tpot <= 50 ms"], "target": 0.8}))
    dumped = r.model_dump(mode="json")["benchmark"]["slo"]
    assert dumped == {"objectives": ["p90 ttft <= 500 ms", "p90 tpot <= 50 ms"], "target": 0.8}
    assert Recipe.model_validate(r.model_dump(mode="json")) == r


@pytest.mark.parametrize("slo, message", [
    ({"objectives": ["p90 ttft < 500 ms"]}, "benchmark.slo.objectives: [0]: expected 'pNN METRIC <= LIMIT ms'"),
    ({"objectives": []}, "benchmark.slo.objectives: List should have at least 1 item"),
    ({"objectives": ["p90 ttft <= 5 ms", "p99 ttft <= 9 ms"]}, "one objective per metric"),
    ({"objectives": ["p90 ttft <= 5 ms"], "target": 1.5}, "benchmark.slo.target: Input should be less than or equal to 1"),
    ({"objectives": ["p90 ttft <= 5 ms"], "percentile": 90}, "benchmark.slo.percentile: Extra inputs are not permitted"),
])
def test_bad_slo_values_are_one_line_naming_the_field(tmp_path, slo, message):
    from attnbench.runner.recipe import RecipeError, load_suite

    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "s", "runs": [recipe(slo)]}))
    with pytest.raises(RecipeError) as e:
        load_suite(path)
    problem = [line for line in str(e.value).splitlines() if "benchmark.slo" in line]
    assert len(problem) == 1 and message in problem[0], str(e.value)
    with pytest.raises(ValidationError):
        Recipe.model_validate(recipe(slo))


def records(ttfts_ms, failed=0):
    out = []
    for i, ttft in enumerate(ttfts_ms):
        chunks = [ttft / 1e3 + k * 0.01 for k in range(4)]
        out.append(RequestRecord(i, "measure", 10, 4, 0.0, dispatch_s=0.0, sent_s=0.0, chunk_s=chunks,
                                 chunk_tokens=[1] * 4, end_s=chunks[-1], prompt_tokens=10, completion_tokens=4))
    for j in range(failed):
        out.append(RequestRecord(len(out), "measure", 10, 4, 0.0, dispatch_s=0.0, sent_s=0.0, end_s=0.1,
                                 status="error", error="HTTP 500"))
    return out


def test_a_repeats_summary_carries_its_slo():
    slo = Slo(objectives=["p50 ttft <= 150 ms"], target=0.5)
    s = summarize_repeat(records([100, 120, 200, 300], failed=1), RepeatHeader(), slo=slo)
    assert s.slo.attainment == pytest.approx(2 / 5) and not s.slo.holds
    assert s.slo.values_ms == {"p50 ttft <= 150 ms": pytest.approx(160.0)}
    assert s.as_json()["slo"]["objectives"] == ["p50 ttft <= 150 ms"]


def test_attnbench_load_reports_attainment(tmp_path):
    from attnbench.cli import main
    from attnbench.runner.calibrate import StubServer
    from attnbench.runner.models import write_tiny_model

    tiny = write_tiny_model(tmp_path / "tiny")
    with StubServer() as url:
        result = CliRunner().invoke(main, [
            "load", "--url", url, "--model", "m", "--tokenizer", str(tiny), "--num-prompts", "6",
            "--output-len", "8", "--slo", "p90 ttft <= 60000 ms", "--slo", "p90 tpot <= 60000 ms",
            "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    slo = json.loads((tmp_path / "out" / "summary.json").read_text())["slo"]
    assert slo["attainment"] == 1.0 and slo["holds"] and slo["target"] == 0.9
    assert json.loads(result.output.strip().splitlines()[-1])["slo_attainment"] == 1.0


def test_the_report_gives_attainment_and_names_the_objectives(tmp_path):
    from attnbench.analysis.report import analyze, write_report
    from attnbench.runner.store import ResultsStore

    store = ResultsStore(tmp_path / "res", "knee")
    slo = Slo(objectives=["p50 ttft <= 150 ms"], target=0.5)
    rec = Recipe.model_validate({"name": "a", "model": {"path": "/m"}}).model_dump(mode="json")
    store.write_run_meta("a", rec, {"gpus": [{"name": "GPU"}]})
    for k, ttfts in enumerate(([100, 120, 200, 300], [100, 110, 120, 300]), start=1):
        recs = records(ttfts)
        with store.requests_writer("a", k) as w:
            for r in recs:
                w(r)
        store.write_summary("a", k, summarize_repeat(recs, RepeatHeader(suite="knee", run="a", repeat=k), slo=slo,
                                                     digest=w.digest()))
    analysis = analyze([tmp_path / "res"], tmp_path / "figs")
    assert analysis.agg.set_index("run").loc["a", "slo_attainment_pct"] == pytest.approx(62.5)  # 50% and 75%
    text = write_report(analysis, tmp_path / "r.md").read_text()
    assert "SLO %" in text and "62.5" in text
    assert "- SLO p50 ttft <= 150 ms (target 50%) for `a`: the SLO % column is the share" in text
