"""The variant registry (kernels/variants.py) is the one list of the paper's steps: each
step's module declares itself, and every table of variants is derived from the registry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnbench.kernels.config import BatchShape, KernelConfig, Platform
from attnbench.kernels.variants import AUTO, CHOICES, VARIANTS, check_variant, step

H100 = Platform("cuda", 132, "test")
SHAPES = [BatchShape(1, 1, 1, 13000, 32, 8, 128), BatchShape(64, 64, 1, 4096, 32, 8, 128),
          BatchShape(4, 8192, 2048, 2048, 32, 8, 128), BatchShape(32, 528, 512, 2048, 64, 8, 128)]


@pytest.mark.parametrize("name", VARIANTS)
def test_each_step_declares_itself_beside_its_code(name):
    from attnbench.kernels.dispatch.heuristics import choose_config

    s = step(name)
    assert s.name == name and s.paper.startswith("sec. 4.") and callable(s.launch)
    for shape in SHAPES:
        config = s.default_config(shape, H100)
        assert config.variant == name and choose_config(shape, H100, name) == config


def test_every_table_of_variants_comes_from_the_registry():
    from attnbench.kernels.bench import implementations, spec
    from attnbench.kernels.bench.aot import representative_launches
    from attnbench.kernels.schema import COMPARATORS, HOPPER_KERNELS

    assert CHOICES == (AUTO, *VARIANTS)
    assert list(implementations.REGISTRY) == [*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS]
    assert spec.IMPLEMENTATIONS == (*VARIANTS, AUTO, *HOPPER_KERNELS, *COMPARATORS)
    assert list(representative_launches()) == list(VARIANTS)
    with pytest.raises(ValueError, match=r"variant: expected 'auto' or one of \['naive', 'qblock', "
                                         r"'parallel_tiled', 'static_grid'\], got 'flash'"):
        check_variant("flash")


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
    """On sm_90 without a tuned tree, with Gluon's Hopper API, `auto` runs prefill and mixed
    batches with `qblock_ws` (128 rows; 128-key tiles past 1,024 keys, 64-key ones up to
    it); decodes, other architectures, other head shapes, a Triton without Gluon and the
    paper's qblock step itself keep the Triton kernel."""
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.hopper import host

    monkeypatch.setattr(host, "available", lambda: gluon)  # as the heuristics see it
    prefill, mixed = SHAPES[2], SHAPES[3]
    for shape in (prefill, mixed):
        config = choose_config(shape, HOPPER_UNTUNED)
        expected = ("gluon_ws", 128) if gluon else ("triton", 128)  # 2,048 keys
        assert (config.variant, config.block_m, config.kernel, config.tile_size) == ("qblock", 128, *expected)
        assert choose_config(shape, H100).kernel == "triton"  # architecture unknown
        assert choose_config(shape, Platform("cuda", 108, "A100", "sm_80")).kernel == "triton"
        assert choose_config(shape, HOPPER_UNTUNED, "qblock").kernel == "triton"  # the paper's step: Triton
    for shape in SHAPES[:2]:  # decodes
        assert choose_config(shape, HOPPER_UNTUNED).kernel == "triton"
    serving_step = BatchShape(49, 304, 256, 512, 32, 8, 128)  # 48 decodes and a new prompt
    assert choose_config(serving_step, HOPPER_UNTUNED).tile_size == (64 if gluon else 128)
    monkeypatch.setenv("ATTNBENCH_GLUON", "0")  # the A/B switch
    assert choose_config(prefill, HOPPER_UNTUNED).kernel == "triton"
    monkeypatch.delenv("ATTNBENCH_GLUON")
    assert choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 256), HOPPER_UNTUNED).kernel == "triton"  # head 256
    assert choose_config(BatchShape(1, 512, 512, 512, 256, 1, 64), HOPPER_UNTUNED).kernel == "triton"  # 256 per KV head


@pytest.mark.parametrize("gluon", [True, False])
def test_the_h100_runs_its_tuned_tree(monkeypatch, gluon):
    """The H100's fitted tree (kernels/dispatch/tuned_nvidia_h100_80gb_hbm3.py): long
    prompts run the persistent Gluon kernel at 128-key tiles, short ones 64-key tiles, and
    so do batches of many decodes and a serving step of decodes with a new prompt; decodes
    of a few long sequences run Triton's split-KV step; where Gluon cannot run (no Gluon,
    ATTNBENCH_GLUON=0, head size 256, 256 query heads per KV head) the qblock step's own
    Triton config runs instead."""
    from attnbench.kernels.dispatch.heuristics import choose_config, tuned_tree_path
    from attnbench.kernels.hopper import host

    assert tuned_tree_path(H100_SM90.device_name).name == "tuned_nvidia_h100_80gb_hbm3.py"
    assert tuned_tree_path(H100_SM90.device_name).is_file()  # where `attnbench tune --emit` writes it to ship
    monkeypatch.setattr(host, "available", lambda: gluon)
    long_prompts, short_prompts = SHAPES[2], BatchShape(16, 8192, 512, 512, 32, 8, 128)
    for shape, tile, persistent in ((long_prompts, 128, True), (short_prompts, 64, False)):
        config = choose_config(shape, H100_SM90)
        expected = ("gluon_ws", tile, persistent) if gluon else ("triton", 128, False)
        assert (config.variant, config.kernel, config.tile_size, config.persistent) == ("qblock", *expected)
    assert choose_config(SHAPES[0], H100_SM90).variant == "parallel_tiled"  # one 13k decode
    serving_step = BatchShape(49, 304, 256, 512, 32, 8, 128)  # 48 decodes and a new prompt
    for shape in (SHAPES[1], serving_step):  # and 64 decodes of 4k
        assert choose_config(shape, H100_SM90).kernel == ("gluon_ws" if gluon else "triton")
    monkeypatch.setenv("ATTNBENCH_GLUON", "0")
    assert choose_config(long_prompts, H100_SM90).kernel == "triton"
    monkeypatch.delenv("ATTNBENCH_GLUON")
    assert choose_config(BatchShape(4, 8192, 2048, 2048, 32, 8, 256), H100_SM90).kernel == "triton"  # head 256
    assert choose_config(BatchShape(1, 512, 512, 512, 256, 1, 64), H100_SM90).kernel == "triton"  # 256 per KV head


def test_the_fitted_tree_is_switched_off_or_swapped_by_name(monkeypatch, tmp_path):
    """ATTNBENCH_TUNED_TREE=off: the H100 runs the hand-written tree, what a GPU without a
    fitted tree runs; a path: the tree in that file; a file that is not a tree: one line."""
    from attnbench.kernels.dispatch.heuristics import TreeError, _auto, choose_config

    one_decode = SHAPES[0]  # the shipped tree sends it to the split-KV step
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    assert choose_config(one_decode, H100_SM90) == _auto(one_decode, H100_SM90)
    tree = tmp_path / "tuned_other.py"
    tree.write_text("def choose(shape, platform):\n    return {'variant': 'qblock', 'tile_size': 32}\n")
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", str(tree))
    assert (choose_config(one_decode, H100_SM90).variant, choose_config(one_decode, H100_SM90).tile_size) == \
        ("qblock", 32)
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", str(tmp_path / "none.py"))
    with pytest.raises(TreeError, match="none.py: no such file; expected a tree written by"):
        choose_config(one_decode, H100_SM90)


def test_the_gluon_kernel_runs_only_the_qblock_step_with_128_rows():
    with pytest.raises(ValueError, match=r"KernelConfig.kernel: expected one of \('triton', 'gluon_ws'\), got 'cuda'"):
        KernelConfig("qblock", kernel="cuda")
    with pytest.raises(ValueError, match="'gluon_ws' runs the qblock step with block_m 128, got variant "
                                         "'parallel_tiled', block_m 128"):
        KernelConfig("parallel_tiled", block_m=128, kernel="gluon_ws")
    with pytest.raises(ValueError, match="block_m 16"):
        KernelConfig("qblock", block_m=16, kernel="gluon_ws")
    with pytest.raises(ValueError, match="KernelConfig.persistent: only the 'gluon_ws' kernel .* got kernel 'triton'"):
        KernelConfig("qblock", block_m=128, persistent=True)
    assert KernelConfig("qblock", block_m=128, kernel="gluon_ws", persistent=True).as_dict()["persistent"] is True


def test_a_gluon_config_off_hopper_is_refused_by_name():
    import torch

    from attnbench.kernels import PagedBatch, paged_attention

    batch = PagedBatch.build([(20, 5)], num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.float16, device="cpu", seed=0)
    config = KernelConfig("qblock", kernel="gluon_ws", tile_size=64, block_m=128)
    with pytest.raises(ValueError, match=r"config: kernel 'gluon_ws' needs an sm_90 \(Hopper\) GPU"):
        paged_attention(**batch.attention_kwargs(), config=config)


def test_auto_splits_the_kv_range_of_short_queries_that_cannot_fill_the_gpu(monkeypatch):
    """The hand-written tree (what a GPU without a fitted tree runs) splits the KV range of a
    speculative batch as of a decode batch when the Q-block step would launch at most one
    program per SM: 8 sequences x 4 queries over 16k keys with 4 KV heads (Qwen2.5-7B) give
    64 programs on 132 SMs; 16 x 8 queries with 8 KV heads, 256."""
    from attnbench.kernels.dispatch.heuristics import choose_config

    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    spec = BatchShape(8, 32, 4, 16384, 28, 4, 128)
    assert choose_config(spec, H100_SM90).variant == "parallel_tiled"
    many = BatchShape(16, 128, 8, 4096, 32, 8, 128)
    assert choose_config(many, H100_SM90).variant == "qblock"
    short_context = BatchShape(8, 32, 4, 512, 28, 4, 128)
    assert choose_config(short_context, H100_SM90).variant == "qblock"
    prompt = BatchShape(8, 256, 32, 16384, 28, 4, 128)  # over 16 queries: not a short query
    assert choose_config(prompt, H100_SM90).variant == "qblock"
