"""Recipe and suite loading: every shipped suite validates; bad ones fail naming file, field, value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from attnbench.runner.recipe import ENGINE_PRESETS, RecipeError, load_suite
from attnbench.runner.server import graph_mode_args

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_suites_validate(path):
    suite = load_suite(path)
    assert suite.runs and suite.name


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


BASE = {"name": "t", "defaults": {"model": {"path": "/m", "served_name": "m"}}, "runs": [{"name": "a"}]}


def test_defaults_merge_and_engine_presets(tmp_path):
    data = {**BASE, "runs": [{"name": "v0", "serve": {"engine": "v0-style"}},
                             {"name": "v1", "serve": {"engine": "v1", "max_num_seqs": 8}}]}
    suite = load_suite(write(tmp_path, data))
    v0, v1 = suite.runs
    assert v0.model.path == "/m" and v1.model.name == "m"
    assert v0.serve.resolved("max_num_seqs") == ENGINE_PRESETS["v0-style"]["max_num_seqs"] == 256
    assert v0.serve.resolved("enable_chunked_prefill") is False
    assert v1.serve.resolved("max_num_seqs") == 8  # explicit beats the preset
    assert v1.serve.resolved("max_num_batched_tokens") == 8192


def test_matrix_expands_into_named_runs(tmp_path):
    data = {**BASE, "runs": [{"name": "be", "matrix": {"serve.attention_backend": ["TRITON_ATTN", "FLASH_ATTN"],
                                                      "benchmark.max_concurrency": [8, 64]}}]}
    names = [r.name for r in load_suite(write(tmp_path, data)).runs]
    assert names == ["be-triton-attn-8", "be-triton-attn-64", "be-flash-attn-8", "be-flash-attn-64"]
    run = load_suite(write(tmp_path, data)).runs[1]
    assert run.serve.attention_backend == "TRITON_ATTN" and run.benchmark.max_concurrency == 64


@pytest.mark.parametrize("change, words", [
    ({"runs": [{"name": "a", "serve": {"max_num_seq": 8}}]}, ["serve.max_num_seq", "Extra inputs"]),
    ({"runs": [{"name": "a", "serve": {"max_num_seqs": "many"}}]}, ["serve.max_num_seqs", "'many'"]),
    ({"runs": [{"name": "a", "serve": {"graph_mode": "cuda"}}]}, ["serve.graph_mode", "'cuda'"]),
    ({"runs": [{"name": "a", "benchmark": {"dataset": {"kind": "sharegpt"}}}]}, ["benchmark.dataset", "path"]),
    ({"runs": [{"name": "a", "benchmark": {"request_rate": -1}}]}, ["benchmark.request_rate", "-1"]),
    ({"runs": [{"name": "a", "serve": {"launcher": "docker"}}]}, ["serve", "image"]),
    ({"runs": [{"name": "a", "model": {"path": "/m", "build": "large"}}]}, ["model.build", "'large'"]),
    ({"runs": [{"name": "a"}, {"name": "a"}]}, ["unique", "'a'"]),
    ({"runs": [{"serve": {}}]}, ["runs[0]", "name"]),
    ({"runz": []}, ["unknown top-level keys", "runz"]),
    ({"runs": [{"name": "a", "matrix": {"serve.port": 80}}]}, ["runs[0].matrix"]),
    ({"runs": [{"name": "a", "serve": {"extra_args": ["--api-server-count", "2"]}}]},
     ["serve.extra_args", "'--api-server-count'", "set serve.api_server_count"]),
    ({"runs": [{"name": "a", "serve": {"extra_args": ["--max-model-len=4096"]}}]},
     ["serve.extra_args", "set serve.max_model_len"]),
    ({"runs": [{"name": "a", "serve": {"extra_args": ["--model", "x"]}}]}, ["set model.path"]),
    ({"runs": [{"name": "a", "serve": {"api_server_count": 0}}]}, ["api_server_count", "greater than or equal to 1"]),
    ({"runs": [{"name": "a", "serve": {"engine": "v0", "api_server_count": 2}}]}, ["engine 'v0'", "api_server_count 2"]),
])
def test_bad_suites_name_file_field_and_value(tmp_path, change, words):
    data = {**BASE, **change}
    path = write(tmp_path, data)
    with pytest.raises(RecipeError) as info:
        load_suite(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(RecipeError, match="no such suite file"):
        load_suite(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_suite(bad)


def test_select_unknown_run(tmp_path):
    suite = load_suite(write(tmp_path, BASE))
    with pytest.raises(RecipeError, match="no run named"):
        suite.select(["zzz"])


def test_graph_modes_map_to_vllm_flags():
    assert graph_mode_args("eager") == ["--enforce-eager"]
    assert graph_mode_args("full_decode_only") == ["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}']
    assert graph_mode_args(None) == []


def test_recipe_hash_changes_with_any_setting(tmp_path):
    a = load_suite(write(tmp_path, BASE)).runs[0]
    b = load_suite(write(tmp_path, {**BASE, "runs": [{"name": "a", "benchmark": {"seed": 1}}]})).runs[0]
    assert a.digest() != b.digest() and len(a.digest()) == 64


def test_include_merges_defaults_prefixes_and_filters(tmp_path):
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({
        "name": "exp", "defaults": {"model": {"path": "org/big", "arch": "llama-3.1-8b"},
                                    "serve": {"max_model_len": 4096}},
        "runs": [{"name": "a", "matrix": {"benchmark.seed": [1, 2]}}, {"name": "b"}]}, sort_keys=False))
    platform = {"name": "plat", "defaults": {"serve": {"env": {"X": "1"}, "max_model_len": 1024}},
                "include": [{"file": "exp.yaml", "prefix": "e", "only": ["a"],
                             "defaults": {"benchmark": {"num_prompts": 7}}}]}
    suite = load_suite(write(tmp_path, platform))
    assert [r.name for r in suite.runs] == ["e-a-1", "e-a-2"]
    run = suite.runs[0]
    assert run.serve.env == {"X": "1"}           # platform default
    assert run.serve.max_model_len == 4096       # the included suite's default wins over the platform's
    assert run.benchmark.num_prompts == 7        # the include entry's override wins over both


def test_include_errors_name_the_entry(tmp_path):
    with pytest.raises(RecipeError, match=r"include\[0\].file: no such suite file"):
        load_suite(write(tmp_path, {"name": "p", "include": [{"file": "missing.yaml"}]}))
    with pytest.raises(RecipeError, match=r"include\[0\]: unknown keys \['prefx'\]"):
        load_suite(write(tmp_path, {"name": "p", "include": [{"file": "x.yaml", "prefx": "a"}]}))


def test_dummy_models_and_sharegpt_switches(tmp_path):
    data = {"name": "t", "defaults": {"model": {"path": "meta-llama/Llama-3.1-8B-Instruct", "served_name": "l",
                                                "arch": "llama-3.1-8b"}},
            "runs": [{"name": "a"}, {"name": "tiny", "model": {"path": "/x", "build": "tiny", "arch": None}}]}
    suite = load_suite(write(tmp_path, data)).with_dummy_models(tmp_path / "models")
    dummy, tiny = suite.runs
    assert dummy.model.path == str(tmp_path / "models" / "llama-3.1-8b")
    assert dummy.model.build == "dummy:llama-3.1-8b" and dummy.serve.load_format == "dummy"
    assert dummy.model.name == "l"
    assert tiny.model.path == "/x" and tiny.serve.load_format is None  # no arch: untouched
    shared = suite.with_sharegpt("/data/sg.json").runs[0].benchmark.dataset
    assert shared.kind == "sharegpt" and shared.path == "/data/sg.json"


def test_unknown_arch_is_rejected(tmp_path):
    with pytest.raises(RecipeError, match="model.arch.*'gpt-9'"):
        load_suite(write(tmp_path, {**BASE, "runs": [{"name": "a", "model": {"path": "/m", "arch": "gpt-9"}}]}))


def _custom(serve: dict) -> dict:
    return {**BASE, "runs": [{"name": "a", "serve": {"attention_backend": "CUSTOM", **serve}}]}


def test_kernel_variant_is_checked_when_the_recipe_loads(tmp_path):
    """A typo in the kernel step fails at load time, naming the field and the choices,
    not inside a server two minutes into its start."""
    assert load_suite(write(tmp_path, _custom({"kernel_variant": "static_grid"}))).runs[0].serve.kernel_variant \
        == "static_grid"
    with pytest.raises(RecipeError, match=r"(?s)suite\.yaml.*serve\.kernel_variant: expected one of \['auto', "
                                          r"'naive', 'qblock', 'parallel_tiled', 'static_grid', 'qblock_ws'\] \(got 'static-grid'\)"):
        load_suite(write(tmp_path, _custom({"kernel_variant": "static-grid"})))
    with pytest.raises(RecipeError, match="(?s)kernel_variant 'qblock' picks a step of attnbench's kernels, which "
                                          "serve only as attention_backend 'CUSTOM'"):
        load_suite(write(tmp_path, {**BASE, "runs": [{"name": "a", "serve": {"attention_backend": "FLASH_ATTN",
                                                                             "kernel_variant": "qblock"}}]}))


def test_the_older_env_spelling_is_read_and_checked_the_same(tmp_path):
    """``env: {ATTNBENCH_VARIANT: ...}`` becomes kernel_variant (same run, same recipe hash);
    a typo there fails the same way; the server gets the variable either way."""
    from attnbench.runner.server import server_env

    old = load_suite(write(tmp_path, _custom({"env": {"ATTNBENCH_VARIANT": "naive", "X": "1"}}))).runs[0]
    new = load_suite(write(tmp_path, _custom({"kernel_variant": "naive", "env": {"X": "1"}}))).runs[0]
    assert old.serve.kernel_variant == "naive" and old.serve.env == {"X": "1"}
    assert old.digest() == new.digest()
    assert server_env(old) == server_env(new) == {"X": "1", "ATTNBENCH_VARIANT": "naive"}
    with pytest.raises(RecipeError, match=r"env\.ATTNBENCH_VARIANT: expected one of \['auto', .*got 'flash'"):
        load_suite(write(tmp_path, _custom({"env": {"ATTNBENCH_VARIANT": "flash"}})))
    with pytest.raises(RecipeError, match="kernel_variant 'qblock' and env.ATTNBENCH_VARIANT 'naive' disagree"):
        load_suite(write(tmp_path, _custom({"kernel_variant": "qblock", "env": {"ATTNBENCH_VARIANT": "naive"}})))
    plain = load_suite(write(tmp_path, _custom({}))).runs[0]
    assert plain.serve.kernel_variant is None and "ATTNBENCH_VARIANT" not in server_env(plain)  # the plugin: auto


def test_client_processes_is_a_count_or_auto(tmp_path):
    def with_processes(value):
        return {**BASE, "runs": [{"name": "a", "benchmark": {"client_processes": value}}]}

    assert load_suite(write(tmp_path, BASE)).runs[0].benchmark.client_processes == "auto"
    assert load_suite(write(tmp_path, with_processes(4))).runs[0].benchmark.client_processes == 4
    for bad in (0, 65, "many"):
        with pytest.raises(RecipeError, match="client_processes"):
            load_suite(write(tmp_path, with_processes(bad)))
