"""Every kernel variant against the fp32 reference, on fresh random inputs.

Runs on the GPU under ``make test-gpu`` and in Triton's interpreter under ``make test``.
Batches mix plain decodes, speculative decodes (2..8 query tokens), chunked prefills with
cached context and full prefills; sequence lengths are drawn so that last pages are
partial, and every cache slot past a sequence holds NaN (a kernel must mask it, not read
it). The seed of each check is in its failure message.
"""

from __future__ import annotations

import random

import pytest
import torch

from attnbench.kernels import PagedBatch, paged_attention
from attnbench.kernels.config import KernelConfig
from kernel_checks import DEVICE, build_head_case, fresh_seed, mismatch, poison_past_sequences, poisoned_like

# (q heads, kv heads, head size, KV block size, dtype, extras)
HEAD_CASES = {
    "gqa4-h64-bf16-bs16": (8, 2, 64, 16, torch.bfloat16, {}),
    "mha-h128-fp16-bs32": (4, 4, 128, 32, torch.float16, {}),
    "gqa8-h96-bf16-bs48": (16, 2, 96, 48, torch.bfloat16, {}),
    "mqa-h64-fp16-bs16": (8, 1, 64, 16, torch.float16, {}),
    "window-gqa4-bf16-bs16": (8, 2, 64, 16, torch.bfloat16, {"sliding_window": "random"}),
    "softcap-gqa2-fp16-bs32": (4, 2, 64, 32, torch.float16, {"softcap": 2.0}),
    "window-softcap-mqa-h96-fp16-bs48": (4, 1, 96, 48, torch.float16,
                                         {"sliding_window": "random", "softcap": 1.5}),
    # heads that are not powers of two, padded inside the kernels: the smallest the API takes,
    # 40 (to 64) and 192 (to 256, the wide-head config); vLLM's FLASH_ATTN serves such heads too
    "mha-h16-bf16-bs16": (2, 2, 16, 16, torch.bfloat16, {}),
    "gqa4-h40-fp16-bs16": (8, 2, 40, 16, torch.float16, {}),
    "gqa2-h192-bf16-bs32": (4, 2, 192, 32, torch.bfloat16, {"softcap": 30.0}),
    # Gemma-2's heads: 256 wide (the wide-head prefill config), softcap and window, 64-token pages
    "gemma-gqa2-h256-bf16-bs64": (4, 2, 256, 64, torch.bfloat16, {"sliding_window": "random", "softcap": 50.0}),
    # large pages (vLLM's block_size 128 and 256; hybrid models take large ones): a page
    # holds many tiles, and most of these sequences whole
    "gqa4-h128-bf16-bs128": (8, 2, 128, 128, torch.bfloat16, {}),
    "window-softcap-mqa-h64-fp16-bs256": (4, 1, 64, 256, torch.float16, {"sliding_window": "random", "softcap": 3.0}),
}


def mixed_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Decode, spec-decode, chunked prefill with context, and full prefill, shuffled."""
    seqs = [
        (1, rng.randint(40, 100)),                 # decode, several tiles of context
        (1, rng.randint(1, 20)),                   # decode, short
        (rng.randint(2, 8), rng.randint(10, 50)),  # speculative decode
        (rng.randint(9, 14), rng.randint(17, 50)), # chunked prefill after context
        (rng.randint(6, 16), 0),                   # full prefill
    ]
    rng.shuffle(seqs)
    return seqs


def decode_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Decode-only batch (1-2 query tokens), the case parallel tiles and segments target."""
    return [(rng.choice([1, 1, 2]), rng.randint(1, 140)) for _ in range(rng.randint(3, 5))]


COMPOSITIONS = {"mixed": mixed_seqs, "decode": decode_seqs}


def build_case(head_case: str, composition: str, seed: int) -> PagedBatch:
    return build_head_case(HEAD_CASES[head_case], COMPOSITIONS[composition], seed, window_range=(5, 40))


def run_and_check(batch: PagedBatch, seed: int, **kernel_args) -> None:
    out = paged_attention(**batch.attention_kwargs(), out=poisoned_like(batch.q), **kernel_args)
    problem = mismatch(out, batch.reference(), batch.dtype)
    assert problem is None, (
        f"seed={seed} seqs={[(s.query_len, s.context_len) for s in batch.seqs]} "
        f"window={batch.sliding_window} softcap={batch.softcap}: {problem}")


VARIANTS = ["naive", "qblock", "parallel_tiled", "static_grid"]


@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
@pytest.mark.parametrize("head_case", sorted(HEAD_CASES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_reference(variant, head_case, composition):
    seed = fresh_seed()
    run_and_check(build_case(head_case, composition, seed), seed, variant=variant)


@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
@pytest.mark.parametrize("head_case", ["gqa4-h64-bf16-bs16", "window-softcap-mqa-h96-fp16-bs48"])
def test_auto_matches_reference(head_case, composition):
    seed = fresh_seed()
    run_and_check(build_case(head_case, composition, seed), seed, variant="auto")


# Launch parameters the heuristics may never pick on this machine: tiles smaller than,
# equal to and larger than the page; large Q-blocks; segment counts that are not powers
# of two or exceed the tiles of short sequences; segments as long as the longest
# sequence's, which leave a short one's last segments empty; a static grid that must loop.
EXTRA_CONFIGS = [
    KernelConfig("qblock", tile_size=16, block_m=32),
    KernelConfig("qblock", tile_size=64, block_m=64, num_warps=8),
    KernelConfig("parallel_tiled", tile_size=16, num_segments=3),
    KernelConfig("parallel_tiled", tile_size=32, num_segments=16),
    KernelConfig("parallel_tiled", tile_size=16, num_segments=4, equal_segments=True),
    KernelConfig("parallel_tiled", tile_size=16, block_m=64, num_segments=3, equal_segments=True),
    KernelConfig("static_grid", tile_size=16, num_segments=5),
    KernelConfig("static_grid", tile_size=64, block_m=32, num_segments=2, programs_per_sm=0.5),
]


@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
@pytest.mark.parametrize("head_case", ["gqa8-h96-bf16-bs48", "window-softcap-mqa-h96-fp16-bs48", "mha-h128-fp16-bs32"])
@pytest.mark.parametrize("config", EXTRA_CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.as_dict().values()))
def test_config_matches_reference(config, head_case, composition):
    seed = fresh_seed()
    run_and_check(build_case(head_case, composition, seed), seed, config=config)


@pytest.mark.parametrize("config", [KernelConfig("qblock", tile_size=16, block_m=32),
                                    KernelConfig("parallel_tiled", tile_size=16, num_segments=3),
                                    KernelConfig("static_grid", tile_size=16, num_segments=2)],
                         ids=lambda c: c.variant)
def test_a_window_of_many_tiles_masks_only_its_edges(config):
    """A window several tiles wide: each Q-block's tiles split into those the window cuts,
    a mask-free middle and those on the diagonal (`steps.blocks.tile_ranges`), each segment
    of a split taking its share of all three. Windows of 50-120 keys over 16-key tiles, with
    decodes, speculative decodes and chunks long enough for the middle to exist."""
    seed = fresh_seed()
    rng = random.Random(seed)
    seqs = [(1, rng.randint(150, 400)), (rng.randint(2, 6), rng.randint(100, 300)),
            (rng.randint(60, 150), rng.randint(0, 200))]
    batch = PagedBatch.build(seqs, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device=DEVICE, sliding_window=rng.randint(50, 120), seed=seed)
    poison_past_sequences(batch)
    run_and_check(batch, seed, config=config)


@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("config", [KernelConfig("parallel_tiled", tile_size=16, num_segments=4, equal_segments=True),
                                    KernelConfig("parallel_tiled", tile_size=32, block_m=64, num_segments=5,
                                                 equal_segments=True)],
                         ids=["t16-s4", "t32-bm64-s5"])
def test_equal_segments_follow_each_sequence_of_a_ragged_batch(config, window):
    """A ragged batch (one sequence of 250-450 keys among short decodes and speculative
    decodes) with segments as long as the longest sequence's: the short sequences fill one
    or two segments, their other programs store only the empty sentinel, and the reduction
    must skip those (their output scratch is never written). With a window, the longest
    range is the window's."""
    seed = fresh_seed()
    rng = random.Random(seed)
    seqs = [(1, rng.randint(250, 450)), (rng.randint(2, 8), rng.randint(30, 90))]
    seqs += [(rng.choice([1, 1, 4]), rng.randint(0, 40)) for _ in range(rng.randint(3, 5))]
    rng.shuffle(seqs)
    batch = PagedBatch.build(seqs, num_q_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                             dtype=torch.bfloat16, device=DEVICE, softcap=rng.choice([0.0, 5.0]),
                             sliding_window=rng.randint(40, 200) if window else None, seed=seed)
    poison_past_sequences(batch)
    run_and_check(batch, seed, config=config)


def test_explicit_scale_is_used():
    seed = fresh_seed()
    batch = build_case("gqa4-h64-bf16-bs16", "mixed", seed)
    out = paged_attention(**batch.attention_kwargs(), scale=0.3, variant="qblock")
    from attnbench.kernels.bench.reference import paged_attention_reference

    ref = paged_attention_reference(batch.q, batch.k_cache, batch.v_cache, batch.block_table,
                                    batch.cu_seqlens_q, batch.seq_lens, scale=0.3)
    assert mismatch(out, ref, batch.dtype) is None


# --------------------------------------------------------------------------- tolerances
# The checks above must be able to fail: each test below feeds a kernel a slightly wrong
# input (the kind of bug a mask or tile off by one would cause) and expects a mismatch.

def _mismatch_after(corrupt, variant="qblock") -> str | None:
    seed = fresh_seed()
    batch = build_case("gqa4-h64-bf16-bs16", "mixed", seed)
    ref = batch.reference()
    kwargs = batch.attention_kwargs()
    corrupt(batch, kwargs)
    out = paged_attention(**kwargs, variant=variant)
    return mismatch(out, ref, batch.dtype)


@pytest.mark.parametrize("variant", ["qblock", "static_grid"])
def test_tolerance_catches_a_causal_off_by_one(variant):
    """Every query row placed one position later, so it sees one key too many."""
    def corrupt(batch, kw):
        spare = torch.zeros(batch.num_seqs, 1, dtype=torch.int32, device=batch.block_table.device)
        kw["block_table"] = torch.cat([batch.block_table, spare], dim=1)  # room for the extra key
        kw["seq_lens"] = batch.seq_lens + 1
        kw["max_seqlen_k"] = batch.max_seqlen_k + 1
    assert _mismatch_after(corrupt, variant) is not None


def test_tolerance_catches_a_wrong_page():
    """One page of one sequence read from the wrong place (a dropped / repeated tile)."""
    def corrupt(batch, kw):
        table = batch.block_table.clone()
        longest = max(range(batch.num_seqs), key=lambda s: batch.seqs[s].seq_len)
        table[longest, 0] = (table[longest, 0] + 1) % batch.k_cache.shape[0]
        kw["block_table"] = table
    assert _mismatch_after(corrupt) is not None


def test_tolerance_catches_a_window_off_by_one():
    seed = fresh_seed()
    batch = build_case("window-gqa4-bf16-bs16", "mixed", seed)
    ref = batch.reference()
    kwargs = batch.attention_kwargs()
    kwargs["sliding_window"] = batch.sliding_window + 1
    out = paged_attention(**kwargs, variant="qblock")
    assert mismatch(out, ref, batch.dtype) is not None, f"seed={seed}"


def test_tolerance_catches_a_missing_softcap():
    seed = fresh_seed()
    batch = build_case("softcap-gqa2-fp16-bs32", "mixed", seed)
    ref = batch.reference()
    kwargs = batch.attention_kwargs()
    kwargs["softcap"] = 0.0
    out = paged_attention(**kwargs, variant="qblock")
    assert mismatch(out, ref, batch.dtype) is not None, f"seed={seed}"


def test_poisoned_output_catches_an_unwritten_row():
    seed = fresh_seed()
    batch = build_case("gqa4-h64-bf16-bs16", "mixed", seed)
    out = paged_attention(**batch.attention_kwargs(), variant="qblock")
    out[batch.num_tokens // 2, 0, 0] = float("nan")
    assert "non-finite" in mismatch(out, batch.reference(), batch.dtype)


def test_wide_heads_prefill_on_the_wide_head_config():
    """Prefill with heads of 256 (Gemma-2): the Q-block step's prefill config halves its KV
    tile (two stages of 128-key tiles would not fit an H100's shared memory), and matches
    the reference, softcap and window included."""
    from dataclasses import replace

    from attnbench.kernels.config import Platform
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.steps.qblock import TRITON_PREFILL, TRITON_PREFILL_WIDE_HEADS

    seed = fresh_seed()
    batch = build_head_case(HEAD_CASES["gemma-gqa2-h256-bf16-bs64"], lambda rng: [(40, 0), (33, 30)], seed,
                            window_range=(5, 40))
    h100 = Platform("cuda", 132, "", "sm_90")
    assert choose_config(batch.shape, h100, "qblock") == TRITON_PREFILL_WIDE_HEADS
    assert choose_config(replace(batch.shape, head_size=128), h100, "qblock") == TRITON_PREFILL
    run_and_check(batch, seed, variant="qblock")


def test_few_wide_head_decodes_split_in_fewer_segments():
    """Gemma-2's decodes of a few sequences at head 256, split as `auto` splits 32-64
    (sequence, KV head) pairs: 64-key tiles, 2 stages, 4 or 8 segments
    (`split_kv._split_segments`), with the sequences' lengths uneven across segments and
    a window over part of them; checked against the reference, softcap included."""
    from attnbench.kernels.config import BatchShape, Platform
    from attnbench.kernels.dispatch.heuristics import choose_config

    seed = fresh_seed()
    batch = build_head_case(HEAD_CASES["gemma-gqa2-h256-bf16-bs64"],
                            lambda rng: [(1, rng.randint(130, 400)) for _ in range(3)], seed, window_range=(60, 200))
    hopper = Platform("cuda", 132, "NVIDIA H200", "sm_90")
    for seqs, segments in ((6, 4), (4, 8)):  # Gemma-2's 16/8 heads of 256 over 3,000 keys
        config = choose_config(BatchShape(seqs, seqs, 1, 3000, 16, 8, 256), hopper)
        assert (config.variant, config.tile_size, config.num_stages, config.num_segments) == \
            ("parallel_tiled", 64, 2, segments)
        run_and_check(batch, seed, config=config)


def test_decodes_of_17_to_26_pairs_split_in_64_key_tiles_of_16_segments():
    """The split `auto` gives uniform decodes of 17-26 (sequence, KV head) pairs at head
    128 on 132 SMs (`split_kv._narrow_split_tiles`: 64-key tiles, 16 segments, 2 stages),
    run on a small batch of equal lengths, pages of 128 tokens, and on ragged lengths
    (segments cut at each range's own length), against the reference."""
    from attnbench.kernels.config import BatchShape, Platform
    from attnbench.kernels.dispatch.heuristics import choose_config

    hopper = Platform("cuda", 132, "NVIDIA H200", "sm_90")
    config = choose_config(BatchShape(2, 2, 1, 25714, 40, 10, 128, sum_seqlen_k=2 * 25714), hopper)
    assert (config.variant, config.tile_size, config.num_stages, config.num_segments) == \
        ("parallel_tiled", 64, 2, 16)
    seed = fresh_seed()
    for compose in (lambda rng: [(1, 1500)] * 3, lambda rng: [(1, rng.randint(70, 1500)) for _ in range(3)]):
        batch = build_head_case(HEAD_CASES["gqa4-h128-bf16-bs128"], compose, seed, window_range=(0, 0))
        run_and_check(batch, seed, config=config)


def test_many_wide_head_decodes_on_the_wide_head_decode_config():
    """Decodes at heads of 256 (Gemma-2) with more programs than SMs: the Q-block step's
    32-key, 4-warp decode config (`qblock.TRITON_DECODE_WIDE_HEADS`, half a 64-token page per
    tile) matches the reference on ragged lengths, softcap and window included."""
    from attnbench.kernels.config import Platform
    from attnbench.kernels.dispatch.heuristics import choose_config
    from attnbench.kernels.steps.qblock import TRITON_DECODE_WIDE_HEADS

    seed = fresh_seed()
    batch = build_head_case(HEAD_CASES["gemma-gqa2-h256-bf16-bs64"],
                            lambda rng: [(1, rng.randint(20, 200)) for _ in range(6)], seed, window_range=(30, 120))
    few_sms = Platform("cuda", 4, "", "sm_90")  # 6 sequences x 2 KV heads: more programs than SMs
    assert choose_config(batch.shape, few_sms, "qblock") == TRITON_DECODE_WIDE_HEADS
    run_and_check(batch, seed, config=TRITON_DECODE_WIDE_HEADS)
