"""The microbenchmark pipeline and the tuner, end to end on small cases (interpreter on CPU)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from attnbench.kernels.bench import implementations
from attnbench.kernels.bench.microbench import run_microbench
from attnbench.kernels.bench.spec import SpecError, load_microbench_spec
from attnbench.kernels.config import BatchShape, KernelConfig, Platform
from attnbench.kernels.dispatch.trees import load_tree
from attnbench.kernels.bench.reference import TOLERANCES
from attnbench.kernels.schema import MICROBENCH_FIELDS
from attnbench.kernels.bench.tune import FEATURES, SearchSpace, emit_python, features, fit_tree, shape_of, sweep
from kernel_checks import DEVICE

SUITE = {
    "name": "t", "heads": {"num_q_heads": 4, "num_kv_heads": 2, "head_size": 32}, "dtype": "float16",
    "block_size": 16, "timing": {"warmup_ms": 1, "rep_ms": 5, "cuda_graph": True},
    "implementations": ["qblock", "static_grid", "broken", "crashing", "qb-t16", "pt-rw2"],
    "configs": {"qb-t16": {"variant": "qblock", "tile_size": 16},
                "pt-rw2": {"variant": "parallel_tiled", "num_segments": 3, "reduce_num_warps": 2}},
    "cases": [{"name": "decode", "seqs": [{"count": 3, "query_len": 1, "context_len": 40}]},
              {"name": "prefill", "seqs": [{"query_len": 12, "context_len": 0}]}],
}


def suite_file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def broken_impls(monkeypatch):
    """Two implementations that must not be timed: one wrong, one that raises."""
    def broken(batch, config=None):
        return implementations.Prepared(lambda: torch.zeros_like(batch.q))

    def crashing(batch, config=None):
        raise RuntimeError("kernel exploded")

    monkeypatch.setitem(implementations.REGISTRY, "broken", broken)
    monkeypatch.setitem(implementations.REGISTRY, "crashing", crashing)


def test_microbench_checks_then_times_and_writes_the_schema(tmp_path, broken_impls, monkeypatch):
    import attnbench.kernels.bench.spec as spec

    monkeypatch.setattr(spec, "IMPLEMENTATIONS", spec.IMPLEMENTATIONS + ("broken", "crashing"))
    suite = load_microbench_spec(suite_file(tmp_path, SUITE))
    out = tmp_path / "mb.csv"
    rows = run_microbench(suite, out, device=DEVICE)
    with out.open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == MICROBENCH_FIELDS
        saved = list(reader)
    assert len(saved) == len(rows) == 2 * 6
    by = {(r["case"], r["implementation"]): r for r in saved}
    atol = TOLERANCES[torch.float16][0]
    for case in ("decode", "prefill"):
        for impl in ("qblock", "static_grid", "qb-t16", "pt-rw2"):
            r = by[(case, impl)]
            assert r["status"] == "ok" and float(r["median_us"]) > 0
            assert float(r["max_abs_err"]) < 4 * atol
            assert float(r["p20_us"]) <= float(r["median_us"]) <= float(r["p80_us"])
            assert r["l2_flush"] == "zero"  # do_bench's flush unless the suite says otherwise
            assert r["timing_rounds"] == "1"
        assert by[(case, "broken")]["status"] == "mismatch" and by[(case, "broken")]["median_us"] == ""
        assert by[(case, "crashing")]["status"] == "error" and "kernel exploded" in by[(case, "crashing")]["message"]
    assert '"tile_size": 16' in by[("decode", "qb-t16")]["config"]
    assert '"reduce_num_warps": 2' in by[("decode", "pt-rw2")]["config"]
    assert by[("prefill", "qblock")]["num_tokens"] == "12" and by[("decode", "qblock")]["decode_share"] == "1.0"


def test_rounds_take_the_implementations_in_turn_and_keep_each_ones_fastest(monkeypatch):
    """timing.rounds: round r times every implementation once, in order; each row keeps its
    fastest round's (median, p20, p80), and one that fails in a later round keeps no time."""
    from attnbench.kernels.bench import microbench
    from attnbench.kernels.bench.spec import Timing

    script = {"a": [(5.0, 4.0, 6.0), (3.0, 2.5, 3.5), (4.0, 3.0, 5.0)],
              "b": [(2.0, 1.0, 3.0), (6.0, 5.0, 7.0), (1.5, 1.4, 1.6)],
              "c": [(1.0, 1.0, 1.0), RuntimeError("lost the device"), (0.5, 0.5, 0.5)]}
    calls = []

    def fake_time_us(run, warmup_ms, rep_ms, device, l2_flush):
        name = run()
        calls.append(name)
        value = script[name][sum(c == name for c in calls) - 1]
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(microbench, "time_us", fake_time_us)
    rows = {n: {"implementation": n, "status": "ok"} for n in script}
    timed = [(rows[n], lambda n=n: n) for n in script]
    microbench.time_in_rounds(timed, Timing(rounds=3, cuda_graph=False), torch.device("cpu"))
    assert calls == ["a", "b", "c", "a", "b", "c", "a", "b"]  # c failed in round 2: not timed again
    assert (rows["a"]["median_us"], rows["a"]["p20_us"], rows["a"]["p80_us"]) == (3.0, 2.5, 3.5)
    assert (rows["b"]["median_us"], rows["b"]["p20_us"], rows["b"]["p80_us"]) == (1.5, 1.4, 1.6)
    assert rows["c"]["status"] == "error" and "lost the device" in rows["c"]["message"]
    assert "median_us" not in rows["c"]
    assert {r["timing_rounds"] for r in rows.values()} == {3}


def test_resume_runs_only_what_the_csv_lacks(tmp_path, monkeypatch):
    """--resume: a case's implementations with a row in --out (any status but error) are not
    run again; an interrupted run finishes where it stopped, each case with the seed it had;
    rows of another suite, or timed with another L2 flush, do not count; nothing runs once
    all are there."""
    from attnbench.kernels.bench import microbench

    calls, leases = [], iter(["ends in its second case", "lasts"])
    lease = next(leases)

    def fake_measure_case(suite, case, impls, device, ceilings, env, seed):
        calls.append((case.name, list(impls), seed))
        if case.name == "prefill" and lease.startswith("ends"):
            raise RuntimeError("the lease ended")
        return [{"suite": suite.name, "case": case.name, "implementation": i,
                 "status": "error" if i == "static_grid" else "ok"} for i in impls]

    monkeypatch.setattr(microbench, "measure_case", fake_measure_case)
    suite = load_microbench_spec(suite_file(tmp_path, dict(SUITE, implementations=["qblock", "static_grid"])))
    out = tmp_path / "mb.csv"
    microbench.CsvSink(out).write([{"suite": "other", "case": "prefill", "implementation": "qblock", "status": "ok"},
                                   {"suite": "t", "case": "prefill", "implementation": "qblock", "status": "ok",
                                    "l2_flush": "none"}])  # timed warm: not what this suite's flush measures
    with pytest.raises(RuntimeError, match="the lease ended"):
        run_microbench(suite, out, device="cpu")
    assert calls == [("decode", ["qblock", "static_grid"], suite.seed), ("prefill", ["qblock", "static_grid"], suite.seed + 1)]

    calls.clear()
    lease = next(leases)
    rows = run_microbench(suite, out, device="cpu", resume=True)
    assert calls == [("decode", ["static_grid"], suite.seed), ("prefill", ["qblock", "static_grid"], suite.seed + 1)]
    assert [(r["case"], r["implementation"]) for r in rows] == [("decode", "static_grid"), ("prefill", "qblock"),
                                                                ("prefill", "static_grid")]
    calls.clear()
    only_errors_left = run_microbench(suite, out, device="cpu", resume=True, implementations=["qblock"])
    assert only_errors_left == [] and calls == []
    with out.open() as fh:
        assert sum(r["suite"] == "t" for r in csv.DictReader(fh)) == 6


def test_resume_refuses_a_csv_of_another_schema(tmp_path):
    from attnbench.kernels.bench import microbench

    out = tmp_path / "old.csv"
    out.write_text("suite,case,implementation,median_us\nt,decode,qblock,1.0\n")
    with pytest.raises(ValueError, match="old.csv: its columns are another version's"):
        microbench.measured(out, "t", "zero")


MICROBENCH_SUITES = sorted(p for p in (Path(__file__).resolve().parents[1] / "recipes" / "microbench").glob("*.yaml")
                           if p.name != "tune-space.yaml")  # the tuner's search space: another schema


@pytest.mark.parametrize("path", MICROBENCH_SUITES, ids=lambda p: p.name)
def test_every_shipped_microbench_suite_loads(path):
    suite = load_microbench_spec(path)
    assert suite.all_cases() and suite.implementations  # hand-written cases and sweeps


def test_the_held_out_grid_covers_its_brief_and_shares_no_batch_with_what_is_fitted_or_read_off():
    """recipes/microbench/heldout.yaml stays a test: none of its batches (sequences, heads,
    page size, window, softcap) is in the shipped tree's training set or among the cases
    the hand-written rules' thresholds are read off; and it spans what issue 41 asks of it
    (40+ shapes; batches 1-256; 512 to 128k keys; 1, 2, 4 and 8 queries and chunks over long
    context; 1 to 32 query heads per KV head with 7; heads 64-256; pages of 16-64)."""
    root = Path(__file__).resolve().parents[1] / "recipes" / "microbench"

    def batches(name):
        suite = load_microbench_spec(root / name)
        for case in suite.all_cases():
            heads = case.heads or suite.heads
            yield case, (tuple(sorted(case.seq_list())), heads.num_q_heads, heads.num_kv_heads, heads.head_size,
                         case.block_size or suite.block_size, case.sliding_window, case.softcap)

    held_out = dict((key, case) for case, key in batches("heldout.yaml"))
    for fitted in ("llama3-8b-tune.yaml", "rules.yaml"):
        shared = [case.name for case, key in batches(fitted) if key in held_out]
        assert not shared, f"{fitted} holds held-out batches: {shared}"
    assert len(held_out) >= 40
    seqs = [key[0] for key in held_out]
    assert {len(s) for s in seqs} >= {1, 256} and min(map(len, seqs)) == 1
    keys = [q + k for s in seqs for q, k in s]
    assert min(max(q + k for q, k in s) for s in seqs) <= 512 and max(keys) >= 128 * 1024
    widths = {max(q for q, _ in s) for s in seqs}
    assert {1, 2, 4, 8} <= widths
    assert any(q > 16 and k >= 8192 for s in seqs for q, k in s)  # a chunk over a long prefix
    assert any(len({q + k for q, k in s}) > 1 for s in seqs)  # ragged lengths
    ratios = {key[1] // key[2] for key in held_out}
    assert {1, 7, 32} <= ratios
    assert {64, 96, 128, 256} <= {key[3] for key in held_out}
    assert {16, 32, 64} <= {key[4] for key in held_out}


def test_microbench_spec_errors_name_file_and_field(tmp_path):
    bad = dict(SUITE, implementations=["qblock", "flashy"])
    with pytest.raises(SpecError, match=r"(?s)suite.yaml.*implementations: unknown \['flashy'\]"):
        load_microbench_spec(suite_file(tmp_path, bad))
    bad = dict(SUITE, heads={"num_q_heads": 6, "num_kv_heads": 4, "head_size": 32})
    with pytest.raises(SpecError, match="(?s)heads.*must divide"):
        load_microbench_spec(suite_file(tmp_path, bad))
    bad = dict(SUITE, timing={"l2_flush": "write"})
    with pytest.raises(SpecError, match=r"(?s)suite.yaml.*timing.l2_flush.*'zero', 'read' or 'none'"):
        load_microbench_spec(suite_file(tmp_path, bad))


def test_the_l2_flush_and_the_rounds_are_suite_settings_and_cli_overrides(tmp_path):
    from click.testing import CliRunner

    from attnbench.kernels.bench.cli import microbench

    data = dict(SUITE, implementations=["qblock"], configs={}, timing=dict(SUITE["timing"], l2_flush="read"),
                cases=[{"name": "decode", "seqs": [{"count": 2, "query_len": 1, "context_len": 40}]}])
    path = suite_file(tmp_path, data)
    rows = run_microbench(load_microbench_spec(path), tmp_path / "read.csv", device=DEVICE)
    assert [r["l2_flush"] for r in rows] == ["read"]
    result = CliRunner().invoke(microbench, [str(path), "--out", str(tmp_path / "zero.csv"), "--device", DEVICE,
                                             "--l2-flush", "zero"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "zero.csv").open() as fh:
        assert [r["l2_flush"] for r in csv.DictReader(fh)] == ["zero"]
    result = CliRunner().invoke(microbench, [str(path), "--out", str(tmp_path / "warm.csv"), "--device", DEVICE,
                                             "--l2-flush", "none"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "warm.csv").open() as fh:
        assert [r["l2_flush"] for r in csv.DictReader(fh)] == ["none"]
    result = CliRunner().invoke(microbench, [str(path), "--out", str(tmp_path / "two.csv"), "--device", DEVICE,
                                             "--rounds", "2"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "two.csv").open() as fh:
        assert [(r["l2_flush"], r["timing_rounds"]) for r in csv.DictReader(fh)] == [("read", "2")]
    result = CliRunner().invoke(microbench, [str(path), "--out", str(tmp_path / "bad.csv"), "--rounds", "0"])
    assert result.exit_code == 2 and "--rounds" in result.output


def test_kernels_run_checks_one_case_for_a_profiler(tmp_path, broken_impls, monkeypatch):
    """`attnbench kernels run`: one implementation (or named config) on one case, checked
    against the reference before it runs for the profiler; a wrong one is refused, and an
    unknown case or implementation is named with the choices."""
    from click.testing import CliRunner

    import attnbench.kernels.bench.spec as spec
    from attnbench.kernels.bench.cli import kernels_group

    monkeypatch.setattr(spec, "IMPLEMENTATIONS", spec.IMPLEMENTATIONS + ("broken", "crashing"))
    path = suite_file(tmp_path, SUITE)

    def run(*args):
        return CliRunner().invoke(kernels_group, ["run", str(path), "--device", DEVICE, "--repeat", "2", *args])

    result = run("--case", "prefill", "--impl", "qb-t16")
    assert result.exit_code == 0, result.output
    assert "prefill qb-t16: attnbench qblock" in result.output and '"tile_size": 16' in result.output
    result = run("--case", "decode", "--impl", "broken")
    assert result.exit_code == 2 and "broken on decode: output differs from the fp32 reference" in result.output
    result = run("--case", "nope", "--impl", "qblock")
    assert result.exit_code == 2 and "--case: expected one of ['decode', 'prefill'], got 'nope'" in result.output
    result = run("--case", "decode", "--impl", "fa9")
    assert result.exit_code == 2 and "['fa9']: expected registered implementations" in result.output
    # a registered implementation the suite does not list by default runs when named
    result = run("--case", "decode", "--impl", "parallel_tiled")
    assert result.exit_code == 0, result.output
    assert "decode parallel_tiled: attnbench parallel_tiled" in result.output


def test_tuner_sweeps_fits_and_emits_working_heuristics(tmp_path):
    suite = load_microbench_spec(suite_file(tmp_path, dict(SUITE, implementations=["qblock"], configs={})))
    space = SearchSpace(variants={"qblock": {"tile_size": [16, 32], "num_warps": [4]},
                                  "static_grid": {"tile_size": [16], "num_segments": [1, 2]}})
    rows = sweep(suite, space, tmp_path / "tune.csv", device=DEVICE)
    assert len(rows) == 2 * 4 and all(r["status"] == "ok" for r in rows)
    tree, labels = fit_tree(rows, max_depth=2)
    module = tmp_path / "tuned_test_gpu.py"
    module.write_text(emit_python(tree, labels, "Test GPU", "tune.csv"))
    choose = load_tree(module)
    for shape in (BatchShape(3, 3, 1, 41, 4, 2, 32), BatchShape(1, 12, 12, 12, 4, 2, 32)):
        config = KernelConfig(**choose(shape, Platform("cuda", 132, "Test GPU")))
        assert config.as_dict() in [json.loads(lbl) for lbl in labels]
    for r in rows:  # a row's features give back a shape with the same features (what --against reads)
        assert features(shape_of(r)) == {f: r[f] for f in FEATURES}


def test_rows_name_the_kernel_that_ran_and_comparators_say_why_not(tmp_path):
    """SDPA names the backend it used (its fastest here), ours the step the heuristics
    picked and, for `auto`, why (in the CSV too); FA3 without vLLM's FlashAttention (any CPU
    host) is unavailable, saying why."""
    import csv

    data = dict(SUITE, implementations=["auto", "sdpa", "fa3", "qblock_wgmma"], configs={},
                cases=[{"name": "decode", "seqs": [{"count": 2, "query_len": 1, "context_len": 40}]}])
    rows = {r["implementation"]: r for r in run_microbench(load_microbench_spec(suite_file(tmp_path, data)),
                                                           tmp_path / "mb.csv", device=DEVICE)}
    assert rows["auto"]["status"] == "ok" and rows["auto"]["kernel"].startswith("attnbench auto -> ")
    written = {r["implementation"]: r for r in csv.DictReader((tmp_path / "mb.csv").open())}
    if DEVICE == "cpu":  # the interpreter's platform: no fitted tree, no sm_90
        assert written["auto"]["why"] == rows["auto"]["why"] == "the qblock step's own tree"
    assert written["auto"]["why"] and written["sdpa"]["why"] == ""
    assert rows["sdpa"]["status"] == "ok" and rows["sdpa"]["kernel"].startswith("SDPA ")
    assert rows["sdpa"]["kernel"].split()[1] in implementations.SDPA_BACKENDS.values()
    fa3 = rows["fa3"]
    if fa3["status"] == "ok":  # a Hopper GPU with vLLM
        assert DEVICE != "cpu" and fa3["kernel"].startswith("FlashAttention 3")
    else:
        assert fa3["status"] == "unavailable" and "FlashAttention" in fa3["message"], fa3
    wgmma = rows["qblock_wgmma"]  # the Gluon kernel: Hopper only, head sizes 64 and 128
    assert wgmma["status"] == "unavailable" and "qblock_wgmma" in wgmma["message"], wgmma
    assert "sm_90" in wgmma["message"] or "head size 32" in wgmma["message"]


def test_an_older_csv_is_not_appended_to(tmp_path):
    from attnbench.kernels.bench.microbench import CsvSink

    old = tmp_path / "old.csv"
    old.write_text(",".join(f for f in MICROBENCH_FIELDS if f != "kernel") + "\n")
    with pytest.raises(ValueError, match="old.csv: its columns are another version's"):
        CsvSink(old)


def test_the_shipped_search_space_holds_the_gluon_kernel_once_per_tile_and_launch():
    """tune-space.yaml: Triton's 16 qblock configs, and the Gluon kernel with its fixed warps
    and stages at both tile sizes, one program per item or persistent (no aliases of one launch)."""
    from attnbench.kernels.bench.tune import load_space

    configs = list(load_space("recipes/microbench/tune-space.yaml").configs())
    gluon = [c for c in configs if c.variant == "qblock_ws"]
    assert len([c for c in configs if c.variant == "qblock"]) == 16
    assert sorted((c.tile_size, c.persistent) for c in gluon) == [(64, False), (64, True), (128, False), (128, True)]
    assert all((c.block_m, c.num_warps, c.num_stages) == (128, 12, 2) for c in gluon)


def test_a_tuned_gluon_choice_yields_where_gluon_cannot_run(monkeypatch):
    """A tree fitted on an H100 may pick the Gluon kernel; where Gluon is off (here
    ATTNBENCH_GLUON=0) the qblock step's own Triton config runs instead, and Triton
    choices of the tree stand."""
    from attnbench.kernels.config import BatchShape, Platform
    from attnbench.kernels.dispatch import heuristics, trees

    gluon = {"variant": "qblock_ws", "tile_size": 64, "block_m": 128, "num_warps": 12}
    triton = {"variant": "qblock", "tile_size": 128, "block_m": 16, "num_warps": 8}
    monkeypatch.setattr(trees, "tuned_tree",
                        lambda name: lambda shape, p: gluon if shape.max_seqlen_q > 1 else triton)
    h100 = Platform("cuda", 132, "NVIDIA H100 80GB HBM3", "sm_90")
    prefill, decode = BatchShape(1, 4096, 4096, 4096, 32, 8, 128), BatchShape(8, 8, 1, 4096, 32, 8, 128)
    monkeypatch.setattr(heuristics.hopper, "available", lambda: True)
    assert heuristics.choose_config(prefill, h100).variant == "qblock_ws"
    monkeypatch.setenv("ATTNBENCH_GLUON", "0")
    config = heuristics.choose_config(prefill, h100)
    assert config == heuristics.step("qblock").default_config(prefill, h100) and config.variant == "qblock"
    assert heuristics.choose_config(decode, h100).tile_size == 128


def test_the_fitted_tree_picks_by_slowdown_not_by_which_near_tie_won(tmp_path):
    """Cases a and b are near-ties between configs x and y (within 2%), c wants z and
    fails on y: the tree runs y on a and b (least mean slowdown: one config, no split
    between them) and z on c; the emitted module has that one split, and the regret rows
    say what each pick costs. Read back on the rows (`attnbench tune --against`), the
    module picks as the tree did; a tree whose pick the sweep did not time says so."""
    from click.testing import CliRunner

    from attnbench.kernels.bench.cli import tune as tune_command
    from attnbench.kernels.bench.tune import describe_total, module_picks, regret

    def rows_of(case, kv_len, times):
        facts = {f: 1 for f in FEATURES} | {"max_seqlen_k": kv_len}
        return [{"case": case, "config": json.dumps({"variant": "qblock", "tile_size": tile}),
                 "status": "ok" if t else "mismatch", "median_us": t or "", **facts} for tile, t in times.items()]

    x, y, z = 16, 32, 64  # the configs, by tile size
    rows = (rows_of("a", 100, {x: 100.0, y: 101.0, z: 300.0}) + rows_of("b", 200, {x: 102.0, y: 100.0, z: 300.0})
            + rows_of("c", 900, {x: 500.0, y: None, z: 100.0}))
    tree, labels = fit_tree(rows, max_depth=3)
    picks = {p["case"]: (json.loads(p["picked"])["tile_size"], p["picked_us"], p["best_us"])
             for p in regret(tree, labels, rows)}
    assert picks == {"a": (y, 101.0, 100.0), "b": (y, 100.0, 100.0), "c": (z, 100.0, 100.0)}
    source = emit_python(tree, labels, "Test GPU", "t.csv", regret(tree, labels, rows))
    assert source.count("if f[") == 1 and "if f['max_seqlen_k'] <= 550:" in source
    assert "* a: fastest 100.0 us; the tree's pick 101.0 us (+1.0%)" in source
    assert describe_total(regret(tree, labels, rows)) == ("picks summed over 3 cases: 301.0 us "
                                                          "(fastest per case: 300.0 us); worst +1.0% (a)")

    # the emitted module, read back on the rows (`attnbench tune --against`), picks as the tree
    module = tmp_path / "tuned_test_gpu.py"
    module.write_text(source)
    assert {p["case"]: p["picked_us"] for p in module_picks(load_tree(module), rows)} == {"a": 101.0, "b": 100.0, "c": 100.0}
    always_y = module_picks(lambda shape, platform: {"variant": "qblock", "tile_size": y}, rows)
    assert describe_total(always_y) == ("picks summed over 2 cases: 201.0 us (fastest per case: 200.0 us); "
                                        "worst +1.0% (a); not timed correctly in the sweep: c")
    csv_rows = tmp_path / "rows.csv"
    with csv_rows.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    suite = suite_file(tmp_path, dict(SUITE, implementations=["qblock"], configs={}))
    args = [str(suite), "--space", str(suite), "--rows", str(csv_rows), "--no-sweep", "--against"]
    result = CliRunner().invoke(tune_command, args + [str(module)])
    assert result.exit_code == 0, result.output
    assert "tuned_test_gpu.py: picks summed over 3 cases: 301.0 us (fastest per case: 300.0 us)" in result.output
    result = CliRunner().invoke(tune_command, args + [str(csv_rows)])
    assert result.exit_code == 2 and f"--against {csv_rows}: not a Python file; expected a tree" in result.output
