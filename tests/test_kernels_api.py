"""`paged_attention` input checks, the static grid's batch independence, and AOT builds."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from attnbench.kernels import PagedBatch, paged_attention
from attnbench.kernels.bench.aot import captured_launches
from attnbench.kernels.bench.batch import StaticBatchBuffers
from attnbench.kernels.config import KernelConfig
from kernel_checks import DEVICE, fresh_seed, mismatch


@pytest.fixture
def batch() -> PagedBatch:
    return PagedBatch.build([(1, 20), (5, 11), (8, 0)], num_q_heads=8, num_kv_heads=2,
                            head_size=64, block_size=16, dtype=torch.float16, device=DEVICE,
                            seed=fresh_seed())


def _bad(batch, **changes):
    kwargs = batch.attention_kwargs()
    kwargs.update(changes)
    return kwargs


BAD_INPUTS = {
    # name: (function of batch -> kwargs, words the message must contain)
    "q rank": (lambda b: _bad(b, q=b.q[0]), ["q", "3-D"]),
    "q dtype": (lambda b: _bad(b, q=b.q.float()), ["q", "dtype"]),
    "kv dtype mismatch": (lambda b: _bad(b, k_cache=b.k_cache.bfloat16()), ["k_cache", "dtype"]),
    "kv rank": (lambda b: _bad(b, v_cache=b.v_cache[0]), ["v_cache", "4-D"]),
    "heads do not divide": (lambda b: _bad(b, k_cache=b.k_cache[:, :, :1].repeat(1, 1, 3, 1).contiguous(),
                                           v_cache=b.v_cache[:, :, :1].repeat(1, 1, 3, 1).contiguous()),
                            ["k_cache", "divides", "8 query heads"]),
    "head size mismatch": (lambda b: _bad(b, k_cache=b.k_cache[..., :32].contiguous(),
                                          v_cache=b.v_cache[..., :32].contiguous()),
                           ["k_cache", "head size 64"]),
    "unsupported head size": (lambda b: _bad(b, q=b.q[..., :12].contiguous(), k_cache=b.k_cache[..., :12].contiguous(),
                                             v_cache=b.v_cache[..., :12].contiguous()),
                              ["q", "multiple of 8", "12"]),
    "non-contiguous head dim": (lambda b: _bad(b, q=b.q.transpose(1, 2).contiguous().transpose(1, 2)),
                                ["q", "contiguous head dimension"]),
    "block_table dtype": (lambda b: _bad(b, block_table=b.block_table.long()), ["block_table", "int32"]),
    "cu_seqlens length": (lambda b: _bad(b, cu_seqlens_q=b.cu_seqlens_q[:-1]), ["cu_seqlens_q", "num_seqs + 1"]),
    "block_table rows": (lambda b: _bad(b, block_table=b.block_table[:-1]), ["block_table", "rows"]),
    "block_table too short": (lambda b: _bad(b, block_table=b.block_table[:, :1]), ["block_table", "blocks per row", "seq_lens[0]"]),
    "seq_lens shorter than query": (lambda b: _bad(b, seq_lens=torch.minimum(b.seq_lens, torch.full_like(b.seq_lens, 3))),
                                    ["seq_lens", "query length"]),
    "max_seqlen_q too small": (lambda b: _bad(b, max_seqlen_q=2), ["max_seqlen_q", "longest query"]),
    "max_seqlen_k too small": (lambda b: _bad(b, max_seqlen_k=9), ["max_seqlen_k", "longest sequence"]),
    "bad window": (lambda b: _bad(b, sliding_window=0), ["sliding_window"]),
    "negative softcap": (lambda b: _bad(b, softcap=-1.0), ["softcap"]),
    "zero scale": (lambda b: _bad(b, scale=0.0), ["scale", "positive"]),
    "negative scale": (lambda b: _bad(b, scale=-0.1), ["scale", "positive"]),
    "out shape": (lambda b: _bad(b, out=torch.empty_like(b.q[:-1])), ["out", "shape of q"]),
    "sum_seqlen_k over every sequence at the longest": (lambda b: _bad(b, sum_seqlen_k=3 * 21 + 1),
                                                        ["sum_seqlen_k", "num_seqs x max_seqlen_k=63"]),
    "sum_seqlen_k under the longest sequence": (lambda b: _bad(b, sum_seqlen_k=20),
                                                ["sum_seqlen_k", "max_seqlen_k=21"]),
    "sum_seqlen_k not an int": (lambda b: _bad(b, sum_seqlen_k=45.0), ["sum_seqlen_k", "an int"]),
    "sum_seqlen_k under the keys": (lambda b: _bad(b, sum_seqlen_k=44), ["sum_seqlen_k", "sum(seq_lens)=45"]),
}


# what only a host read of the metadata's values can see: checked with check_metadata=True
METADATA_CASES = {"block_table too short", "seq_lens shorter than query", "max_seqlen_q too small",
                  "max_seqlen_k too small", "sum_seqlen_k under the keys"}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_argument(batch, case):
    make_kwargs, words = BAD_INPUTS[case]
    with pytest.raises(ValueError) as info:
        paged_attention(**make_kwargs(batch), check_metadata=case in METADATA_CASES)
    message = str(info.value)
    for word in words:
        assert word in message, f"{case}: {word!r} not in {message!r}"


def test_checked_layouts_are_remembered_and_bad_ones_still_fail(batch, monkeypatch):
    """A call whose tensors have the metadata of an earlier valid call skips the checks
    (they cost microseconds of host time per launch); every bad input still fails after a
    good call, because what the checks read is the memo's key."""
    from attnbench.kernels.dispatch import api

    paged_attention(**batch.attention_kwargs())
    for case, (make_kwargs, words) in sorted(BAD_INPUTS.items()):
        if case in METADATA_CASES:
            continue
        with pytest.raises(ValueError) as info:
            paged_attention(**make_kwargs(batch))
        assert words[0] in str(info.value), case

    def checked(*args, **kwargs):
        raise AssertionError("validate_inputs ran")

    monkeypatch.setattr(api, "validate_inputs", checked)
    paged_attention(**batch.attention_kwargs())  # remembered: no check
    with pytest.raises(ValueError, match="max_seqlen_q/max_seqlen_k"):  # lengths: every call
        paged_attention(**{**batch.attention_kwargs(), "max_seqlen_q": 0})
    with pytest.raises(AssertionError, match="validate_inputs ran"):  # values: always checked
        paged_attention(**batch.attention_kwargs(), check_metadata=True)
    with pytest.raises(AssertionError, match="validate_inputs ran"):  # a new scalar: a new layout
        paged_attention(**{**batch.attention_kwargs(), "softcap": 5.0})
    with pytest.raises(ValueError, match="max_seqlen_q/max_seqlen_k"):  # with a config given too
        paged_attention(**{**batch.attention_kwargs(), "max_seqlen_q": 0}, config=KernelConfig("qblock"))

    def chosen(*args, **kwargs):
        raise AssertionError("a config was chosen")

    # the config chosen for a layout and max lengths is remembered with the layout
    monkeypatch.setattr(api, "_config_for", chosen)
    paged_attention(**batch.attention_kwargs())
    with pytest.raises(AssertionError, match="a config was chosen"):  # new max lengths: a new choice
        paged_attention(**{**batch.attention_kwargs(), "max_seqlen_k": batch.max_seqlen_k + 1})


def test_the_default_call_reads_no_tensor_value_on_the_host(batch, monkeypatch):
    """No sync and nothing a CUDA-graph capture refuses: the default call of every variant
    gets to its launch without reading a tensor's value (the Gluon kernel, where it cannot
    run, to its refusal); the metadata check is opt-in."""
    from attnbench.kernels.variants import AUTO, STEPS, step

    kwargs = batch.attention_kwargs()

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    gluon_runs = step("qblock_ws").refuses(batch.q, batch.k_cache, batch.v_cache) is None  # on Hopper
    for variant in (AUTO, *STEPS, *(["qblock_ws"] if gluon_runs else [])):
        with captured_launches() as launches:
            paged_attention(**kwargs, variant=variant)
        assert launches, variant
    if not gluon_runs:
        with pytest.raises(ValueError, match="'qblock_ws' cannot run this call: needs an sm_90"):
            paged_attention(**kwargs, variant="qblock_ws")
    with pytest.raises(AssertionError, match="read on the host"):
        paged_attention(**kwargs, check_metadata=True)


def test_bad_variant_and_config(batch):
    with pytest.raises(ValueError, match="variant"):
        paged_attention(**batch.attention_kwargs(), variant="flash")
    with pytest.raises(ValueError, match="config"):
        paged_attention(**batch.attention_kwargs(), variant="naive", config=KernelConfig("qblock"))
    with pytest.raises(ValueError, match="tile_size.*power of two"):
        KernelConfig("qblock", tile_size=48)


# ----------------------------------------------------------------- static launch grid
def _random_batch(rng: random.Random, num_seqs: int, decode: bool, like_seed: int) -> PagedBatch:
    seqs = [(1 if decode else rng.randint(1, 12), rng.randint(0, 90)) for _ in range(num_seqs)]
    return PagedBatch.build(seqs, num_q_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                            dtype=torch.bfloat16, device=DEVICE, seed=like_seed)


def test_static_grid_size_does_not_depend_on_the_batch():
    rng = random.Random(fresh_seed())
    grids = {}
    for num_seqs, decode in [(1, True), (3, False), (9, True), (17, False)]:
        batch = _random_batch(rng, num_seqs, decode, fresh_seed())
        with captured_launches() as launches:
            paged_attention(**batch.attention_kwargs(), variant="static_grid")
        for launch in launches:
            grids.setdefault(launch.name, set()).add(launch.grid)
    assert "static_grid_attention_kernel" in grids and "static_grid_reduce_kernel" in grids
    assert all(len(g) == 1 for g in grids.values()), grids
    # for contrast: the 2D grid grows with the batch
    with captured_launches() as small:
        paged_attention(**_random_batch(rng, 1, True, 1).attention_kwargs(), variant="qblock")
    with captured_launches() as large:
        paged_attention(**_random_batch(rng, 17, True, 2).attention_kwargs(), variant="qblock")
    assert small[0].grid != large[0].grid


def test_static_grid_replays_one_launch_for_any_batch_up_to_capacity():
    """The CPU analogue of a CUDA-graph replay: record the launches once on capacity-sized
    buffers, then load smaller batches into the same buffers and re-issue the very same
    launches (same grid, same scalar arguments, same pointers)."""
    rng = random.Random(fresh_seed())
    template = _random_batch(rng, 1, True, 0)
    config = KernelConfig("static_grid", tile_size=16, num_segments=4)
    buffers = StaticBatchBuffers(max_seqs=8, max_tokens=8, max_blocks_per_seq=8, num_blocks=72, like=template)
    kwargs = buffers.attention_kwargs(max_seqlen_q=1, max_seqlen_k=128)
    buffers.load(_random_batch(rng, 8, True, fresh_seed()))
    with captured_launches() as launches:
        paged_attention(**kwargs, config=config)
    for num_seqs in (8, 5, 1, 3):
        batch = _random_batch(rng, num_seqs, True, fresh_seed())
        buffers.load(batch)
        buffers.out.fill_(float("nan"))
        for launch in launches:
            launch.kernel[launch.grid](**launch.args, **launch.constexprs, **launch.options)
        problem = mismatch(buffers.out, batch.reference(), batch.dtype, rows=batch.num_tokens)
        assert problem is None, f"replay with {num_seqs} sequences: {problem}"


# ------------------------------------------------------------------ ahead-of-time builds
@pytest.fixture(scope="module")
def aot_builds():
    """Build every kernel for an H100 and an MI300X (a subprocess: real JIT, no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnbench.kernels.bench.aot", "sm_90", "gfx942"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_kernels_compile_for_hopper_and_mi300(aot_builds):
    """Every kernel builds on this CPU-only machine for both vendors, and the tiled variants
    put QK^T and PV on the matrix units (mma/wgmma on sm_90, MFMA on gfx942)."""
    built = {(b["variant"], b["kernel"], b["target"]) for b in aot_builds}
    for variant, kernels in {
        "naive": ["naive_attention_kernel"],
        "qblock": ["qblock_attention_kernel"],
        "parallel_tiled": ["segmented_attention_kernel", "reduce_segments_kernel"],
        "static_grid": ["static_grid_attention_kernel", "static_grid_reduce_kernel"],
    }.items():
        for kernel in kernels:
            for target in ("sm_90", "gfx942"):
                assert (variant, kernel, target) in built
    for b in aot_builds:
        attends = b["kernel"].endswith(("attention_kernel", "wgmma_kernel", "ws_kernel")) and b["variant"] != "naive"
        assert bool(b["matrix_instructions"]) == attends, b


def test_hopper_kernels_overlap_softmax_with_pv(aot_builds):
    """The Gluon Q-block kernels (``qblock_ws`` also as a persistent launch that claims its
    items, and split in segments) build for sm_90 within an H100's shared memory, on wgmma,
    and wait for QK^T with P V's products still in flight (``wgmma.wait_group 1``, or 2
    where a head of two column pieces takes one product per piece: the overlap they exist
    for), which ptxas keeps (no C7512: wgmma serialized for lack of registers); Triton's own
    pipelining of the Q-block step waits for all (0)."""
    by_variant = {b["variant"]: b for b in aot_builds if b["target"] == "sm_90" and "reduce" not in b["kernel"]}
    for variant in ("qblock_wgmma", "qblock_ws", "qblock_ws_pp", "qblock_ws_dynamic", "qblock_ws_t64_lazy",
                    "qblock_wgmma_h256", "qblock_ws_h256", "qblock_ws_h96", "qblock_ws_h192", "qblock_ws_split",
                    "qblock_ws_h256_split"):
        build = by_variant[variant]
        assert build["matrix_instructions"] == ["wgmma"] and build["shared_bytes"] <= 227 * 1024, build
        in_flight = 2 if variant in ("qblock_ws_h96", "qblock_ws_h192") else 1
        assert build["wgmma_waits"] == [0, in_flight], build
        assert "Compiling entry function" in build["ptxas"] and "C7512" not in build["ptxas"], build["ptxas"]
    assert by_variant["qblock"]["wgmma_waits"] == [0]


def test_a_split_gluon_launch_is_four_items_per_q_block_and_the_split_kv_reduction(aot_builds):
    """Split in 4 segments, `qblock_ws` launches four programs per (Q-block, KV head) item of
    the same batch, then the split-KV step's reduction merges their partial rows: one
    program per (token, query head) of the Llama-3 mixed batch (27 tokens, 32 heads)."""
    builds = {(b["variant"], b["kernel"]): b for b in aot_builds if b["target"] == "sm_90"}
    unsplit = builds["qblock_ws", "qblock_ws_kernel"]["grid"][0]
    assert builds["qblock_ws_split", "qblock_ws_kernel"]["grid"] == [4 * unsplit]
    assert builds["qblock_ws_split", "reduce_segments_kernel"]["grid"] == [27, 32]
    assert builds["qblock_ws_h256_split", "reduce_segments_kernel"]["grid"] == [27, 16]


def test_a_persistent_launch_claims_items_with_relaxed_atomics(aot_builds):
    """The claiming binary of `qblock_ws` takes items with relaxed atomic increments (the
    first claim and the loop's): a work counter publishes no data, and Triton's default
    order (acq_rel) fences the GPU and invalidates L1 at every claim. One program per item
    claims nothing."""
    by_variant = {b["variant"]: b for b in aot_builds if b["target"] == "sm_90"}
    assert by_variant["qblock_ws_dynamic"]["atomic_orders"] == ["relaxed", "relaxed"]
    assert by_variant["qblock_ws"]["atomic_orders"] == []


def test_hopper_kernels_divide_per_row_and_mask_128_key_tiles_with_selects(aot_builds):
    """The Gluon kernels normalize their output by each row's reciprocal (a handful of fp32
    divisions per kernel, not one per output element: 64-128 before), and a masked 128-key
    tile of a causal batch puts -inf in each hidden score with one select (64 per thread
    per masked-tile copy: the peeled first tile and the loop's, per consumer), not through
    the bitmasks LLVM packs a boolean tile of that width into."""
    by_variant = {b["variant"]: b for b in aot_builds if b["target"] == "sm_90"}
    for variant in ("qblock_wgmma", "qblock_ws", "qblock_ws_pp", "qblock_ws_dynamic", "qblock_ws_t64_lazy",
                    "qblock_wgmma_h256", "qblock_ws_h256", "qblock_ws_h96", "qblock_ws_h192"):
        assert 0 < by_variant[variant]["fp32_divisions"] <= 8, by_variant[variant]
    consumers = {"qblock_wgmma": 1, "qblock_ws": 2, "qblock_ws_pp": 2, "qblock_ws_dynamic": 2, "qblock_ws_h96": 2}
    for variant, copies in consumers.items():  # the 128-key builds (`aot.hopper_launches`)
        assert by_variant[variant]["masked_selects"] == 2 * 64 * copies, by_variant[variant]


def test_head_256_takes_64_key_tiles_on_hopper():
    """Head 256's 128-key K and V rings would not fit shared memory beside the Q-block (the
    64-key build takes 224 KiB: test_hopper_kernels_overlap_softmax_with_pv): asked for
    128-key tiles, the Gluon kernels refuse in one line before anything is built."""
    from attnbench.kernels.hopper import qblock_ws

    batch = PagedBatch.build([(3, 20)], num_q_heads=4, num_kv_heads=2, head_size=256, block_size=16,
                             dtype=torch.bfloat16, device="cpu", seed=0)
    with pytest.raises(ValueError, match=r"^tile_size: at most 64 with head size 256 \(shared memory\), got 128$"):
        qblock_ws.launch(torch.empty_like(batch.q), batch.q, batch.k_cache, batch.v_cache, batch.block_table,
                         batch.cu_seqlens_q, batch.seq_lens, scale=0.0625, sliding_window=None, softcap=0.0,
                         tile_size=128, compile_only=True)


def test_hopper_kernels_refuse_k_and_v_caches_with_different_strides():
    """The Gluon kernels address K and V with one set of offsets: a V cache laid out
    differently is refused by name before anything is built or launched."""
    from attnbench.kernels.hopper import qblock_ws

    batch = PagedBatch.build([(3, 20)], num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device="cpu", seed=0)
    v_cache = batch.v_cache.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    with pytest.raises(ValueError, match=r"v_cache: expected the strides of k_cache"):
        qblock_ws.launch(torch.empty_like(batch.q), batch.q, batch.k_cache, v_cache, batch.block_table,
                         batch.cu_seqlens_q, batch.seq_lens, scale=0.125, sliding_window=None, softcap=0.0,
                         compile_only=True)


def _captured_decode_graph(variant: str, max_seqs: int, num_blocks: int):
    """A CUDA graph of the default `paged_attention` call on static decode buffers for up to
    ``max_seqs`` sequences; returns a function that replays it on a fresh random batch of
    ``n`` sequences and returns the mismatch against the reference (None when it matches)."""
    rng = random.Random(fresh_seed())
    buffers = StaticBatchBuffers(max_seqs=max_seqs, max_tokens=max_seqs, max_blocks_per_seq=8,
                                 num_blocks=num_blocks, like=_random_batch(rng, 1, True, 0))
    kwargs = buffers.attention_kwargs(max_seqlen_q=1, max_seqlen_k=128)
    buffers.load(_random_batch(rng, max_seqs, True, fresh_seed()))
    paged_attention(**kwargs, variant=variant)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(**kwargs, variant=variant)

    def replay(n: int):
        batch = _random_batch(rng, n, True, fresh_seed())
        buffers.load(batch)
        buffers.out.fill_(float("nan"))
        graph.replay()
        return mismatch(buffers.out, batch.reference(), batch.dtype, rows=batch.num_tokens)

    return replay


@pytest.mark.gpu
def test_static_grid_cuda_graph_replays_any_batch_up_to_capacity():
    """One captured CUDA graph, replayed for decode batches of 32 down to 1 sequences."""
    replay = _captured_decode_graph("static_grid", max_seqs=32, num_blocks=300)
    for num_seqs in (32, 17, 4, 1):
        problem = replay(num_seqs)
        assert problem is None, f"replay with {num_seqs} sequences: {problem}"


def test_host_overhead_benchmark_runs_both_paths():
    """The plumbing of `attnbench kernels overhead` (numbers only mean something on a GPU)."""
    from attnbench.kernels.bench.overhead import measure

    o = measure("mixed-b4", "static_grid", device=DEVICE, calls=1, rounds=1)
    assert o.api_us > 0 and o.bare_us > 0 and o.as_dict()["added_us"] == o.api_us - o.bare_us


def test_host_overhead_profile_names_the_api_and_the_launcher():
    """`attnbench kernels overhead --profile`: the ranking includes our entry point and the
    step's launcher, so it can tell their host time apart from Triton's."""
    from attnbench.kernels.bench.overhead import profile

    text = profile("decode-b1-ctx1k", "qblock", device=DEVICE, calls=1, top=100_000)  # all of it
    assert "paged_attention" in text and "launch" in text, text


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "naive", "qblock", "parallel_tiled", "static_grid"])
def test_the_default_call_is_captured_in_a_cuda_graph_and_replayed(variant):
    """The default call, no extra argument, inside torch.cuda.graph: captured and replayed
    on new values of the same buffers, it matches the reference."""
    problem = _captured_decode_graph(variant, max_seqs=16, num_blocks=200)(16)
    assert problem is None, problem
