"""Every command of `attnbench`, driven with bad arguments and bad inputs: each ends with
its exit code and one line that names the file, field or option and what was expected,
never a traceback (docs/running.md)."""

from __future__ import annotations

import errno
import json
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.runner.models import write_tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Files the table refers to by name (``{name}`` in an argument)."""
    d = tmp_path_factory.mktemp("inputs")
    tok = write_tiny_model(d / "tiny")
    files = {
        "missing": d / "missing.yaml", "dir": d / "folder", "bad_yaml": d / "bad.yaml", "list_yaml": d / "list.yaml",
        "unknown_key": d / "unknown.yaml", "suite": d / "suite.yaml", "nvidia_suite": d / "nvidia.yaml",
        "no_tokenizer_suite": d / "notok.yaml", "text": d / "notes.txt", "empty_csv": d / "empty.csv",
        "wrong_csv": d / "wrong.csv", "not_json": d / "bench.json", "few_sharegpt": d / "few.json",
        "bad_micro": d / "micro.yaml", "bad_space": d / "space.yaml", "slash_name": d / "slash.yaml",
        "empty_dir": d / "empty", "out": d / "out", "binary": d / "binary.yaml",
    }
    files["dir"].mkdir()
    files["empty_dir"].mkdir()
    files["bad_yaml"].write_text("name: [unclosed\n")
    files["binary"].write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)))
    files["list_yaml"].write_text("- a\n- b\n")
    files["unknown_key"].write_text("name: s\nruns: [{name: r}]\nwhatever: 1\n")
    base = {"model": {"path": str(tok), "served_name": "tiny"}, "serve": {"gpu_vendor": "none"},
            "benchmark": {"num_prompts": 4, "dataset": {"kind": "random", "input_len": 8, "output_len": 4}}}
    files["suite"].write_text(yaml.safe_dump({"name": "s", "defaults": base, "runs": [{"name": "r"}]}))
    files["nvidia_suite"].write_text(yaml.safe_dump({"name": "s", "defaults": {**base, "serve": {}},
                                                     "runs": [{"name": "r"}]}))
    files["no_tokenizer_suite"].write_text(yaml.safe_dump({"name": "s", "defaults": {
        **base, "model": {"path": str(d / "no-model")}}, "runs": [{"name": "r"}]}))
    files["slash_name"].write_text(yaml.safe_dump({"name": "s", "defaults": base, "runs": [{"name": "a/b"}]}))
    files["text"].write_text("hello\n")
    files["empty_csv"].write_text("")
    files["wrong_csv"].write_text("a,b\n1,2\n")
    files["not_json"].write_text("{not json")
    files["few_sharegpt"].write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi there you"},
                                                                     {"from": "gpt", "value": "hello to you"}]}]))
    files["bad_micro"].write_text("name: m\ncases: [{name: c, seqs: [{query_len: 1}]}]\nimplementations: [nope]\n")
    files["bad_space"].write_text("variants: {}\n")
    out = {k: str(v) for k, v in files.items()}
    out["tok"] = str(tok)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        out["closed_url"] = f"http://127.0.0.1:{s.getsockname()[1]}"
    return out


LOAD = "load --url {closed_url} --model m --tokenizer {tok} --out {out}/load"
CASES = [
    # run
    ("run {missing}", 2, "no such suite file"),
    ("run {dir}", 2, "is a directory"),
    ("run {bad_yaml}", 2, "not valid YAML (line 2, column 1)"),
    ("run {binary}", 2, "not valid YAML: not UTF-8 text"),
    ("run {list_yaml}", 2, "expected a mapping"),
    ("run {unknown_key}", 2, "unknown top-level keys ['whatever']"),
    ("run {slash_name}", 2, "run name 'a/b'"),
    ("run {suite} --only nosuch", 2, "no run named ['nosuch']"),
    ("run {suite} --resume --overwrite", 2, "exclude each other"),
    ("run {suite} --task 5", 2, "expected i/N"),
    ("run {suite} --task 3/2", 2, "expected i/N"),
    ("run {suite} --task 0/0", 2, "expected i/N"),
    ("run {suite} --repeats 0", 2, "--repeats"),
    ("run {suite} --engine v9", 2, "--engine"),
    ("run {suite} --models foo", 2, "--models"),
    ("run {suite} --sharegpt {missing}", 1, "missing.yaml"),
    ("run {suite} --sharegpt {few_sharegpt} --out {out}/few", 1, "conversations"),
    ("run {nvidia_suite} --out {out}/nv", 1, "need an NVIDIA GPU"),
    ("run {no_tokenizer_suite} --out {out}/notok", 1, "no tokenizer.json"),
    ("run", 2, "Missing argument"),
    # serve
    ("serve {missing}", 2, "no such suite file"),
    ("serve {suite} --only nosuch", 2, "no run named"),
    ("serve {suite} --port 0", 2, "--port"),
    ("serve {suite} --port 70000", 2, "--port"),
    ("serve {nvidia_suite}", 1, "need an NVIDIA GPU"),
    # load
    ("load", 2, "Missing option '--url'"),
    ("load --url x --model m --tokenizer {dir} --out {out}/l", 2, "no tokenizer.json"),
    (LOAD + " --request-rate 0", 2, "--request-rate"),
    (LOAD + " --request-rate -5", 2, "--request-rate"),
    (LOAD + " --energy-gpus 0,one", 2, "expected GPU indices or UUIDs separated by commas (e.g. 0,1), got '0,one'"),
    (LOAD + " --energy intel", 2, "--energy"),
    (LOAD + " --slo 'p90 ttft < 5 ms'", 2, "Invalid value for --slo: [0]: expected 'pNN METRIC <= LIMIT ms'"),
    (LOAD + " --slo 'p90 ttft <= 5 ms' --slo 'p50 ttft <= 9 ms'", 2, "one objective per metric"),
    (LOAD + " --slo-target 0.9", 2, "Invalid value for --slo-target: needs at least one --slo objective"),
    (LOAD + " --slo 'p90 ttft <= 5 ms' --slo-target 1.5", 2, "--slo-target"),
    (LOAD + " --burstiness 0", 2, "--burstiness"),
    (LOAD + " --burstiness -1", 2, "--burstiness"),
    (LOAD + " --dataset sharegpt", 2, "--dataset-path"),
    (LOAD + " --dataset random", 2, "--input-len"),
    (LOAD + " --dataset sharegpt --dataset-path {missing}", 2, "missing.yaml"),
    (LOAD + " --num-prompts 0", 2, "--num-prompts"),
    (LOAD + " --client-processes 0", 2, "--client-processes"),
    (LOAD + " --client-processes many", 2, "expected a count from 1 to 64"),
    (LOAD + " --start-at 1", 2, "in the past"),
    (LOAD + " --arrival sometimes", 2, "--arrival"),
    (LOAD + " --max-concurrency 0", 2, "--max-concurrency"),
    (LOAD + " --request-timeout 0", 2, "--request-timeout"),
    (LOAD + " --idle-timeout -1", 2, "--idle-timeout"),
    (LOAD + " --num-prompts 2", 1, "all 2 requests to"),
    # recipes, model, dataset
    ("recipes validate", 2, "Missing argument"),
    ("recipes validate {bad_yaml}", 1, "not valid YAML"),
    ("recipes validate {slash_name}", 1, "run name 'a/b'"),
    ("recipes show {missing}", 2, "no such suite file"),
    ("recipes show {suite} --models foo", 2, "--models"),
    ("recipes frob", 2, "No such command 'frob'"),
    ("model dummy --arch nope {out}/m", 2, "--arch"),
    ("model dummy {out}/m", 2, "Missing option '--arch'"),
    ("model tiny", 2, "Missing argument"),
    ("dataset export --tokenizer {dir} --num-prompts 5 {out}/p.json", 2, "no tokenizer.json"),
    ("dataset export --tokenizer {tok} --num-prompts 0 {out}/p.json", 2, "--num-prompts"),
    # clusters
    ("tasks {missing}", 2, "no such suite file"),
    ("status {missing}", 2, "does not exist"),
    ("status {empty_dir}", 2, "no results here"),
    ("status {text}", 2, "is a file"),
    ("submit slurm {suite} --out {out}/s --partition 'a b'", 2, "expected a partition name"),
    ("submit slurm {suite} --out {out}/s --time soon", 2, "expected a time"),
    ("submit slurm {suite} --out {out}/s --mem lots", 2, "expected a size"),
    ("submit slurm {suite} --out {out}/s --container-image x --apptainer y", 2, "exclude each other"),
    ("submit k8s {suite}", 2, "put the suite there"),
    ("submit k8s recipes/cpu-demo.yaml --namespace Bad_NS --manifest {out}/j.yaml", 2, "Kubernetes name"),
    ("submit frob", 2, "No such command 'frob'"),
    # analysis
    ("report {missing}", 2, "no such results directory"),
    ("report {text}", 2, "not a directory"),
    ("plot {empty_dir}", 2, "no results found"),
    ("plot --microbench {missing}", 2, "no such microbenchmark CSV"),
    ("plot --microbench {empty_csv}", 2, "empty file"),
    ("plot --microbench {wrong_csv}", 2, "missing columns"),
    ("plot --microbench {binary}", 2, "not a CSV (not UTF-8 text)"),
    ("plot --microbench {dir}", 2, "is a directory"),
    ("report --vllm-bench {not_json}", 2, "not JSON"),
    ("report --vllm-bench {text}", 2, "not JSON"),
    ("report", 2, "nothing to analyze"),
    # the cross-check
    ("crosscheck run --out {out}/x", 2, "give SUITE_FILE"),
    ("crosscheck run --url http://h --out {out}/x", 2, "--url needs --model and --tokenizer"),
    ("crosscheck run {suite} --out {out}/x --prompts 3 --side-by-side", 2, "--prompts 3: side by side needs an even"),
    ("crosscheck run {suite} --out {out}/x --rate 0", 2, "--rate"),
    ("crosscheck compare {empty_dir}", 2, "no client runs found"),
    ("crosscheck compare {missing}", 2, "no such folder"),
    ("crosscheck archive {empty_dir} {out}/a", 2, "no client runs found"),
    # kernels and the client's own tools
    ("microbench {missing} --out {out}/m.csv", 2, "no such microbenchmark suite"),
    ("microbench {bad_micro} --out {out}/m.csv", 2, "unknown ['nope']"),
    ("microbench {binary} --out {out}/m.csv", 2, "not UTF-8 text"),
    ("microbench README.md --out {out}/m.csv", 2, "not valid YAML (line"),
    ("microbench recipes/microbench/smoke.yaml --out {out}/m.csv", 1, "no CUDA/ROCm GPU here"),
    ("microbench recipes/microbench/smoke.yaml --out {out}/m.csv --device cpu --impl nope", 2, "--impl"),
    ("tune {missing} --space {bad_space} --rows {out}/t.csv", 2, "no such microbenchmark suite"),
    ("tune recipes/microbench/smoke.yaml --space {bad_space} --rows {out}/t.csv", 2, "variants"),
    ("tune recipes/microbench/llama3-8b-tune.yaml --space {bad_space} --rows "
     "docs/perf/h100/tune-2026-11-25-reduce1.csv --no-sweep --against {text}", 2, "not a Python file"),
    ("tune recipes/microbench/smoke.yaml --space {bad_space} --rows {missing} --no-sweep", 1,
     "missing.yaml: No such file or directory"),
    ("kernels compile sm_00", 2, "expected some of"),
    ("calibrate --concurrency 0", 2, "--concurrency"),
    ("stub-server", 2, "Missing option '--port'"),
]


@pytest.mark.parametrize("args, code, expected", CASES, ids=[c[0][:70] for c in CASES])
def test_bad_input_is_one_line(inputs, args, code, expected):
    import shlex

    argv = [a.format(**inputs) for a in shlex.split(args)]
    result = CliRunner().invoke(main, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{args}: {type(result.exception).__name__}: {result.exception}"
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    assert expected in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith(("Error:", "error "))]
    assert len(errors) == 1, result.output


def test_the_table_is_at_least_sixty_cases():
    assert len(CASES) >= 60


def test_a_full_disk_is_one_line_naming_the_folder_and_its_free_space(inputs, monkeypatch, tmp_path):
    """ENOSPC while writing (here: the prompt file of `dataset export`) names the file, its
    folder and the space left there."""
    from attnbench.runner import commands

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(commands, "atomic_write_json", full)
    result = CliRunner().invoke(main, ["dataset", "export", "--tokenizer", inputs["tok"], "--num-prompts", "2",
                                       str(tmp_path / "p.json")])
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{tmp_path / 'p.json'}: no space left on the device of {tmp_path}" in result.output
    assert "MiB free" in result.output and "Traceback" not in result.output


def test_a_failed_run_leaves_no_lock_and_no_folder_behind(inputs):
    """A run stopped by preflight (too few ShareGPT conversations) starts nothing and leaves
    nothing in the results tree."""
    out = Path(inputs["out"]) / "noleft"
    CliRunner().invoke(main, ["run", inputs["suite"], "--sharegpt", inputs["few_sharegpt"], "--out", str(out)])
    assert not list(out.rglob(".lock")) and not list(out.rglob("r1"))
