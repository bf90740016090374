"""Datasets (ShareGPT filtering, synthetic shape, random) and locally built model folders."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from attnbench.runner.datasets import (DatasetError, LocalTokenizer, SyntheticShape, load_sharegpt,
                                       random_fixed, synthetic_sharegpt)
from attnbench.runner.models import ARCHS, ensure_model, write_dummy_model


def test_tiny_model_folder(tiny):
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 4096
    from safetensors import safe_open

    with safe_open(str(tiny / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert "model.layers.1.self_attn.k_proj.weight" in names and "lm_head.weight" in names
    header_len = int.from_bytes((tiny / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tiny / "model.safetensors").read_bytes()[8:8 + header_len])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}


# (query heads, KV heads, head size) of each architecture, from its model card
ATTENTION_SHAPES = {"llama-3.1-8b": (32, 8, 128), "mistral-small-24b": (32, 8, 128), "qwen3-32b": (64, 8, 128),
                    "qwen3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128), "gemma-2-9b": (16, 8, 256)}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_dummy_model_has_the_published_shape_and_no_weights(tmp_path, arch):
    """The config.json parses as the architecture's own transformers config (what vLLM reads),
    with the published attention shape."""
    from transformers import AutoConfig

    out = write_dummy_model(tmp_path / arch, arch)
    config = AutoConfig.from_pretrained(out)
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert (config.num_attention_heads, config.num_key_value_heads, head_size) == ATTENTION_SHAPES[arch]
    assert type(config).__name__.lower().startswith(json.loads((out / "config.json").read_text())["model_type"][:5])
    assert not list(out.glob("*.safetensors")) and (out / "tokenizer.json").exists()
    assert LocalTokenizer(out).count("hello world") > 0


def test_dummy_model_unknown_arch(tmp_path):
    with pytest.raises(ValueError, match="arch: expected one of"):
        write_dummy_model(tmp_path, "gpt-5")


def test_processes_that_build_one_model_at_once_all_get_it_whole(tmp_path):
    """Runs fanned out over one host's GPUs build a shared dummy model at the same moment:
    each sees a finished folder (tokenizer included), and no staging folder stays behind."""
    import multiprocessing

    target = tmp_path / "models" / "llama"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        built = pool.starmap(_build_and_check, [(str(target),)] * 3)
    assert built == [True] * 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["llama"]
    assert ensure_model(target, "dummy:llama-3.1-8b") == target  # there: nothing rebuilt
    assert json.loads((target / "attnbench-model.json").read_text())["arch"] == "llama-3.1-8b"


def _build_and_check(target: str) -> bool:
    out = ensure_model(target, "dummy:llama-3.1-8b")
    return (out / "config.json").exists() and LocalTokenizer(out).count("hello world") > 0


def test_a_half_written_model_folder_is_named_not_served(tmp_path):
    half = tmp_path / "llama"
    half.mkdir()
    (half / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match=r"model.path: .*llama exists but holds no config.json"):
        ensure_model(half, "dummy:llama-3.1-8b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]  # nothing of ours left, theirs kept


def write_sharegpt(path, convs):
    path.write_text(json.dumps([{"id": str(i), "conversations": c} for i, c in enumerate(convs)]))


def turn(frm, words):
    return {"from": frm, "value": " ".join(["word"] * words)}


def test_sharegpt_filtering_like_vllm(tmp_path, tok):
    per_word = tok.count("word word") - tok.count("word")  # tokens one more word adds
    convs = [
        [turn("human", 20), turn("gpt", 30)],                # kept
        [turn("human", 20)],                                 # one turn: dropped
        [turn("human", 1), turn("gpt", 30)],                 # prompt < 4 tokens: dropped
        [turn("human", 20), turn("gpt", 1)],                 # output < 4 tokens: dropped
        [turn("human", 1100 // per_word + 5), turn("gpt", 10)],  # prompt > 1024: dropped
        [turn("human", 900 // per_word), turn("gpt", 1200 // per_word)],  # total > 2048: dropped
        [turn("human", 40), turn("gpt", 8), turn("human", 5)],   # kept (first two turns)
    ]
    path = tmp_path / "sg.json"
    write_sharegpt(path, convs)
    reqs = load_sharegpt(path, 2, tok, seed=0)

    def counts(conv):  # vLLM's count: special tokens (the tiny tokenizer's BOS) included
        return tuple(tok.count(t["value"], with_special_tokens=True) for t in conv[:2])

    assert tok.special_tokens_added == 1
    assert sorted((r.prompt_len, r.output_len) for r in reqs) == sorted([counts(convs[0]), counts(convs[6])])
    with pytest.raises(DatasetError, match="only 2 conversations pass"):
        load_sharegpt(path, 3, tok, seed=0)
    fixed = load_sharegpt(path, 2, tok, seed=0, output_len=16)
    assert {r.output_len for r in fixed} == {16}


def test_sharegpt_sampling_equals_vllm_bench_serve(tmp_path, tiny, tok):
    """vLLM's own ShareGPT sampler (the installed vLLM's benchmark datasets, as `vllm bench
    serve --dataset-name sharegpt` runs it) and ours pick the same conversations in the
    same order with the same prompt and output lengths (max_tokens), so both clients send
    identical requests from one file."""
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import ShareGPTDataset

    rng = random.Random(7)
    def words(short, long_, hi):  # mostly valid lengths, some that vLLM's filter drops
        return rng.choice([short, long_] + [rng.randint(3, hi) for _ in range(6)])

    convs = [[turn("human", words(1, 1100, 300)), turn("gpt", words(2, 1900, 900))]
             + ([turn("human", 3)] if rng.random() < 0.2 else []) for _ in range(160)]
    convs += [[turn("human", 12)]] * 10  # one turn: dropped by both
    path = tmp_path / "sg.json"
    write_sharegpt(path, convs)
    for seed, n in ((0, 40), (5, 60)):
        theirs = ShareGPTDataset(dataset_path=str(path), random_seed=seed).sample(
            tokenizer=AutoTokenizer.from_pretrained(tiny), num_requests=n, no_oversample=True)
        ours = load_sharegpt(path, n, tok, seed)
        assert [(r.prompt, r.prompt_len, r.output_len) for r in ours] == \
            [(r.prompt, r.prompt_len, r.expected_output_len) for r in theirs]


def test_sharegpt_is_seeded(tmp_path, tok):
    path = tmp_path / "sg.json"
    write_sharegpt(path, [[turn("human", 5 + i), turn("gpt", 8)] for i in range(50)])
    a = [r.prompt for r in load_sharegpt(path, 10, tok, seed=1)]
    assert a == [r.prompt for r in load_sharegpt(path, 10, tok, seed=1)]
    assert a != [r.prompt for r in load_sharegpt(path, 10, tok, seed=2)]


def test_sharegpt_missing_file_says_where_to_get_it(tmp_path, tok):
    with pytest.raises(DatasetError, match="ShareGPT file not found"):
        load_sharegpt(tmp_path / "none.json", 1, tok, 0)


def test_synthetic_shape_is_heavy_tailed_and_capped(tok):
    shape = SyntheticShape(220, 1.0, 180, 0.9, 1024, 2048)
    draws = [shape.draw(random.Random(i)) for i in range(3000)]
    prompts = [p for p, _ in draws]
    assert all(4 <= p <= 1024 and p + o <= 2048 and o >= 4 for p, o in draws)
    assert 180 < statistics.median(prompts) < 260
    assert statistics.mean(prompts) > statistics.median(prompts)  # right tail
    reqs = synthetic_sharegpt(20, tok, seed=0, shape=shape)
    assert [r.prompt for r in reqs] == [r.prompt for r in synthetic_sharegpt(20, tok, seed=0, shape=shape)]
    assert all(r.prompt_len == tok.count(r.prompt) for r in reqs)


def test_random_fixed_lengths(tok):
    reqs = random_fixed(10, tok, seed=0, input_len=64, output_len=32)
    assert {r.output_len for r in reqs} == {32}
    assert all(48 <= r.prompt_len <= 80 for r in reqs)  # decode/re-encode may shift a little


def test_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="no tokenizer.json"):
        LocalTokenizer(tmp_path)


def test_exported_sharegpt_sends_the_same_prompts(tmp_path, tiny):
    """`attnbench dataset export` then `--dataset sharegpt` on the file: the same prompts
    come back (vLLM's filter keeps them all), with the intended output lengths."""
    from click.testing import CliRunner

    from attnbench.cli import main
    from attnbench.runner.datasets import LocalTokenizer, build_requests, load_sharegpt
    from attnbench.runner.recipe import DatasetSpec

    out = tmp_path / "set.json"
    result = CliRunner().invoke(main, ["dataset", "export", "--tokenizer", str(tiny), "--num-prompts", "40",
                                       "--seed", "3", str(out)])
    assert result.exit_code == 0, result.output
    drawn = {r.prompt: r.output_len for r in build_requests(DatasetSpec(kind="synthetic"), 90, tiny, 3)}
    back = load_sharegpt(out, 40, LocalTokenizer(tiny), seed=0)  # raises if any is filtered out
    assert len({r.prompt for r in back}) == 40
    assert all(r.output_len == drawn[r.prompt] for r in back)
    bad = CliRunner().invoke(main, ["dataset", "export", "--tokenizer", str(tiny), "--dataset", "random",
                                    str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and "--input-len" in bad.output  # the option, not the pydantic field
    # fixed lengths past the filter: a clear error, not a short file
    too_long = CliRunner().invoke(main, ["dataset", "export", "--tokenizer", str(tiny), "--dataset", "random",
                                         "--input-len", "1100", "--output-len", "8", str(tmp_path / "y.json")])
    assert too_long.exit_code == 2 and "pass vLLM's ShareGPT filter" in too_long.output
