"""No compilation while serving: `precompile` builds every binary a variant can launch.

The vLLM layer compiles, at its first forward, every kernel configuration the heuristics
can pick within the server's limits (its test: test_vllm_backend.py). Here: the configs
found cover random batches, a per-batch integer that Triton would specialize on is caught
(``num_seqs`` divisible by 16), and on a GPU nothing compiles after `precompile`.
"""

from __future__ import annotations

import random

import pytest
import torch
from attnbench.kernels.bench.aot import captured_launches
from attnbench.kernels.dispatch.api import _same_binary
from attnbench.kernels.bench.batch import PagedBatch
from attnbench.kernels.config import BatchShape, Platform
from attnbench.kernels.dispatch.heuristics import choose_config, reachable_configs
from kernel_checks import DEVICE, fresh_seed

H100 = Platform("cuda", 132, "NVIDIA H100 80GB HBM3")
MI300X = Platform("hip", 304, "AMD Instinct MI300X")
H100_SM90 = Platform("cuda", 132, "NVIDIA H100 80GB HBM3", "sm_90")  # with the Gluon kernel
LIMITS = (64, 512, 2048)  # max_num_seqs, max_num_batched_tokens, max_model_len


def _random_shape(rng: random.Random, heads: tuple[int, int, int], window: int) -> BatchShape:
    max_seqs, max_tokens, max_len = LIMITS
    n = rng.choice([1, 2, 3, rng.randint(1, max_seqs)])
    if rng.random() < 0.5:  # decode-only
        q_lens = [1] * n
    else:
        q_lens = [rng.choice([1, rng.randint(1, 40), rng.randint(1, max_tokens // n)]) for _ in range(n)]
    kv = [rng.randint(q, max_len) for q in q_lens]
    if rng.random() < 0.5:  # a few long sequences among short ones: a ragged batch
        kv = [rng.randint(q, max_len) if rng.random() < 0.2 else q + rng.randint(0, 40) for q in q_lens]
    if rng.random() < 0.25:  # every sequence alike (rules key on equal lengths: `host.even_static_shares`)
        q_lens, kv = [q_lens[0]] * n, [kv[0]] * n
        if sum(q_lens) > max_tokens:
            q_lens, kv = [1] * n, [kv[0]] * n
    sum_k = rng.choice([None, sum(kv)])  # unknown (a captured graph) or summed by the caller
    return BatchShape(n, sum(q_lens), max(q_lens), max(kv), *heads, sum_k).in_window(window)


@pytest.mark.parametrize("platform", [H100, H100_SM90, MI300X], ids=["h100", "h100-sm90", "mi300x"])
@pytest.mark.parametrize("variant", ["auto", "naive", "qblock", "parallel_tiled", "static_grid"])
def test_reachable_configs_cover_random_batches(variant, platform):
    """Random batches of a layer without a window, and of layers of random windows (a
    server's layer has one; `paged_attention` hands the trees its batches within it)."""
    heads = (32, 8, 128)
    rng = random.Random(fresh_seed())
    for window in (0, rng.randint(1, 600), rng.randint(1, LIMITS[2])):
        reachable = {_same_binary(c) for c in reachable_configs(variant, platform, *heads, *LIMITS, window)}
        for _ in range(1500):
            shape = _random_shape(rng, heads, window)
            config = _same_binary(choose_config(shape, platform, variant))
            assert config in reachable, f"{shape} -> {config} is not among the {len(reachable)} precompiled"


def _qblock_keys_for_16_and_17_sequences() -> list[tuple]:
    from attnbench.kernels.steps import qblock

    keys = []
    for n in (16, 17):
        b = PagedBatch.build([(1, 20)] * n, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device=DEVICE, seed=n)
        with captured_launches() as recorded:
            qblock.launch(b.q.clone(), b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens_q, b.seq_lens,
                          scale=0.125, sliding_window=None, softcap=0.0,
                          config=choose_config(b.shape, H100, "qblock"))
        keys.append(recorded[0].binary_key())
    return keys


def test_a_specialized_batch_integer_would_be_caught(monkeypatch):
    """The check above can fail: without ``do_not_specialize``, 16 and 17 sequences need
    different binaries (divisibility of ``num_seqs`` by 16)."""
    from attnbench.kernels.steps import qblock

    kernel = qblock.qblock_attention_kernel
    first, second = _qblock_keys_for_16_and_17_sequences()
    assert first == second
    if hasattr(kernel, "kwargs"):  # the interpreter keeps the decorator's keywords
        monkeypatch.setitem(kernel.kwargs, "do_not_specialize", [])
    else:
        monkeypatch.setattr(kernel, "do_not_specialize", [])
    first, second = _qblock_keys_for_16_and_17_sequences()
    assert first != second


def test_a_persistent_gluon_launch_compiles_both_of_its_walks():
    """Whether a persistent launch of `qblock_ws` deals its items in static shares or claims
    them (``DYNAMIC``) depends on the batch (`hopper.host.claims_items`), so compiling only
    it builds both binaries and a server's first large prefill compiles nothing; one
    program per item, or a walk named, builds one. The claims' counter is not specialized
    on: a launch that claims keys the binary that compiling only built."""
    from attnbench.kernels.hopper import qblock_ws

    b = PagedBatch.build([(40, 0), (1, 30)], num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                         dtype=torch.bfloat16, device=DEVICE, seed=0)

    def launches(**options):
        with captured_launches() as recorded:
            qblock_ws.launch(b.q.clone(), b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens_q, b.seq_lens,
                             scale=0.125, sliding_window=None, softcap=0.0, tile_size=64, **options)
        return recorded

    compiled = launches(persistent=True, compile_only=True)
    assert [launch.constexprs["DYNAMIC"] for launch in compiled] == [False, True]
    for options in ({"persistent": False}, {"persistent": True, "dynamic": False}):
        assert [launch.constexprs["DYNAMIC"] for launch in launches(compile_only=True, **options)] == [False]
    claiming = launches(persistent=True, dynamic=True)
    assert claiming[0].binary_key() == compiled[1].binary_key()


def test_a_persistent_gluon_launch_deals_even_prompts_in_static_shares(monkeypatch):
    """A launch of prompts of one length with no context whose static shares are even
    (`hopper.host.deals_static_shares`) deals them; uneven shares, or a longest sequence
    past the longest query (a context the host cannot see), claim items. The device is
    given 4 SMs (the CPU's count; a GPU's 132 would leave these 32 items one per program):
    four prompts of 64 tokens at 8 query heads per KV head (Q-blocks of 16 tokens, two KV
    heads) give 32 listed items, 8 per program of equal work; three of 80 tokens give 30,
    and the busiest program has 9% more work than the mean."""
    import dataclasses

    from attnbench.kernels.hopper import host, qblock_ws

    platform = dataclasses.replace(Platform.detect(torch.device(DEVICE)), num_sms=4)
    monkeypatch.setattr(host.Platform, "detect", classmethod(lambda cls, device: platform))

    def claims(query_len, max_seqlen_k, num_seqs=4):
        b = PagedBatch.build([(query_len, 0)] * num_seqs, num_q_heads=16, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device=DEVICE, seed=query_len)
        with captured_launches() as recorded:
            qblock_ws.launch(b.q.clone(), b.q, b.k_cache, b.v_cache, b.block_table, b.cu_seqlens_q, b.seq_lens,
                             scale=0.125, sliding_window=None, softcap=0.0, tile_size=64, persistent=True,
                             max_seqlen_q=query_len, max_seqlen_k=max_seqlen_k)
        return [launch.constexprs["DYNAMIC"] for launch in recorded]

    assert host.static_deal_spread(4, 64, 8, 2, 64, 4) == 1.0 and host.static_deal_spread(3, 80, 8, 2, 64, 4) > 1.05
    assert claims(64, 64) == [False]
    assert claims(80, 80, num_seqs=3) == [True]
    assert claims(64, 80) == [True]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "naive", "qblock", "parallel_tiled", "static_grid"])
def test_no_compilation_after_precompile_on_the_gpu(variant):
    """On a GPU, with Triton's own compile hook: after `precompile` for a server's limits and
    layout, random batches of that server compile nothing."""
    from attnbench.kernels.steps import naive, parallel_tiled, qblock, static_grid
    from attnbench.kernels.dispatch.api import paged_attention, precompile
    from attnbench.kernels.hopper import host as hopper
    from triton import knobs

    modules = [naive, parallel_tiled, qblock, static_grid]
    if hopper.available():  # auto runs the Gluon kernel on an H100
        from attnbench.kernels.hopper import qblock_ws
        modules.append(qblock_ws)
    for module in modules:  # forget earlier tests' binaries
        for kernel in vars(module).values():
            if hasattr(kernel, "device_caches"):
                kernel.device_caches.clear()
    max_len = 4096
    rng = random.Random(fresh_seed())
    compiled: list[str] = []
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(getattr(kw.get("fn"), "name", "?"))
    try:
        for i in range(8):
            n = rng.choice([1, 3, 16, 17, 64])
            seqs = [(1 if rng.random() < 0.6 else rng.randint(2, 300), rng.randint(0, max_len - 400))
                    for _ in range(n)]
            if i == 7:  # a prefill of many work items: the Gluon kernel's persistent launch claims them
                n, seqs = 32, [(256, rng.randint(0, 256)) for _ in range(32)]
            batch = PagedBatch.build(seqs, num_q_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                     dtype=torch.bfloat16, device="cuda", seed=i)
            table = torch.zeros(n, max_len // 16, dtype=torch.int32, device="cuda")  # one fixed width
            table[:, :batch.block_table.shape[1]] = batch.block_table
            kwargs = dict(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache, block_table=table,
                          cu_seqlens_q=batch.cu_seqlens_q, seq_lens=batch.seq_lens)
            out = torch.empty_like(batch.q)
            if i == 0:
                precompile(**kwargs, out=out, variant=variant, max_num_seqs=64, max_num_batched_tokens=8192,
                           max_model_len=max_len)
                compiled.clear()
            paged_attention(**kwargs, out=out, max_seqlen_q=batch.max_seqlen_q, max_seqlen_k=batch.max_seqlen_k,
                            variant=variant)
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_post_compile_hook = previous
    assert compiled == [], f"compiled after precompile: {compiled}"
