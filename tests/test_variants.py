"""The kernel registry (kernels/variants.py) is the one list of the kernels: the paper's
steps and the Gluon kernel for Hopper, each module declaring itself, and every table of
variants derived from the registry. One name per kernel: `qblock` is the Triton step
whatever the GPU, `qblock_ws` the Gluon kernel."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from attnbench.kernels.config import BatchShape, KernelConfig, Platform
from attnbench.kernels.variants import AUTO, CHOICES, STEPS, VARIANTS, check_variant, step

H100 = Platform("cuda", 132, "test")
SHAPES = [BatchShape(1, 1, 1, 13000, 32, 8, 128), BatchShape(64, 64, 1, 4096, 32, 8, 128),
          BatchShape(4, 8192, 2048, 2048, 32, 8, 128), BatchShape(32, 528, 512, 2048, 64, 8, 128)]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_kernel_declares_itself_beside_its_code(name):
    from attnbench.kernels.dispatch.heuristics import choose_config

    s = step(name)
    assert s.name == name and "sec. 4." in s.paper and callable(s.launch)
    assert s.paper.startswith("sec. 4.") == (name in STEPS) and (s.refuses is None) == (name in STEPS)
    for shape in SHAPES:
        config = s.default_config(shape, H100)
        assert config.variant == name and choose_config(shape, H100, name) == config


def test_every_table_of_variants_comes_from_the_registry():
    from attnbench.kernels.bench import implementations, spec
    from attnbench.kernels.bench.aot import representative_launches
    from attnbench.kernels.schema import COMPARATORS, HOPPER_KERNELS

    assert CHOICES == (AUTO, *VARIANTS) and STEPS == ("naive", "qblock", "parallel_tiled", "static_grid")
    assert VARIANTS == (*STEPS, "qblock_ws")
    assert list(implementations.REGISTRY) == [*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS]
    assert spec.IMPLEMENTATIONS == (*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS)
    assert not set(VARIANTS) & set(HOPPER_KERNELS)  # one name, one kernel and config
    assert list(representative_launches()) == list(STEPS)
    with pytest.raises(ValueError, match=r"variant: expected 'auto' or one of \['naive', 'qblock', "
                                         r"'parallel_tiled', 'static_grid', 'qblock_ws'\], got 'flash'"):
        check_variant("flash")


def test_the_steps_do_not_import_the_hopper_kernels_nor_the_fitted_tree_the_tuner():
    """steps/ is the paper; hopper/ and the tuner are not part of it, and a fitted tree runs
    at every call without the tuner's imports (scikit-learn, the microbenchmark)."""
    import ast
    from pathlib import Path

    import attnbench.kernels as kernels

    root = Path(kernels.__file__).parent

    def imports(path: Path) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found.add("." * node.level + (node.module or ""))
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        return found

    for path in (root / "steps").glob("*.py"):
        assert not any("hopper" in m for m in imports(path)), path
    for path in (root / "dispatch").glob("tuned_*.py"):
        assert imports(path) == {"attnbench.kernels.dispatch.features"}, path


def test_the_registry_loads_without_torch():
    """Recipes check serve.kernel_variant against it on hosts without a GPU stack."""
    code = ("import sys, attnbench.kernels.variants, attnbench.kernels.config\n"
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-1000:]


H100_SM90 = Platform("cuda", 132, "NVIDIA H100 80GB HBM3", "sm_90")  # its tuned tree ships
HOPPER_UNTUNED = Platform("cuda", 114, "NVIDIA H100 PCIe", "sm_90")  # the hand-written tree


@pytest.mark.parametrize("gluon", [True, False])
def test_hopper_prefill_and_mixed_batches_get_the_gluon_kernel(monkeypatch, gluon):
    """On sm_90 without a tuned tree, with Gluon's Hopper API, `auto` runs every batch the
    2D grid fills with `qblock_ws` (128 rows; 128-key tiles past 1,024 keys, 64-key ones up
    to it): prefills, mixed batches and decodes of many sequences; decodes too few to fill
    the GPU split the KV range (Triton's split-KV step); other architectures, other head
    shapes, a Triton without Gluon and the paper's qblock step itself keep Triton."""
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: gluon)  # as the heuristics see it
    prefill, mixed = SHAPES[2], SHAPES[3]
    for shape in (prefill, mixed):
        config = choose_config(shape, HOPPER_UNTUNED)
        expected = "qblock_ws" if gluon else "qblock"
        assert (config.variant, config.block_m, config.tile_size) == (expected, 128, 128)  # 2,048 keys
        assert choose_config(shape, H100).variant == "qblock"  # architecture unknown
        assert choose_config(shape, Platform("cuda", 108, "A100", "sm_80")).variant == "qblock"
        assert choose_config(shape, HOPPER_UNTUNED, "qblock").variant == "qblock"  # the paper's step: Triton
    one_decode, many_decodes = SHAPES[:2]
    assert choose_config(one_decode, HOPPER_UNTUNED).variant == "parallel_tiled"  # 8 programs for 114 SMs
    assert choose_config(many_decodes, HOPPER_UNTUNED).variant == "qblock"  # 512 programs over 4k keys: Triton
    long_decodes = BatchShape(64, 64, 1, 8192, 32, 8, 128, sum_seqlen_k=64 * 8192)
    assert choose_config(long_decodes, HOPPER_UNTUNED).variant == ("qblock_ws" if gluon else "qblock")
    # equal known lengths: static shares, past 1,024 keys too; ragged ones keep one program per item
    assert choose_config(long_decodes, HOPPER_UNTUNED).persistent is gluon
    ragged_long = replace(long_decodes, sum_seqlen_k=48 * 8192 + 16 * 6000)
    assert choose_config(ragged_long, HOPPER_UNTUNED).persistent is False
    # lengths unknown up to 8k (a captured graph): the Triton step, which holds for any
    assert choose_config(replace(long_decodes, sum_seqlen_k=None), HOPPER_UNTUNED).variant == "qblock"
    one_wave = BatchShape(16, 16, 1, 4096, 32, 8, 128)  # 128 programs for 114 SMs, 4k keys: Gluon where it runs
    assert choose_config(one_wave, Platform("cuda", 132, "NVIDIA H200", "sm_90")).variant == (
        "qblock_ws" if gluon else "parallel_tiled")
    serving_step = BatchShape(49, 304, 256, 512, 32, 8, 128)  # 48 decodes and a new prompt
    assert choose_config(serving_step, HOPPER_UNTUNED).tile_size == (64 if gluon else 128)
    monkeypatch.setenv("ATTNBENCH_GLUON", "0")  # the A/B switch
    assert choose_config(prefill, HOPPER_UNTUNED).variant == "qblock"
    monkeypatch.delenv("ATTNBENCH_GLUON")
    head_256 = choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 256), HOPPER_UNTUNED)  # 64-key tiles fit
    assert (head_256.variant, head_256.tile_size) == (("qblock_ws", 64) if gluon else ("qblock", 64))
    head_96 = choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 96), HOPPER_UNTUNED)  # in two pieces
    assert (head_96.variant, head_96.tile_size) == (("qblock_ws", 128) if gluon else ("qblock", 128))
    assert choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 80), HOPPER_UNTUNED).variant == "qblock"  # head 80
    # short queries run it at heads it takes in two pieces, as at 64, 128 and 256
    for short_queries in (BatchShape(32, 64, 2, 4096, 16, 8, 192, 32 * 4096),
                          BatchShape(32, 32, 1, 2048, 32, 32, 96, 32 * 2048)):
        assert choose_config(short_queries, HOPPER_UNTUNED).variant == expected
    assert choose_config(BatchShape(32, 64, 2, 4096, 16, 8, 256), HOPPER_UNTUNED).variant == expected
    assert choose_config(BatchShape(32, 64, 2, 2048, 32, 8, 64), HOPPER_UNTUNED).variant == expected  # head 64: Gluon
    assert choose_config(BatchShape(1, 512, 512, 512, 256, 1, 64), HOPPER_UNTUNED).variant == "qblock"  # 256 per KV head


@pytest.mark.parametrize("gluon", [True, False])
def test_the_h100_runs_its_tuned_tree(monkeypatch, gluon):
    """The H100's fitted tree (kernels/dispatch/tuned_nvidia_h100_80gb_hbm3.py): long
    prompts run the Gluon kernel at 128-key tiles, short ones 64-key tiles, persistent with
    5 work items per SM or more (4 x 2k: 2,048 items; 16 x 512: 2,048) and one program per
    item with fewer (1 x 2k: 512 items for 132 SMs), and so does a
    serving step of decodes with a new prompt; many decodes over at most 4k keys keep the
    Triton step whatever the tree (`short_queries.many_short_queries`); decodes of a few long sequences
    run Triton's split-KV step; where Gluon cannot run (no Gluon,
    ATTNBENCH_GLUON=0, head size 80, 256 query heads per KV head) the qblock step's own
    Triton config runs instead; head 256 gets the tree's pick with the 64-key tiles that fit,
    head 96 the tree's pick as it is (computed as 128)."""
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.dispatch.trees import tuned_tree_path
    from attnbench.kernels.hopper import host

    assert tuned_tree_path(H100_SM90.device_name).name == "tuned_nvidia_h100_80gb_hbm3.py"
    assert tuned_tree_path(H100_SM90.device_name).is_file()  # where `attnbench tune --emit` writes it to ship
    monkeypatch.setattr(host, "available", lambda: gluon)
    long_prompts, short_prompts = SHAPES[2], BatchShape(16, 8192, 512, 512, 32, 8, 128)
    one_prompt = BatchShape(1, 2048, 2048, 2048, 32, 8, 128)
    for shape, tile, persistent in ((long_prompts, 128, True), (short_prompts, 64, True), (one_prompt, 128, False)):
        config = choose_config(shape, H100_SM90)
        expected = ("qblock_ws", tile, persistent) if gluon else ("qblock", 128, False)
        assert (config.variant, config.tile_size, config.persistent) == expected
    assert choose_config(SHAPES[0], H100_SM90).variant == "parallel_tiled"  # one 13k decode
    serving_step = BatchShape(49, 304, 256, 512, 32, 8, 128)  # 48 decodes and a new prompt
    assert choose_config(serving_step, H100_SM90).variant == ("qblock_ws" if gluon else "qblock")
    assert choose_config(SHAPES[1], H100_SM90).variant == "qblock"  # 64 decodes of 4k: 512 programs
    monkeypatch.setenv("ATTNBENCH_GLUON", "0")
    assert choose_config(long_prompts, H100_SM90).variant == "qblock"
    monkeypatch.delenv("ATTNBENCH_GLUON")
    head_256 = choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 256), H100_SM90)
    assert (head_256.variant, head_256.tile_size) == (("qblock_ws", 64) if gluon else ("qblock", 64))
    assert choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 96), H100_SM90).variant == \
        ("qblock_ws" if gluon else "qblock")  # head 96, computed as 128
    assert choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 80), H100_SM90).variant == "qblock"  # head 80
    assert choose_config(BatchShape(1, 512, 512, 512, 256, 1, 64), H100_SM90).variant == "qblock"  # 256 per KV head
    assert choose_config(long_prompts, Platform("cuda", 132, H100_SM90.device_name, "sm_80")).variant == "qblock"


def test_a_fitted_persistent_launch_runs_only_over_short_sequences(monkeypatch, tmp_path):
    """Whatever a fitted tree says, the Gluon kernel's persistent launch runs only where the
    longest sequence has at most 1,024 keys (heuristics._persistent_pays); past that, one
    program per work item with the tree's tiles, and the decision says why."""
    from attnbench.kernels.dispatch.heuristics import PERSISTENT_MAX_KEYS, decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    tree = tmp_path / "tuned_persistent.py"
    tree.write_text("def choose(shape, platform):\n"
                    "    return {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'persistent': True}\n")
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", str(tree))
    chunk_over_30k = BatchShape(1, 512, 512, 30720, 32, 8, 128)
    short_decodes = BatchShape(16, 16, 1, PERSISTENT_MAX_KEYS, 32, 8, 128)  # 128 programs
    long_decodes = BatchShape(16, 16, 1, PERSISTENT_MAX_KEYS + 1, 32, 8, 128)
    assert decide(short_decodes, H100_SM90).config.persistent is True
    for shape in (chunk_over_30k, long_decodes):
        config, why = decide(shape, H100_SM90)
        assert (config.variant, config.tile_size, config.persistent) == ("qblock_ws", 128, False)
        assert f"one program per item: the longest sequence has {shape.max_seqlen_k} keys" in why


def test_the_fitted_trees_64_key_tiles_become_128_past_512_keys(monkeypatch):
    """The shipped tree picks 64-key tiles for prompts of 288-768 tokens over at most 768 keys
    (fitted before ded4027 made a masked 128-key tile cheaper); past 512 keys, where the
    kernel's own tree takes 128-key tiles, `decide` does too (on the H100 and an H200
    128-key tiles took 0.96-1.00x the 64-key time on rules.yaml's page-tiles cases over
    600-768 keys: docs/perf/h100/page-tiles-2026-11-28.csv), and says so. At 512 keys the
    tree's 64 stay (128-key tiles 1.03-1.06x there), and so do head 256's."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    for keys, tile in ((512, 64), (513, 128), (768, 128)):
        config, why = decide(BatchShape(8, 8 * keys, keys, keys, 32, 8, 64), H100_SM90)
        assert (config.variant, config.tile_size) == ("qblock_ws", tile), keys
        assert (f"{tile}-key tiles: the longest sequence has {keys} keys" in why) == (tile == 128)
    head_256 = decide(BatchShape(8, 8 * 768, 768, 768, 16, 8, 256), H100_SM90).config
    assert head_256.tile_size == 64


def test_the_fitted_tree_is_switched_off_or_swapped_by_name(monkeypatch, tmp_path):
    """ATTNBENCH_TUNED_TREE=off: the H100 runs the hand-written tree, what a GPU without a
    fitted tree runs; a path: the tree in that file; a file that is not a tree: one line."""
    from attnbench.kernels.dispatch.heuristics import _auto, choose_config
    from attnbench.kernels.dispatch.trees import TreeError

    one_decode = BatchShape(1, 1, 1, 2048, 32, 8, 128)  # the shipped tree sends it to the split-KV step
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    assert choose_config(one_decode, H100_SM90) == _auto(one_decode, H100_SM90).config
    tree = tmp_path / "tuned_other.py"
    tree.write_text("def choose(shape, platform):\n    return {'variant': 'qblock', 'tile_size': 32}\n")
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", str(tree))
    assert (choose_config(one_decode, H100_SM90).variant, choose_config(one_decode, H100_SM90).tile_size) == \
        ("qblock", 32)
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", str(tmp_path / "none.py"))
    with pytest.raises(TreeError, match="none.py: no such file; expected a tree written by"):
        choose_config(one_decode, H100_SM90)


def test_the_gluon_kernel_runs_128_row_q_blocks_and_alone_has_a_persistent_launch():
    with pytest.raises(ValueError, match="KernelConfig.block_m: 'qblock_ws' runs Q-blocks of 128 rows, got 16"):
        KernelConfig("qblock_ws", block_m=16)
    with pytest.raises(ValueError, match="KernelConfig.persistent: only 'qblock_ws' has a persistent launch, got "
                                         "variant 'qblock'"):
        KernelConfig("qblock", block_m=128, persistent=True)
    assert KernelConfig("qblock_ws", block_m=128, persistent=True).as_dict()["persistent"] is True
    assert "kernel" not in KernelConfig("qblock").as_dict()


def test_the_gluon_kernels_own_tree_runs_persistent_over_short_keys_unless_a_uniform_prefill():
    """`qblock_ws`'s hand-written tree (what `auto` runs where no tree was fitted): persistent
    up to 1,024 keys for batches with short queries (decodes, speculative decodes, mixed),
    and at any length for batches of long queries with at least 5 work items per SM; one
    program per item for uniform prefills with fewer, for head 256's prefills (64-key tiles:
    long items) and for decodes past 1,024 keys."""
    def config(*shape):
        return step("qblock_ws").default_config(BatchShape(*shape), H100_SM90)

    assert config(64, 64, 1, 512, 32, 8, 128).persistent  # decodes
    assert config(16, 64, 4, 1024, 32, 8, 128).persistent  # 4-query speculative decodes
    assert config(9, 520, 512, 512, 32, 8, 128).persistent  # a prompt and 8 decodes
    assert config(16, 8192, 512, 512, 32, 8, 128).persistent  # 16 prompts of 512: 2,048 items
    assert config(4, 8192, 2048, 2048, 32, 8, 128).persistent  # 4 prompts of 2k: 2,048 items
    assert not config(4, 2048, 512, 512, 32, 8, 128).persistent  # 4 prompts of 512: 512 items
    assert not config(1, 2048, 2048, 2048, 32, 8, 128).persistent  # one prompt of 2k: 512 items
    assert config(3, 3072, 1024, 1024, 32, 8, 128).persistent  # 3 prompts of 1k: 768 items
    assert not config(4, 16384, 4096, 4096, 16, 8, 256).persistent  # Gemma-2's 4 x 4k: 2,048 long items
    assert not config(64, 64, 1, 1025, 32, 8, 128).persistent  # past 1,024 keys
    assert not config(64, 64, 1, 4096, 16, 8, 256).persistent  # 64-key tiles, long keys
    assert config(64, 64, 1, 512, 32, 8, 128).tile_size == 64


def test_older_trees_and_sweeps_name_the_gluon_kernel_as_a_kernel_field():
    """Tuned trees and sweep rows written before the Gluon kernel had its own name said
    ``kernel: gluon_ws`` on the qblock step (`KernelConfig.of`)."""
    legacy = {"variant": "qblock", "kernel": "gluon_ws", "tile_size": 64, "block_m": 128, "persistent": True}
    assert KernelConfig.of(legacy) == KernelConfig("qblock_ws", tile_size=64, block_m=128, persistent=True)
    assert KernelConfig.of({"variant": "qblock", "kernel": "triton", "tile_size": 64}) == KernelConfig("qblock", 64)
    with pytest.raises(ValueError, match=r"KernelConfig.kernel: expected one of \['triton', 'gluon_ws'\], got 'cuda'"):
        KernelConfig.of({"variant": "qblock", "kernel": "cuda"})


def test_the_gluon_kernel_is_refused_by_name_where_it_cannot_run_and_auto_falls_back(monkeypatch):
    """Named (as a variant or in a config) on a call it cannot run (heads of 80; on the CPU,
    any call: no sm_90), `qblock_ws` is a one-line ValueError; the microbenchmark records
    it as unsupported there. Where `auto` picked it and it refuses the call, the Triton
    Q-block step runs it."""
    import torch
    from kernel_checks import DEVICE

    import attnbench.kernels.dispatch.api as api
    from attnbench.kernels import PagedBatch, paged_attention
    from attnbench.kernels.bench.implementations import Unsupported, prepare
    from attnbench.kernels.dispatch.heuristics import choose_config

    batch = PagedBatch.build([(20, 5)], num_q_heads=4, num_kv_heads=2, head_size=80, block_size=16,
                             dtype=torch.float16, device=DEVICE, seed=0)
    why = r"(needs an sm_90 \(Hopper\) GPU|head size 80 \(supported: \(64, 96, 128, 192, 256\)\))"
    config = KernelConfig("qblock_ws", tile_size=64, block_m=128)
    with pytest.raises(ValueError, match=rf"config: variant 'qblock_ws' cannot run this call: {why}"):
        paged_attention(**batch.attention_kwargs(), config=config)
    with pytest.raises(ValueError, match=rf"variant: 'qblock_ws' cannot run this call: {why}"):
        paged_attention(**batch.attention_kwargs(), variant="qblock_ws")
    with pytest.raises(Unsupported, match=rf"qblock_ws {why}"):
        prepare("qblock_ws", batch)

    def picks_gluon(shape, platform, variant):  # as `auto` on an H100 would for heads it takes
        return KernelConfig("qblock_ws", block_m=128) if variant == "auto" else choose_config(shape, platform, variant)

    monkeypatch.setattr(api, "choose_config", picks_gluon)
    monkeypatch.setattr(api, "_VALID_LAYOUTS", {})
    api._config_for.cache_clear()
    try:
        out = paged_attention(**batch.attention_kwargs())
        (layout,) = api._VALID_LAYOUTS.values()
        assert [c.variant for c in layout.configs.values()] == ["qblock"]
        assert re.fullmatch(why, layout.refusals["qblock_ws"])
        assert torch.equal(out, paged_attention(**batch.attention_kwargs(), variant="qblock"))
    finally:
        api._config_for.cache_clear()


def test_auto_splits_the_kv_range_of_short_queries_that_cannot_fill_the_gpu(monkeypatch):
    """The hand-written tree (what a GPU without a fitted tree runs) splits the KV range of a
    speculative batch as of a decode batch when the Q-block step would launch at most one
    program per SM: 8 sequences x 4 queries over 16k keys with 4 KV heads (Qwen2.5-7B) give
    64 programs on 132 SMs; 16 x 8 queries with 8 KV heads, 256."""
    from attnbench.kernels.dispatch.heuristics import choose_config

    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    spec = BatchShape(8, 32, 4, 16384, 28, 4, 128)
    assert choose_config(spec, H100_SM90).variant == "parallel_tiled"
    # the tiles the H100 measured on sm_90 (`split_kv.split_config`); the step's own elsewhere
    assert (choose_config(spec, H100_SM90).tile_size, choose_config(spec, H100).tile_size) == (128, 64)
    short = choose_config(BatchShape(2, 2, 1, 640, 32, 8, 128), H100_SM90)
    assert (short.tile_size, short.num_stages, short.num_segments) == (32, 2, 32)
    for long_keys in (16384, 1024):  # head 256: the step's own tiles, in 2 stages (3 its own)
        head_256 = BatchShape(2, 2, 1, long_keys, 16, 8, 256)
        own = step("parallel_tiled").default_config(head_256, H100_SM90)
        assert choose_config(head_256, H100_SM90) == replace(own, num_stages=2)
        assert (own.tile_size, own.num_stages, own.num_segments) == (64, 3, 16)
        assert choose_config(head_256, H100).num_stages == 3  # not sm_90: the step's own config
    # head 256's segments follow the pairs as head 128's do (`split_kv._split_segments`): 8 pairs 32,
    # 32 pairs 8, 48 and 64 pairs 4, where the step's own cut is 32 or 16
    for seqs, keys, segments in ((1, 32768, 32), (4, 8192, 8), (4, 2048, 8), (6, 3000, 4), (8, 1024, 4)):
        config = choose_config(BatchShape(seqs, seqs, 1, keys, 16, 8, 256), H100_SM90)
        assert (config.variant, config.tile_size, config.num_segments) == ("parallel_tiled", 64, segments)
    ragged_256 = BatchShape(32, 32, 1, 10000, 16, 8, 256, sum_seqlen_k=4 * 10000 + 28 * 1500)
    ragged_split = choose_config(ragged_256, H100_SM90)  # known ragged lengths: equal segments, the step's count
    assert (ragged_split.num_segments, ragged_split.equal_segments) == (16, True)
    two_d = ("qblock", "qblock_ws")  # the 2D grid: qblock_ws where Gluon runs
    many = BatchShape(16, 128, 8, 4096, 32, 8, 128)
    assert choose_config(many, H100_SM90).variant in two_d
    short_context = BatchShape(8, 32, 4, 256, 28, 4, 128)  # under 512 keys: too few tiles to split
    assert choose_config(short_context, H100_SM90).variant in two_d
    assert choose_config(BatchShape(1, 1, 1, 512, 32, 8, 128), H100_SM90).variant == "parallel_tiled"
    prompt = BatchShape(8, 256, 32, 16384, 28, 4, 128)  # over 16 queries: not a short query
    assert choose_config(prompt, H100_SM90).variant in two_d


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_a_split_past_short_keys_takes_segments_for_about_two_programs_per_sm(monkeypatch, tree):
    """Past 2.5k keys a uniform split on sm_90 cuts each (sequence, KV head) pair's keys into
    the most segments (a power of two, 2-32) that keep pairs x segments within two per SM,
    with or without the fitted tree (rules.yaml split-segments: 8 segments for 32 pairs,
    4 for 48-64, each 0.87-0.99x the time of 16); a ragged batch keeps 16 equal segments, a
    batch up to 2.5k keys 32, and the step named alone vLLM's 16."""
    from attnbench.kernels.dispatch.heuristics import choose_config

    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")

    def segments(num_seqs, keys, q_heads=32, kv_heads=8, queries=1, ragged=False):
        shape = BatchShape(num_seqs, num_seqs * queries, queries, keys, q_heads, kv_heads, 128,
                           sum_seqlen_k=num_seqs * keys - (keys // 2 if ragged else 0))
        config = choose_config(shape, H100_SM90)
        assert config.variant == "parallel_tiled", shape
        return config.num_segments, config.equal_segments

    assert segments(1, 16384) == (32, False)  # 8 pairs
    assert segments(2, 65536) == (16, False)  # 16
    assert segments(4, 16384) == (8, False)  # 32
    assert segments(32, 8192, kv_heads=1) == (8, False)  # MQA: 32 pairs, two 16-row Q-blocks each
    assert segments(48, 16384, kv_heads=1) == (4, False)
    assert segments(8, 8192) == (4, False)  # 64
    assert segments(8, 16384, q_heads=28, kv_heads=4, queries=4) == (8, False)  # speculative, 32 pairs
    assert segments(4, 16384, ragged=True) == (16, True)
    assert segments(4, 2048) == (32, False)
    decodes = BatchShape(4, 4, 1, 16384, 32, 8, 128)
    assert choose_config(decodes, H100_SM90, "parallel_tiled").num_segments == 16


@pytest.mark.parametrize("platform", [H100_SM90, HOPPER_UNTUNED])
def test_many_speculative_decodes_keep_the_triton_step_where_they_fill_its_q_block(monkeypatch, platform):
    """Ragged speculative decodes of more programs than SMs over at most 4k keys run the
    Triton step whatever the tree where each sequence's query rows fill one of its 16-row
    Q-blocks (4 tokens at 4 query heads per KV head, 2 at 8): rules.yaml's spec-many cases,
    0.86-1.01x the fitted tree's pick on the H100. Equal lengths run the Gluon kernel in
    static shares (0.77-1.00x on an H200, `short_queries.many_short_queries`). Rows that fill part of one
    (2 tokens at 4 heads) or take two (8 at 4) keep the Gluon kernel, as do batches past 4k
    keys, batches of too few programs and batches of lengths the caller does not know."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)

    def spec(num_seqs, tokens, keys, q_heads=32, head_size=128, known=True):  # a quarter of the sequences shorter
        return BatchShape(num_seqs, num_seqs * tokens, tokens, keys, q_heads, 8, head_size,
                          sum_seqlen_k=num_seqs * keys - num_seqs // 4 * (keys // 2) if known else None)

    for full in (spec(128, 4, 1024), spec(96, 4, 2048), spec(128, 4, 4096), spec(64, 2, 1024, q_heads=64),
                 spec(128, 4, 1024, head_size=64)):
        decision = decide(full, platform)
        assert decision.config == step("qblock").default_config(full, platform), full
        assert "queries filling one 16-row Q-block each over at most 4096 keys" in decision.why
        uniform = decide(replace(full, sum_seqlen_k=full.num_seqs * full.max_seqlen_k), platform).config
        assert uniform.variant == "qblock_ws", full  # its config: the fitted tree's where one ships
        assert uniform.persistent or platform is H100_SM90, full
    for gluon in (spec(128, 2, 1024), spec(64, 8, 1024), spec(64, 4, 1024, q_heads=64), spec(128, 4, 4097),
                  spec(128, 4, 1024, known=False)):
        assert decide(gluon, platform).config.variant == "qblock_ws", gluon
    assert decide(spec(12, 4, 1024), platform).config.variant != "qblock"  # 96 programs: too few


@pytest.mark.parametrize("platform", [H100_SM90, HOPPER_UNTUNED])
def test_many_decodes_at_head_256_run_the_triton_step_in_32_key_tiles_and_4_warps(monkeypatch, platform):
    """At a head over 128 the Triton step's 128-key, 8-warp decode config fits one program
    per SM; many decodes run in 32-key tiles and 4 warps (`qblock.TRITON_DECODE_WIDE_HEADS`), tuned
    tree or not, known lengths or a captured graph's, wherever the longest sequences'
    programs alone outnumber the SMs. `auto` runs it at head 256 from five programs per SM
    (as many as it keeps resident), up to 2k keys where the lengths are known. Fewer
    programs, a ragged batch whose long sequences are few, and heads of 128 keep the
    8-warp config; a speculative batch keeps its own."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host
    from attnbench.kernels.steps import qblock

    monkeypatch.setattr(host, "available", lambda: True)
    wide = qblock.TRITON_DECODE_WIDE_HEADS
    assert (wide.tile_size, wide.num_warps, wide.block_m) == (32, 4, 16)
    ragged = BatchShape(192, 192, 1, 2000, 16, 8, 256, sum_seqlen_k=64 * (300 + 900 + 2000))  # 819 full-length
    uniform = BatchShape(128, 128, 1, 600, 16, 8, 256, sum_seqlen_k=128 * 600)
    for shape in (ragged, uniform, replace(uniform, sum_seqlen_k=None)):
        decision = decide(shape, platform)
        assert decision.config == wide, shape
        assert "the qblock step's own tree: decodes" in decision.why
    # fewer than 5 programs per SM (its resident programs), known lengths or not, or past 2k
    # keys where the lengths are known: the Gluon kernel
    b32 = BatchShape(32, 32, 1, 2048, 16, 8, 256, sum_seqlen_k=32 * 2048)  # 256 programs
    long_uniform = BatchShape(96, 96, 1, 3072, 16, 8, 256, sum_seqlen_k=96 * 3072)  # 768 programs
    for shape in (b32, replace(b32, sum_seqlen_k=None), long_uniform):
        assert decide(shape, platform).config.variant == "qblock_ws", shape
    assert decide(replace(long_uniform, sum_seqlen_k=None), platform).config == wide
    eight_warps = qblock.TRITON_DECODE
    assert (eight_warps.tile_size, eight_warps.num_warps, eight_warps.block_m) == (128, 8, 16)
    few = BatchShape(12, 12, 1, 600, 16, 8, 256)  # 96 programs: fewer than the SMs
    long_tails = BatchShape(32, 32, 1, 10000, 16, 8, 256, sum_seqlen_k=4 * 10000 + 28 * 1500)  # 66 full-length
    llama = BatchShape(128, 128, 1, 600, 32, 8, 128, sum_seqlen_k=128 * 600)
    for shape in (few, long_tails, llama):
        assert step("qblock").default_config(shape, platform) == eight_warps, shape
    assert decide(replace(llama, sum_seqlen_k=None), platform).config == eight_warps
    spec = BatchShape(128, 256, 2, 600, 16, 8, 256, sum_seqlen_k=128 * 600)
    assert step("qblock").default_config(spec, platform) != wide
    hip = Platform("hip", 304, "AMD Instinct MI300X", "gfx942")  # ROCm keeps its own decode tiles
    assert step("qblock").default_config(uniform, hip).num_warps == 4


def test_a_tuned_tree_does_not_extrapolate_to_short_queries_that_cannot_fill_the_gpu(monkeypatch):
    """The H100's fitted tree never saw a speculative decode (its training set has none) and
    would run one like a prefill: 8 sequences x 4 queries over 16k keys with 4 KV heads get
    64 programs on 132 SMs. The occupancy rule splits the KV range whatever the tree; on
    every case the tree was fitted on, it picks what the tree picks, but for the persistent
    launch past 1,024 keys (`test_a_fitted_persistent_launch_runs_only_over_short_sequences`),
    the Triton step on decodes of more programs than SMs over at most 4k keys
    (`short_queries.many_short_queries`: six of the 28 cases) and the split's own segments
    on decodes it splits past 2.5k keys (`split_kv._split_segments`: three cases)."""
    import csv
    from pathlib import Path

    from attnbench.kernels.bench.tune import best_per_case, shape_of
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.dispatch.short_queries import many_short_queries
    from attnbench.kernels.dispatch.split_kv import SPLIT_SHORT_KEYS, split_config, splits
    from attnbench.kernels.dispatch.tuned_nvidia_h100_80gb_hbm3 import choose as tree
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    spec = BatchShape(8, 32, 4, 16384, 28, 4, 128)
    assert KernelConfig.of(tree(spec, H100_SM90)).variant == "qblock_ws"
    assert choose_config(spec, H100_SM90).variant == "parallel_tiled"
    rows = list(csv.DictReader((Path(__file__).parents[1] / "docs/perf/h100/tune-2026-11-25-reduce1.csv").open()))
    triton_decodes, long_splits = [], []
    for case, row in best_per_case(rows).items():
        shape = replace(shape_of(row), head_size=128)
        fitted = KernelConfig.of(tree(shape, H100_SM90))
        persistent = (fitted.persistent and shape.max_seqlen_k <= 1024) or (
            fitted.variant == "qblock_ws" and host.many_items(shape, H100_SM90.num_sms))
        if many_short_queries(shape, H100_SM90):
            triton_decodes.append(case)
            assert choose_config(shape, H100_SM90) == step("qblock").default_config(shape, H100_SM90), case
        elif splits(shape, H100_SM90) and shape.max_seqlen_k > SPLIT_SHORT_KEYS:
            long_splits.append(case)
            assert fitted.variant == "parallel_tiled", case  # the tree split them too
            assert choose_config(shape, H100_SM90) == split_config(shape, H100_SM90), case
        else:
            assert choose_config(shape, H100_SM90) == replace(fitted, persistent=persistent), case
    assert sorted(triton_decodes) == ["decode-b128-ctx4k", "decode-b256-ctx1k", "decode-b32-ctx4k",
                                      "decode-b64-ctx2k", "decode-b64-ctx4k", "decode-b64-ctx512"]
    assert sorted(long_splits) == ["decode-b1-ctx16k", "decode-b4-ctx16k", "mqa-decode-b16-ctx4k"]


def test_every_choice_of_auto_says_why(monkeypatch):
    """`decide` returns `choose_config`'s config with the rule that chose it: the fitted tree,
    the occupancy rule (with its numbers), the Gluon kernel, or a step's own tree."""
    from attnbench.kernels.dispatch.heuristics import choose_config, decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    spec = BatchShape(8, 32, 4, 16384, 28, 4, 128)
    assert decide(spec, H100_SM90).why == ("split-KV: 4-token queries over 16384 keys; the Q-block step would launch "
                                          "64 programs for 132 SMs (at most 66 split where the Gluon kernel runs); "
                                          "8 segments per Q-block, whatever the fitted tree")
    assert decide(SHAPES[2], H100_SM90).why == "the fitted tree (tuned_nvidia_h100_80gb_hbm3)"  # persistent, 2,048 items
    assert decide(BatchShape(1, 2048, 2048, 2048, 32, 8, 128), H100_SM90).why == (
        "the fitted tree (tuned_nvidia_h100_80gb_hbm3), one program per item: the longest sequence has 2048 keys "
        "(persistent only up to 1024, with at least 5 work items per SM of a head that takes 128-key tiles, "
        "or on short queries of equal, known lengths)")
    # equal short queries keep the tree's persistent launch at any length, in static shares;
    # one sequence shorter, or lengths a captured graph does not know, and they do not
    spec2 = BatchShape(64, 128, 2, 2048, 32, 8, 128, 64 * 2048)
    assert decide(spec2, H100_SM90) == (KernelConfig("qblock_ws", tile_size=128, block_m=128, num_warps=12,
                                                     persistent=True),
                                        "the fitted tree (tuned_nvidia_h100_80gb_hbm3)")
    for uneven in (replace(spec2, sum_seqlen_k=64 * 2048 - 5), replace(spec2, sum_seqlen_k=None)):
        assert not decide(uneven, H100_SM90).config.persistent, uneven
    short_decodes = BatchShape(16, 16, 1, 512, 32, 8, 128)  # persistent, as fitted
    assert decide(short_decodes, H100_SM90) == (KernelConfig("qblock_ws", tile_size=128, block_m=128, num_warps=12,
                                                             persistent=True),
                                                "the fitted tree (tuned_nvidia_h100_80gb_hbm3)")
    assert decide(SHAPES[2], HOPPER_UNTUNED).why == ("2048-token queries that fill the 2D grid, on sm_90 with Gluon: "
                                                     "qblock_ws's own tree")
    assert decide(SHAPES[2], H100).why == "the qblock step's own tree"
    assert decide(SHAPES[2], H100, "static_grid").why == "static_grid named: its own tree"
    head_80, head_256 = BatchShape(4, 8192, 2048, 2048, 32, 8, 80), BatchShape(4, 8192, 2048, 2048, 32, 8, 256)
    assert decide(head_80, H100_SM90).why.startswith("the fitted tree picked qblock_ws, which does not run here")
    # decodes at a head of two column pieces run the Gluon kernel too (`grid.gluon_runs`)
    two_piece_decodes = BatchShape(24, 24, 1, 12288, 16, 8, 192, 24 * 12288)
    assert decide(two_piece_decodes, H100_SM90) == (
        KernelConfig("qblock_ws", tile_size=64, block_m=128, num_warps=12, persistent=True),
        "the fitted tree (tuned_nvidia_h100_80gb_hbm3), 64-key tiles: the largest that fit head size 192")
    assert decide(two_piece_decodes, HOPPER_UNTUNED).why == ("1-token queries that fill the 2D grid, on sm_90 with "
                                                          "Gluon: qblock_ws's own tree")
    many_decodes = BatchShape(64, 64, 1, 4096, 32, 8, 128)
    assert decide(many_decodes, HOPPER_UNTUNED).why == ("the qblock step's own tree: decodes over at most 4096 keys "
                                                        "in 512 programs for 114 SMs")
    assert decide(many_decodes, H100_SM90) == (step("qblock").default_config(many_decodes, H100_SM90),
                                               "the qblock step's own tree: decodes over at most 4096 keys in 512 "
                                               "programs for 132 SMs, whatever the fitted tree")
    assert decide(head_256, H100_SM90).why.endswith(", 64-key tiles: the largest that fit head size 256")
    captured = BatchShape(500, 500, 1, 8192, 32, 8, 128)  # a decode graph captured at max_model_len
    assert decide(captured, H100_SM90).why == ("the qblock step's own tree: decodes over unknown lengths up to 8192 "
                                              "keys in 4000 programs for 132 SMs, whatever the fitted tree")
    for shape in (*SHAPES, spec, head_80, head_256, two_piece_decodes, many_decodes):
        for platform in (H100, H100_SM90, HOPPER_UNTUNED):
            assert decide(shape, platform).config == choose_config(shape, platform)


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_prefills_of_many_work_items_launch_persistent(monkeypatch, tree):
    """Batches of long queries launch the Gluon kernel persistent from 5 work items per SM
    (`host.many_items`; its programs then claim items as they free up), at any length, with
    or without a fitted tree: 48 Llama-8B prompts of 384 tokens give 4,608 items for 132
    SMs, 32 of 256 and 16 of 512 give 2,048, 48 of 2k 24,576, 4 of 1k and 2 of 2k 1,024 (7.8 per SM);
    4 of 512 and one of 2k give 512 (3.9) and keep one program per item. So do Gemma-2's
    prefills past 1k keys however many items they have: head 256 takes 64-key tiles, and
    its items are long; up to 1k keys they count as Llama's. Decodes count no items: their
    persistent launch follows the key length."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    many = decide(BatchShape(16, 16 * 512, 512, 512, 32, 8, 128), H100_SM90)  # 2,048 items
    assert (many.config.variant, many.config.tile_size, many.config.persistent) == ("qblock_ws", 64, True)
    if tree == "shipped":
        assert many.why.endswith(", persistent: at least 5 work items per SM, claimed as programs free up")
    for more in (BatchShape(16, 16 * 512, 512, 512, 32, 8, 128), BatchShape(48, 48 * 2048, 2048, 2048, 32, 8, 128),
                 BatchShape(4, 4 * 1024, 1024, 1024, 32, 8, 128), BatchShape(2, 2 * 2048, 2048, 2048, 32, 8, 128)):
        assert decide(more, H100_SM90).config.persistent is True, more
    for fewer in (BatchShape(4, 4 * 512, 512, 512, 32, 8, 128), BatchShape(1, 2048, 2048, 2048, 32, 8, 128)):
        assert decide(fewer, H100_SM90).config.persistent is False, fewer
    gemma = BatchShape(4, 4 * 4096, 4096, 4096, 16, 8, 256)  # 2,048 items, 15.5 per SM
    assert host.claims_items(4096, host.work_items(4 * 4096, 4, 4096, 2, 8), 132) and not host.many_items(gemma, 132)
    assert decide(gemma, H100_SM90).config.persistent is False
    for short_gemma in (BatchShape(64, 64 * 128, 128, 128, 16, 8, 256), BatchShape(16, 16 * 512, 512, 512, 16, 8, 256),
                        BatchShape(8, 8 * 1024, 1024, 1024, 16, 8, 256)):  # 1,024 items, 7.8 per SM
        assert host.many_items(short_gemma, 132), short_gemma
    assert not host.many_items(BatchShape(4, 4 * 1024, 1024, 1024, 16, 8, 256), 132)  # 512 items, 3.9 per SM
    assert not host.many_items(BatchShape(8, 8 * 1025, 1025, 1025, 16, 8, 256), 132)  # past 1k keys
    assert host.many_items(BatchShape(48, 48 * 384, 384, 384, 32, 8, 128), 132)
    assert not host.many_items(BatchShape(4, 4 * 512, 512, 512, 32, 8, 128), 132)
    assert not host.many_items(BatchShape(2048, 2048, 1, 4096, 32, 8, 128), 132)  # decodes
    # Qwen-7B: Q-blocks of 18 tokens x 7 heads, 4,552 of them
    assert host.many_items(BatchShape(40, 40 * 512, 512, 512, 28, 4, 128), 132)


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_long_queries_over_few_work_items_split_the_gluon_kernels_tiles(monkeypatch, tree):
    """Where long queries give the Gluon kernel at most 0.75 work items per SM, `auto` cuts
    each Q-block's tiles into segments (`host.split_segments`), one program each, with or
    without a fitted tree, and says so: rules.yaml's few-items cases. Llama-8B's 128-token
    chunk over 32k keys (32 items) in 8 segments, its 256-token chunk over 16k (64) in 4, a
    256-token prompt beside 4 decodes over 32k (96) in 2; its 512-token chunk over 16k (128
    items, 0.97 per SM) and 1k chunk over 8k (256) are not split, nor are short queries (the
    split-KV step's), nor keys too few to cut (at least 1,024 per segment). Equal chunks
    (`host.even_chunk_items`) of more than 33 items take the fewest segments of as few
    rounds: 64 items 2, Starcoder's 96 none."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    split = {BatchShape(1, 128, 128, 32768, 32, 8, 128): 8, BatchShape(1, 256, 256, 16384, 32, 8, 128): 4,
             BatchShape(5, 260, 256, 32768, 32, 8, 128, 256 + 4 * 32768): 2,
             BatchShape(1, 512, 512, 16384, 16, 8, 256): 4,  # Gemma-2's heads: 64-key tiles
             BatchShape(1, 256, 256, 2048, 32, 8, 128): 2,  # two segments of 1,024 keys
             BatchShape(1, 256, 256, 2047, 32, 8, 128): 1}  # one key fewer: one segment
    for shape, segments in split.items():
        decision = decide(shape, H100_SM90)
        assert decision.config.variant == "qblock_ws", shape
        assert (decision.config.num_segments, decision.config.persistent) == (segments, False), shape
        if segments > 1:
            assert f", {segments} segments per Q-block: {host.shape_work_items(shape)} work items for 132 SMs" \
                in decision.why, decision.why
    for whole in (BatchShape(1, 512, 512, 16384, 32, 8, 128), BatchShape(1, 1024, 1024, 8192, 32, 8, 128)):
        config = decide(whole, H100_SM90).config
        assert (config.variant, config.num_segments) == ("qblock_ws", 1), whole
    # equal chunks whose lengths the caller gives: the fewest segments whose rounds end as
    # soon (`host.split_rounds`); 32 items keep the rule's 8
    for shape, segments in ((BatchShape(1, 256, 256, 16384, 32, 8, 128, 16384), 2),  # 64 items: 0.5 in 2 or 4
                            (BatchShape(1, 512, 512, 16384, 16, 8, 256, 16384), 2),
                            (BatchShape(1, 256, 256, 4809, 48, 4, 128, 4809), 1),  # Starcoder, 96: 1.0 either way
                            (BatchShape(1, 128, 128, 32768, 32, 8, 128, 32768), 8),
                            (BatchShape(5, 260, 256, 32768, 32, 8, 128, 256 + 4 * 32768), 2)):  # not equal
        assert decide(shape, H100_SM90).config.num_segments == segments, shape
    assert host.split_rounds(96, 2, 132) == host.split_rounds(96, 1, 132) == 1.0
    assert not host.even_chunk_items(BatchShape(2, 512, 256, 300, 32, 8, 128, 600))  # prompts: causal
    speculative = BatchShape(4, 4 * 8, 8, 32768, 32, 8, 128)  # 32 items, but short queries
    assert host.split_segments(speculative, 132) == 1
    assert decide(speculative, H100_SM90).config.variant == "parallel_tiled"
    assert host.shape_work_items(BatchShape(1, 512, 512, 16384, 32, 8, 128)) == 128


def _snake_deal_spread(num_seqs, query_len, qpk, num_kv_heads, tile_size, programs):
    """`host.static_deal_spread` item by item, as the kernel walks it: program p's item of
    round r (`blocks.program_item`), located as `blocks.qblock_item` and `sequence_qblock`
    do (each sequence's Q-blocks of 128 rows of its tokens x heads, in order)."""
    rows = query_len * qpk
    per_seq = -(-rows // 128)
    assert host_listed(num_seqs * query_len, num_seqs, query_len, qpk) == per_seq  # no spare Q-blocks
    num_q_blocks = num_seqs * per_seq
    num_items = num_q_blocks * num_kv_heads
    shares = [0] * programs
    for p in range(programs):
        for r in range(-(-num_items // programs)):
            item = r * programs + (p if r % 2 == 0 else programs - 1 - p)
            if item >= num_items:
                continue
            local = (num_q_blocks - 1 - item // num_kv_heads) % per_seq
            keys = (min(rows, (local + 1) * 128) - 1) // qpk + 1
            shares[p] += -(-keys // tile_size) + 1
    return max(shares) / (sum(shares) / programs)


def host_listed(num_tokens, num_seqs, max_seqlen_q, qpk):
    from attnbench.kernels.hopper import host

    return host.listed_q_blocks_per_seq(num_tokens, num_seqs, max_seqlen_q, qpk)


def test_the_static_deal_spread_is_the_kernels_own_deal():
    """`host.static_deal_spread` against the kernel's walk item by item, on random prompt
    batches; and where it sends a batch: static shares where the busiest program's work is
    within 5% of the mean (`host.deals_static_shares`), or 12% for prompts of up to 768
    tokens in 128-key tiles, claims otherwise. On 132 SMs Llama-8B's 32 x 256, 48 x 384 and
    32 x 512 spread 1.02-1.03, Llama-1B's 40 x 512 1.08 and 8 x 768 1.11 (static shares won
    on all), Llama-8B's 4 x 768 1.18, 16 x 512 1.33 and 8 x 1k 1.50 (the claims won or tied:
    rules.yaml many-items, short-tiles and busy-tiles)."""
    from attnbench.kernels.hopper import host

    rng = random.Random(7)
    for _ in range(40):
        args = (rng.randint(1, 40), rng.choice([100, 256, 384, 500, 512, 1024]), rng.choice([1, 2, 4, 7, 8, 71]),
                rng.choice([1, 2, 8]), rng.choice([64, 128]), rng.choice([4, 66, 132]))
        assert host.static_deal_spread(*args) == pytest.approx(_snake_deal_spread(*args)), args
    assert host.static_deal_spread(48, 384, 4, 8, 128, 132) < 1.05 < host.static_deal_spread(40, 512, 4, 8, 128, 132)
    assert host.static_deal_spread(8, 768, 4, 8, 128, 132) < 1.12 < host.static_deal_spread(4, 768, 4, 8, 128, 132)
    assert host.deals_static_shares(32, 32 * 512, 512, 512, 4, 8, 128, 132)
    assert host.deals_static_shares(32, 32 * 256, 256, 256, 4, 8, 64, 132)
    assert host.deals_static_shares(40, 40 * 512, 512, 512, 4, 8, 128, 132)  # a short prompt, 1.08
    assert not host.deals_static_shares(40, 40 * 512, 512, 512, 4, 8, 64, 132)  # in 64-key tiles, 1.11
    assert not host.deals_static_shares(4, 4 * 768, 768, 768, 4, 8, 128, 132)
    assert not host.deals_static_shares(16, 16 * 512, 512, 512, 4, 8, 128, 132)
    assert not host.deals_static_shares(32, 32 * 512, 512, 2048, 4, 8, 128, 132)  # a context: lengths unknown
    assert not host.deals_static_shares(32, 32 * 512 - 1, 512, 512, 4, 8, 128, 132)  # one prompt shorter


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_prompts_dealt_even_static_shares_take_128_key_tiles(monkeypatch, tree):
    """`auto` gives prompts that its persistent launch deals in even static shares 128-key
    tiles from 512 keys (they took 0.83-1.02x the 64-key time there, 0.98-1.07x over 256-
    384), with or without a fitted tree; uneven ones keep 64-key tiles up to 512 keys and
    claim their items. Head 256 takes 64-key tiles either way."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    for even in (BatchShape(40, 40 * 512, 512, 512, 32, 8, 64), BatchShape(32, 32 * 512, 512, 512, 32, 8, 64),
                 BatchShape(32, 32 * 512, 512, 512, 32, 32, 96)):
        config = decide(even, H100_SM90).config
        assert (config.variant, config.tile_size, config.persistent) == ("qblock_ws", 128, True), even
    for short in (BatchShape(48, 48 * 384, 384, 384, 32, 8, 128), BatchShape(32, 32 * 256, 256, 256, 32, 8, 128)):
        assert host.prefill_deals_static_shares(short, 132)
        config = decide(short, H100_SM90).config
        assert (config.variant, config.tile_size, config.persistent) == ("qblock_ws", 64, True), short
    uneven = decide(BatchShape(16, 16 * 512, 512, 512, 32, 8, 128), H100_SM90).config
    assert (uneven.tile_size, uneven.persistent) == (64, True)
    gemma = BatchShape(32, 32 * 256, 256, 256, 16, 8, 256)
    assert host.prefill_deals_static_shares(gemma, 132)
    assert (decide(gemma, H100_SM90).config.tile_size, decide(gemma, H100_SM90).config.persistent) == (64, True)
    if tree == "shipped":
        assert decide(BatchShape(32, 32 * 512, 512, 512, 32, 8, 64), H100_SM90).why.endswith(
            ", persistent: at least 5 work items per SM, in even static shares, "
            "128-key tiles: prompts in even static shares")


def test_a_launch_lists_each_sequences_q_blocks_where_that_is_no_longer_than_the_bound():
    """`host.listed_q_blocks_per_seq`: decodes and speculative decodes whose longest query
    fits a Q-block list one Q-block per sequence, equal queries their Q-blocks and no
    spare; a prompt beside decodes, or a launch that does not know its longest query
    (compiling only), lists the grid's bound with its spare Q-blocks."""
    from attnbench.kernels.hopper import host

    # Llama-70B's B48 decode: 8 heads per KV head, 16 tokens' rows per Q-block; the bound has 3 spares
    assert host_listed(48, 48, 1, 8) == 1 and host.q_blocks_bound(48, 48, 8) == 51
    assert host_listed(48, 48, None, 8) == 0
    # 8-token speculative decodes at 4 heads per KV head: the bound has a spare per 4 sequences
    assert host_listed(16 * 8, 16, 8, 4) == 1 and host.q_blocks_bound(16 * 8, 16, 4) == 20
    # a query that fills its Q-block exactly, and one a token longer
    assert host.one_q_block_per_seq(4, 32) and host_listed(32, 1, 32, 4) == 1
    assert not host.one_q_block_per_seq(4, 33) and host_listed(33, 1, 33, 4) == 2
    # Falcon-7B's 71 heads per KV head: a decode's 71 rows fit, a 2-token query's 142 do not
    assert host.one_q_block_per_seq(71, 1) and not host.one_q_block_per_seq(71, 2)
    assert host_listed(32 * 6, 32, 6, 71) == 4  # 426 rows: the bound would list 32 x 4.3
    # equal prompts: Qwen-7B's 40 x 512 at 7 heads per KV head, 28 Q-blocks each (the bound: 29)
    assert host_listed(40 * 512, 40, 512, 7) == 28 and host.q_blocks_bound(40 * 512, 40, 7) == 40 * 29
    # a 1k prompt beside 32 decodes: 32 of the prompt's Q-blocks per sequence would be most of them spare
    assert host_listed(1024 + 32, 33, 1024, 4) == 0


def test_q_blocks_are_128_rows_of_tokens_by_heads_whatever_the_group():
    """`host.q_blocks`, `q_blocks_bound` and `q_block_span`: a Q-block is 128 rows of a
    sequence's tokens x query heads of one KV head. Groups that divide 128 make it whole
    tokens (the Triton steps' packing); Falcon-7B's 71 heads fill it over two or three
    tokens instead of leaving 57 rows of one token's Q-block empty."""
    from attnbench.kernels.hopper import host

    assert host.q_blocks(2048, 8) == 128 and host.q_block_span(8) == 16
    assert host.q_blocks(2048, 71) == 1136 and host.q_block_span(71) == 3  # was 2,048 Q-blocks of one token
    assert host.q_blocks(18, 7) == 1 and host.q_blocks(19, 7) == 2 and host.q_block_span(7) == 20
    assert host.q_blocks(1, 128) == 1 and host.q_block_span(128) == 1
    # the bound holds every sequence's Q-blocks wherever its rows start
    rng = random.Random(0)
    for _ in range(200):
        qpk = rng.choice([1, 3, 7, 12, 71, 96, 128])
        lens = [rng.randint(1, 300) for _ in range(rng.randint(1, 6))]
        starts = [sum(lens[:s]) * qpk // 128 + s for s in range(len(lens))]
        ends = [start + host.q_blocks(n, qpk) for start, n in zip(starts, lens)]
        assert all(end <= nxt for end, nxt in zip(ends, starts[1:]))
        assert ends[-1] <= host.q_blocks_bound(sum(lens), len(lens), qpk)


def test_uniform_short_queries_run_static_shares_where_they_fill_the_rounds(monkeypatch):
    """On an H200 (132 SMs, no fitted tree): many short queries of equal, known lengths run
    the Gluon kernel persistent, in static shares, unless they are decodes whose items
    would leave those rounds idle (two rounds or fewer, under 80% filled:
    `host.static_rounds_full`), which keep the Triton step and say why. rules.yaml's
    decode-rounds cases: Llama-8B B24 over 1.5k (192 items, 73% of two rounds) keeps
    Triton; B36 over 1k (three rounds) and B30 over 3k (91%) do not; a 4-token speculative
    B24 runs the Gluon kernel. Ragged batches, unknown lengths and head 256 keep their rules."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host
    from attnbench.kernels.steps import qblock

    monkeypatch.setattr(host, "available", lambda: True)
    h200 = Platform("cuda", 132, "NVIDIA H200", "sm_90")

    def decodes(num_seqs, keys, tokens=1, **heads):
        shape = BatchShape(num_seqs, num_seqs * tokens, tokens, keys, heads.get("q", 32), heads.get("kv", 8),
                           heads.get("head", 128), sum_seqlen_k=num_seqs * keys)
        return shape, decide(shape, h200)

    shape, kept = decodes(24, 1500)
    assert kept.config == step("qblock").default_config(shape, h200)
    assert kept.why.endswith("(equal lengths: 192 items would fill 73% of 2 static rounds)")
    for shape, gluon in (decodes(36, 1024), decodes(30, 3072), decodes(24, 2048, tokens=4),
                         decodes(84, 2048, q=28, kv=4)):
        config = gluon.config
        assert (config.variant, config.persistent, config.tile_size) == ("qblock_ws", True, 128), shape
    ragged = BatchShape(36, 36, 1, 1024, 32, 8, 128, sum_seqlen_k=30 * 1024 + 6 * 500)
    assert decide(ragged, h200).config.variant == "qblock"
    assert decide(replace(ragged, sum_seqlen_k=None), h200).config.variant == "qblock"
    _, gemma = decodes(128, 600, q=16, kv=8, head=256)
    assert gemma.config == qblock.TRITON_DECODE_WIDE_HEADS
    # 8-token queries at 32 query heads per KV head: 256 rows, two Q-blocks per sequence, so
    # the list keeps its spare items and static shares are not even
    wide, _ = decodes(64, 2048, tokens=8, q=32, kv=1)
    assert not host.even_static_shares(wide) and host.even_static_shares(replace(wide, max_seqlen_q=4, num_tokens=256))


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_a_mixed_batch_counts_one_work_item_per_decode(monkeypatch, tree):
    """A decode beside prompts is a Q-block of its own: Phi-3's 32 decodes beside two 1k
    prompts hold 41 Q-blocks x 32 KV heads = 1,312 items at least (9.9 per SM), not the
    17 x 32 = 544 their 2,080 tokens fill, so the batch launches persistent and claims its
    items (on the H100, docs/perf/h100/dynamic-2026-11-27.csv: 357 against 375 us one per
    item); Llama-8B's 48 decodes beside a 2k chunk hold (64 + 48) x 8 = 896 (6.8 per SM;
    215 against 222 us). Without decodes the count is the tokens' (a uniform prefill's
    Q-blocks are full), and 16 decodes beside four 256-token prompts of Llama-70B (520
    items, 3.9 per SM) keep one program per item."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    phi3_mix = BatchShape(34, 32 + 2 * 1024, 1024, 2000, 32, 32, 96, 32 * 2000 + 2 * 1024)
    assert host.work_items(32 + 2 * 1024, 34, 1024, 1, 32) == 1312
    llama_mix = BatchShape(49, 48 + 2048, 2048, 3072, 32, 8, 128, 48 * 3072 + 3072)
    assert host.work_items(48 + 2048, 49, 2048, 4, 8) == 896
    for mixed in (phi3_mix, llama_mix):
        assert host.many_items(mixed, 132), mixed
        config = decide(mixed, H100_SM90).config
        assert (config.variant, config.persistent) == ("qblock_ws", True), mixed
    assert host.work_items(4 * 2048, 4, 2048, 4, 8) == 4 * 64 * 8  # uniform prefill: its tokens' Q-blocks
    seventy_b_mix = BatchShape(20, 16 + 4 * 256, 256, 8192, 64, 8, 128, 20 * 8192)
    assert host.work_items(16 + 4 * 256, 20, 256, 8, 8) == 520
    assert not host.many_items(seventy_b_mix, 132)
    assert decide(seventy_b_mix, H100_SM90).config.persistent is False


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_a_ragged_decode_splits_where_its_longest_sequences_would_idle_the_gpu(monkeypatch, tree):
    """Counted at the longest sequence's length, a ragged decode's programs may not fill the
    GPU although there are more of them than SMs: 4 Gemma-2 sequences over 12k keys and 20
    over 1k (192 programs) count 46, and split their keys with or without a fitted tree
    (no tree reads the sum of keys). Where the Gluon kernel runs, a ragged batch of more
    than a wave splits up to one full-length program per SM (a uniform one up to half):
    48 Llama-8B sequences (384 programs) count 86 and split; 12 over 8k keys and 52 over
    1k (512 programs) count 148 and keep the 2D grid. That is at 4 query rows of head 128
    per Q-block; Qwen-7B's 7 rows split up to 75 (`split_kv._ragged_split_share`), a speculative
    batch's 16 rows of head 64 up to half the SMs, Llama-1B's 4 rows of head 64 up to one
    per SM. Unknown lengths (a captured graph) do not split."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    gemma = BatchShape(24, 24, 1, 12288, 16, 8, 256, sum_seqlen_k=20 * 1024 + 4 * 12288)
    assert gemma.full_length_share == pytest.approx(69632 / (24 * 12288))
    split = decide(gemma, H100_SM90)
    assert split.config == replace(step("parallel_tiled").default_config(gemma, H100_SM90), equal_segments=True,
                                   num_stages=2)
    assert split.why.startswith("split-KV: 1-token queries over 12288 keys; the Q-block step would launch 192 "
                                "programs, 46 at the longest sequence's length (69632 keys in 24 sequences) "
                                "for 132 SMs (at most 132 split where the Gluon kernel runs, the batch being "
                                "ragged over more than a wave); segments as long as the longest sequence's")
    assert split.why.endswith(", whatever the fitted tree") == (tree == "shipped")
    assert decide(replace(gemma, sum_seqlen_k=24 * 12288), H100_SM90).config.variant == "qblock_ws"  # uniform
    # unknown lengths (a captured graph): no split; many decodes keep the Triton step
    # (`short_queries.many_short_queries`), at head 256 from 5 programs per SM: 192 are 1.5
    assert decide(replace(gemma, sum_seqlen_k=None), H100_SM90).config.variant == "qblock_ws"
    assert decide(replace(gemma, num_seqs=96, num_tokens=96, sum_seqlen_k=None), H100_SM90).config.variant == "qblock"
    llama = BatchShape(48, 48, 1, 16384, 32, 8, 128, sum_seqlen_k=176128)
    assert decide(llama, H100_SM90).config.variant == "parallel_tiled"
    assert "86 at the longest sequence's length" in decide(llama, H100_SM90).why
    long_enough = BatchShape(64, 64, 1, 8192, 32, 8, 128, sum_seqlen_k=12 * 8192 + 52 * 1025)
    assert decide(long_enough, H100_SM90).config.variant == "qblock_ws"
    # more query rows per Q-block, a lower split point: Qwen-7B's 7 heads per KV head up to
    # 75 (int(132 x 512 / 896)); 4 speculative tokens x 4 heads of 64 up to half the SMs
    qwen = BatchShape(90, 90, 1, 10001, 28, 4, 128, sum_seqlen_k=20 * 10001 + 70 * 501)  # 95
    assert decide(qwen, H100_SM90).config.variant == "qblock_ws"
    qwen_fewer = BatchShape(96, 96, 1, 20001, 28, 4, 128, sum_seqlen_k=6 * 20001 + 90 * 701)  # 37
    assert "(at most 75 split where the Gluon kernel runs, the batch being ragged over more than a wave)" \
        in decide(qwen_fewer, H100_SM90).why
    spec = BatchShape(40, 160, 4, 7004, 32, 8, 64, sum_seqlen_k=10 * 7004 + 30 * 1004)  # 115
    assert decide(spec, H100_SM90).config.variant == "qblock_ws"
    assert "(at most 66 split where the Gluon kernel runs, the batch being ragged over more than a wave)" \
        in decide(replace(spec, sum_seqlen_k=4 * 7004 + 36 * 504), H100_SM90).why  # 53
    assert decide(BatchShape(60, 60, 1, 8192, 32, 8, 64, sum_seqlen_k=10 * 8192 + 50 * 1025),  # 131
                  H100_SM90).config.variant == "parallel_tiled"
    # a uniform batch of fewer programs than SMs splits only up to half of them there
    assert decide(BatchShape(12, 12, 1, 16384, 32, 8, 128, sum_seqlen_k=12 * 16384), H100_SM90).config.variant \
        == "qblock_ws"
    # the Triton step splits up to one program per SM, ragged or not
    monkeypatch.setattr(host, "available", lambda: False)
    assert decide(llama, H100_SM90).config.variant == "parallel_tiled"
    assert decide(replace(llama, sum_seqlen_k=None), H100_SM90).config.variant == "qblock"


def test_a_windowed_batch_is_costed_as_the_keys_its_windows_hold():
    """Every kernel skips the tiles before its rows' windows, so the trees see a sequence's
    keys as at most window + query - 1 (`BatchShape.in_window`): gpt-oss's 128-token window
    over 64k-token decodes is a decode over 128 keys, and no split; a 4k window over ragged
    30k contexts is a batch of 4k-key sequences of unknown raggedness within it (the sum
    an upper bound). A fresh prompt spans its keys whatever the window."""
    from attnbench.kernels.dispatch.heuristics import decide

    gptoss = BatchShape(8, 8, 1, 64201, 64, 8, 64, sum_seqlen_k=513608)
    windowed = gptoss.in_window(128)
    assert (windowed.max_seqlen_k, windowed.sum_seqlen_k) == (128, 8 * 128)
    assert gptoss.in_window(None) is gptoss and gptoss.in_window(0) is gptoss and gptoss.in_window(70000) is gptoss
    assert decide(gptoss, H100_SM90).config.variant == "parallel_tiled"  # 64 programs: split, unwindowed
    assert decide(windowed, H100_SM90).config.variant != "parallel_tiled"
    spec = BatchShape(4, 32, 8, 29455, 40, 40, 128, sum_seqlen_k=4 * 29455).in_window(4096)
    assert (spec.max_seqlen_k, spec.sum_seqlen_k) == (4096 + 7, 4 * 4103)
    ragged = BatchShape(48, 48, 1, 30845, 32, 16, 128, sum_seqlen_k=214186).in_window(4096)
    assert (ragged.max_seqlen_k, ragged.sum_seqlen_k, ragged.full_length_share) == (4096, 48 * 4096, 1.0)
    short_ragged = BatchShape(48, 48, 1, 30845, 32, 16, 128, sum_seqlen_k=100000).in_window(4096)
    assert short_ragged.sum_seqlen_k == 100000  # under 48 windows' worth: the sum stands
    prompt = BatchShape(2, 8498, 4249, 4249, 64, 8, 64, sum_seqlen_k=8498)
    windowed_prompt = prompt.in_window(128)  # its lengths stand; the window stays for its Q-blocks
    assert windowed_prompt == replace(prompt, sliding_window=128)
    assert windowed_prompt.q_block_keys(16) == 128 + 15 and prompt.q_block_keys(16) == 4249
    chunk = BatchShape(1, 1024, 1024, 45650, 8, 4, 256, sum_seqlen_k=45650).in_window(4096)
    assert chunk.max_seqlen_k == 4096 + 1023


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_long_decodes_split_where_the_gluon_kernels_rounds_are_under_three_quarters_full(monkeypatch, tree):
    """Uniform decodes and speculative decodes over more than 4k keys whose Gluon items take
    two or three static rounds of the SMs and fill less than 75% of them split in 8
    segments (`split_kv._split_for_waves`), with or without a fitted tree, and say so; at
    79% and 97% filled, past three rounds, at 4k keys (the Triton step's), at head 256, on
    ragged lengths, and without the Gluon kernel, they do not."""
    from attnbench.kernels.dispatch import split_kv
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")

    def decodes(num_seqs, keys, tokens=1, q=32, kv=8, head=128):
        return BatchShape(num_seqs, num_seqs * tokens, tokens, keys, q, kv, head, sum_seqlen_k=num_seqs * keys)

    for shape, items, fill, rounds in ((decodes(17, 16384), 136, "52%", 2), (decodes(20, 32768, tokens=4, head=64), 160, "61%", 2),
                                       (decodes(18, 12288, tokens=2), 144, "55%", 2), (decodes(36, 16384), 288, "73%", 3),
                                       (decodes(4, 24576, tokens=4, q=40, kv=40), 160, "61%", 2)):
        decision = decide(shape, H100_SM90)
        assert (decision.config.variant, decision.config.num_segments) == ("parallel_tiled", 8), shape
        assert f"the Gluon kernel's {items} items would fill {fill} of {rounds} static rounds" in decision.why
    for shape in (decodes(26, 16384), decodes(32, 32768), decodes(50, 16384), decodes(20, 4096),
                  decodes(17, 16384, q=16, head=256), replace(decodes(20, 16384), sum_seqlen_k=19 * 16384 + 100),
                  replace(decodes(20, 16384), sum_seqlen_k=None)):
        assert not split_kv._split_for_waves(shape, H100_SM90), shape
        assert decide(shape, H100_SM90).config.num_segments != 8, shape
    monkeypatch.setattr(host, "available", lambda: False)
    assert not split_kv._split_for_waves(decodes(17, 16384), H100_SM90)


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_uniform_decodes_of_17_to_26_pairs_split_in_64_key_tiles(monkeypatch, tree):
    """Where 16 segments of a split's (sequence, KV head) pairs are more than 2 programs per
    SM but at most 3.2 (`split_kv._narrow_split_tiles`: 17-26 pairs on 132 SMs), uniform
    decodes at head 128 split in 64-key tiles, 16 segments, 2 stages, with or without a
    fitted tree; 16, 28 and 30 pairs keep 128-key tiles (16, 8 and 8 segments), and so do a
    ragged batch, a 28-row speculative Q-block and head 64. The bound follows the SMs: 10
    pairs on 66 SMs take 64-key tiles."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")

    def decodes(num_seqs, keys, q, kv, head=128, tokens=1):
        return BatchShape(num_seqs, num_seqs * tokens, tokens, keys, q, kv, head, sum_seqlen_k=num_seqs * keys)

    def split(shape, platform=H100_SM90):
        config = decide(shape, platform).config
        assert config.variant == "parallel_tiled", shape
        return config.tile_size, config.num_segments, config.num_stages

    phi3 = decodes(2, 25714, 40, 10)  # the random grid's Phi-3-medium: 20 pairs
    assert decide(phi3, H100_SM90).why.endswith("16 segments per Q-block of 64-key tiles (320 programs, "
                                                 "2.4 per SM)" + (", whatever the fitted tree" if tree == "shipped"
                                                                  else ""))
    for shape in (phi3, decodes(17, 12288, 8, 1), decodes(13, 8192, 16, 2), decodes(3, 49152, 32, 8)):
        assert split(shape) == (64, 16, 2), shape
    assert split(decodes(2, 24576, 32, 8)) == (128, 16, 2)  # 16 pairs
    assert split(decodes(7, 8192, 32, 4)) == (128, 8, 2)  # 28 pairs: 3.4 programs per SM
    assert split(decodes(3, 16384, 40, 10)) == (128, 8, 2)  # 30 pairs
    assert split(replace(phi3, sum_seqlen_k=25714 + 20000))[0] == 128  # ragged
    assert split(decodes(5, 16384, 28, 4, tokens=4))[0] == 128  # 28 rows per pair: a 32-row Q-block
    assert split(decodes(2, 25714, 40, 10, head=64))[0] == 128
    half = Platform("cuda", 66, "NVIDIA H100 (66 SMs)", "sm_90")
    assert split(decodes(10, 16384, 8, 1), half) == (64, 16, 2)


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_prompts_under_a_short_window_take_64_key_tiles(monkeypatch, tree):
    """Where 64-key tiles stream 15% fewer of the keys a Q-block reads within its window
    than 128-key ones (`qblock_ws.short_window_q_blocks`), long queries take them, from the
    Gluon kernel's own tree and over a fitted tree's pick, which says why: gpt-oss's 128-key
    window (16-token Q-blocks: 143 keys) and Llama-8B under a 256-key window (32-token
    Q-blocks: 287); not a 384-key one (415 keys), nor 128-token Q-blocks under 256 (383),
    nor the same prompts without a window, nor decodes (costed at their window already)."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host, qblock_ws

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")

    def prompts(num_seqs, tokens, window, q=32, kv=8, head=128):
        return BatchShape(num_seqs, num_seqs * tokens, tokens, tokens, q, kv, head,
                          sum_seqlen_k=num_seqs * tokens).in_window(window)

    gptoss = prompts(1, 8192, 128, q=64, kv=8, head=64)
    for shape, tile in ((gptoss, 64), (prompts(2, 4096, 256), 64), (prompts(2, 4096, 384), 128),
                        (prompts(1, 8192, 256, kv=32), 128), (prompts(2, 4096, None), 128),
                        (prompts(1, 8192, None, q=64, kv=8, head=64), 128)):
        assert qblock_ws.short_window_q_blocks(shape) == (tile == 64), shape
        decision = decide(shape, H100_SM90)
        assert (decision.config.variant, decision.config.tile_size) == ("qblock_ws", tile), shape
    if tree == "shipped":
        assert decide(gptoss, H100_SM90).why.endswith("64-key tiles: a Q-block reads at most 143 keys "
                                                      "within the 128-key window")
    decodes = BatchShape(16, 16, 1, 32768, 32, 8, 128, sum_seqlen_k=16 * 32768).in_window(300)
    assert decodes.sliding_window == 300 and not qblock_ws.short_window_q_blocks(decodes)


def test_paged_attention_chooses_for_the_batch_within_its_window(monkeypatch):
    """`auto` through the entry point: the shape the trees get is the windowed one, and the
    same call without a window gets the raw lengths."""
    import torch

    from attnbench.kernels import paged_attention
    from attnbench.kernels.bench.batch import PagedBatch
    from attnbench.kernels.bench.implementations import prepare
    from attnbench.kernels.dispatch import api
    from attnbench.kernels.dispatch.heuristics import choose_config

    seen = []

    def recording(shape, platform, variant):
        seen.append(shape)
        return choose_config(shape, platform, variant)

    monkeypatch.setattr(api, "choose_config", recording)
    monkeypatch.setattr(api, "_VALID_LAYOUTS", {})
    api._config_for.cache_clear()
    try:
        for window in (None, 24):
            batch = PagedBatch.build([(1, 100), (1, 37), (3, 60)], num_q_heads=4, num_kv_heads=2, head_size=32,
                                     dtype=torch.bfloat16, device="cpu", sliding_window=window, seed=7)
            paged_attention(**batch.attention_kwargs())
            assert seen[-1] == batch.shape
        raw, windowed = seen
        assert (raw.max_seqlen_k, raw.sum_seqlen_k) == (101, 101 + 38 + 63)
        assert (windowed.max_seqlen_k, windowed.sum_seqlen_k) == (24 + 2, 3 * 26)
        # the microbenchmark's why column says what the trees saw
        assert prepare("auto", batch).why.startswith("26 keys at most within the 24-key window: ")
    finally:
        api._config_for.cache_clear()


@pytest.mark.parametrize("tree", ["shipped", "off"])
def test_a_split_cuts_known_lengths_into_equal_segments_and_a_sequences_queries_into_one_qblock(monkeypatch, tree):
    """Where `auto` splits a ragged batch whose keys the caller gives, every segment is as
    long as one of the longest sequence's (`equal_segments`), with or without a fitted
    tree; uniform batches and unknown lengths (a captured graph) keep each range's own cut. On sm_90 a speculative
    sequence's query rows share one Q-block, up to 64 rows: 4 tokens x 7 heads of Qwen2.5-7B
    in 32 rows, 8 x 7 in 64, 8 x 16 in two of 64; a decode keeps 16."""
    from attnbench.kernels.dispatch.heuristics import decide
    from attnbench.kernels.hopper import host
    from attnbench.kernels.steps.parallel_tiled import min_segment_tiles

    monkeypatch.setattr(host, "available", lambda: True)
    if tree == "off":
        monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    ragged = BatchShape(64, 64, 1, 16384, 32, 8, 128, sum_seqlen_k=4 * 16384 + 60 * 1024)
    config = decide(ragged, H100_SM90).config
    assert (config.variant, config.equal_segments) == ("parallel_tiled", True)
    assert decide(replace(ragged, sum_seqlen_k=None), H100_SM90).config.variant == "qblock"
    few = BatchShape(2, 2, 1, 8192, 32, 8, 128)  # 2 decodes: split whether lengths are known or not
    assert decide(few, H100_SM90).config.equal_segments is False
    assert decide(replace(few, sum_seqlen_k=8192 + 700), H100_SM90).config.equal_segments is True
    assert decide(replace(few, sum_seqlen_k=2 * 8192), H100_SM90).config.equal_segments is False  # equal already

    def block_m(q, q_heads, kv_heads, platform=H100_SM90):
        shape = BatchShape(2, 2 * q, q, 16384, q_heads, kv_heads, 128, sum_seqlen_k=2 * 16384)
        chosen = decide(shape, platform).config
        assert chosen.variant == "parallel_tiled"
        return chosen.block_m
    assert [block_m(4, 28, 4), block_m(8, 28, 4), block_m(8, 64, 4), block_m(1, 32, 8), block_m(4, 32, 8)] \
        == [32, 64, 64, 16, 16]
    assert block_m(4, 28, 4, H100) == 16  # measured on sm_90 only

    # the segments' least length: the longest range (or window, plus the tile its edge
    # may straddle) in num_segments; 1 without equal segments
    equal = KernelConfig("parallel_tiled", tile_size=64, num_segments=16, equal_segments=True)
    assert min_segment_tiles(equal, 1, 16384, None) == 16
    assert min_segment_tiles(equal, 1, 16385, None) == 17
    assert min_segment_tiles(equal, 4, 16384, 4096) == 5  # 4099 keys: 65 + 1 tiles
    assert min_segment_tiles(equal, 1, 500, 4096) == 1
    assert min_segment_tiles(replace(equal, equal_segments=False), 1, 16384, None) == 1
    with pytest.raises(ValueError, match="KernelConfig.equal_segments: only 'parallel_tiled'"):
        KernelConfig("qblock", equal_segments=True)


@pytest.mark.parametrize("gluon", [True, False])
def test_where_the_gluon_kernel_runs_a_decode_batch_splits_only_at_half_the_sms(monkeypatch, gluon):
    """One wave of the Gluon kernel over about every SM beats the split's reduction; the
    Triton step splits up to one program per SM. Decodes over 4k keys with 4 KV heads: 32
    sequences give 128 programs on 132 SMs, 16 give 64, 8 give 32."""
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: gluon)
    h200 = Platform("cuda", 132, "NVIDIA H200", "sm_90")  # no tree ships for it
    picks = [choose_config(BatchShape(n, n, 1, 4096, 28, 4, 128), h200).variant for n in (32, 16, 8)]
    assert picks == (["qblock_ws", "parallel_tiled", "parallel_tiled"] if gluon
                     else ["parallel_tiled", "parallel_tiled", "parallel_tiled"])
    # so at a head it takes in two pieces: 16 decodes over 8k keys at 8 KV heads of 192, 128 programs
    assert choose_config(BatchShape(16, 16, 1, 8192, 16, 8, 192), h200).variant == (
        "qblock_ws" if gluon else "parallel_tiled")


def test_the_gluon_kernel_takes_128_key_tiles_past_512_keys_where_they_fit():
    """`qblock_ws.default_config` (what a GPU without a fitted tree runs): 64-key tiles up to
    512 keys, 128-key ones past them at heads up to 128 (on the H100 128-key tiles took
    0.94-0.99x the 64-key time over 700-1,024 keys, 1.03-1.11x over 256-512:
    docs/perf/h100/short-tiles-2026-11-28.csv); head 256 keeps 64 (shared memory). The
    tile does not move the persistent launch: short queries up to 1,024 keys stay
    persistent, a uniform prefill of few items does not."""
    from attnbench.kernels.hopper import qblock_ws

    def config(keys, head=128, queries=1, seqs=96):
        return qblock_ws.default_config(BatchShape(seqs, seqs * queries, queries, keys, 32, 8, head), HOPPER_UNTUNED)

    for head in (64, 128):
        assert [config(k, head).tile_size for k in (256, 512, 513, 700, 1024, 4096)] == [64, 64, 128, 128, 128, 128]
    assert {config(k, 256).tile_size for k in (256, 700, 4096)} == {64}
    assert config(700).persistent and config(1024).persistent and not config(2048).persistent
    prefill = config(768, queries=768, seqs=2)  # 2 x 24 Q-blocks x 8 heads: 384 items, 3.4 per SM
    assert (prefill.tile_size, prefill.persistent) == (128, False)


def test_uniform_short_queries_take_128_key_tiles_from_256_keys():
    """Decodes and speculative decodes of equal, known lengths (`host.even_static_shares`)
    have no causal diagonal: `qblock_ws.default_config` gives them 128-key tiles from 256
    keys (rules.yaml decode-tiles: 0.91-0.98x the 64-key time on an H200), persistent.
    Ragged or unknown lengths of the same longest sequence keep 64-key tiles up to 512."""
    from attnbench.kernels.hopper import qblock_ws

    def config(keys, queries=1, seqs=128, head=128, sum_keys=None):
        return qblock_ws.default_config(BatchShape(seqs, seqs * queries, queries, keys, 32, 8, head, sum_keys),
                                        HOPPER_UNTUNED)

    assert [config(k, sum_keys=128 * k).tile_size for k in (128, 255, 256, 384, 512)] == [64, 64, 128, 128, 128]
    assert config(448, queries=4, seqs=96, sum_keys=96 * 448).tile_size == 128
    assert all(config(k, sum_keys=128 * k).persistent for k in (128, 384, 4096))
    assert config(384, sum_keys=128 * 384 - 1).tile_size == 64  # one sequence shorter: ragged
    assert config(384).tile_size == 64  # unknown lengths (a captured graph)
    assert config(384, head=256, sum_keys=128 * 384).tile_size == 64  # 128-key tiles do not fit head 256
    assert config(384, queries=64, seqs=8, sum_keys=8 * 384).tile_size == 64  # prefill-like: the diagonal
