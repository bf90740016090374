"""Step 2 of the paper (sec. 4.4, Listing 4), with the decoupled tile size of sec. 4.6.

One program per (Q-block, KV head). A Q-block packs ``BLOCK_Q`` consecutive query tokens
of one sequence times all ``QPK`` query heads that share the KV head into ``BLOCK_M =
BLOCK_Q * QPK`` rows, so every K/V tile is loaded once for the whole group and the scores
are a real matrix product (``tl.dot``) on the tensor cores. The sequence owning a Q-block
is found by a binary search over ``cu_seqlens_q`` (see `common.find_seq_idx`).

The KV tile (``TILE_SIZE`` tokens) is independent of the cache page size: each token's
page is looked up in the block table, so pages of 16, 32 or 48 tokens all work.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..config import BatchShape, KernelConfig, Platform, Step
from .blocks import (Geometry, attend_qblock, launch_or_compile, locate_qblock, per_token_args, segment_tiles,
                     store_rows)


@triton.jit(do_not_specialize=["num_seqs"])
def qblock_attention_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    QPK: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr,
):
    # last Q-blocks first: under a causal mask they see the most keys, so the longest
    # programs start in the first wave instead of forming a tail
    q_block = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)

    seq, q_start, query_len, q_block_local, seq_len = locate_qblock(
        cu_seqlens_q_ptr, seq_lens_ptr, q_block, num_seqs, BLOCK_Q)
    if q_block_local * BLOCK_Q >= query_len:
        return
    # one program walks all of the Q-block's KV tiles
    first_tile, end_tile, first_unmasked, first_masked = segment_tiles(
        seq_len - query_len, query_len, q_block_local, sliding_window, 0, 1, 1, BLOCK_Q, TILE_SIZE, USE_WINDOW)
    acc, m_i, l_i, tok, head, row_valid = attend_qblock(
        q_ptr, k_ptr, v_ptr, block_table_ptr, seq, q_start, query_len, q_block_local, seq_len, kv_head,
        first_tile, end_tile, first_unmasked, first_masked, qk_scale, softcap, sliding_window,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        QPK, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_SIZE, BLOCK_M, BLOCK_Q, USE_SOFTCAP, USE_WINDOW, True)
    store_rows(out_ptr, acc, l_i, q_start, tok, head, row_valid, stride_ot, stride_oh, HEAD_SIZE, HEAD_PAD)


# the prefill config
TRITON_PREFILL = KernelConfig("qblock", tile_size=128, block_m=128, num_warps=8, num_stages=2)
# heads wider than 128 halve the KV tile: two stages of 128-key K and V tiles of head 256
# and the 128-row Q-block ask for 320 KiB of shared memory (an H100 has 227 KiB); with
# 64-key tiles, 192 KiB
WIDE_HEAD = 128
TRITON_PREFILL_WIDE_HEADS = KernelConfig("qblock", tile_size=64, block_m=128, num_warps=8, num_stages=2)


def prefill_config(head_size: int) -> KernelConfig:
    """The Triton kernel's prefill config for heads of ``head_size``."""
    return TRITON_PREFILL if head_size <= WIDE_HEAD else TRITON_PREFILL_WIDE_HEADS


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float,
           config: KernelConfig, compile_only: bool = False, **_unused) -> None:
    """Launch grid: (Q-blocks, KV heads).

    ``num_tokens // BLOCK_Q + num_seqs`` bounds the Q-blocks of any batch with these token
    and sequence counts (see `find_seq_idx`); surplus programs return at once. For a
    decode-only batch that is about one Q-block per sequence.
    """
    g = Geometry.of(q, k_cache, seq_lens)
    block_m, block_q = g.q_block(config)
    grid = (g.q_blocks_bound(block_q), g.num_kv_heads)
    launch_or_compile(
        qblock_attention_kernel, grid, compile_only,
        *per_token_args(g, out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, softcap,
                        sliding_window),
        QPK=g.qpk, HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad,
        BLOCK_SIZE=g.block_size, TILE_SIZE=config.tile_size,
        BLOCK_M=block_m, BLOCK_Q=block_q,
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


# Decodes of more (sequence, KV head) programs than SMs at heads over 128 (Gemma-2's 256).
# On an H200 (recipes/microbench/rules.yaml head256-tiles, docs/perf/h200/head256-tiles-2026-11-28.csv)
# they took 0.79-0.92x the time of the 128-key, 8-warp decode config on B96-B320 over 200-2k
# keys (64-key tiles in 4 warps, 76 KB: 0.85-0.91x), and 0.80-0.98x the Gluon kernel's; with
# fewer programs than SMs 1.9-2.0x, where `auto` splits the keys instead. The burst's Gemma-2
# decode steps, which nothing is fitted on: B256 over 700 keys 406 against 486 us, B500 over
# 300-900 490 against 654 (FA3 399 and 522, docs/perf/h200/burst-steps-gemma-2026-11-28.csv).
# The longest sequences' programs alone must outnumber the SMs (`BatchShape.at_full_length`;
# all programs where the lengths are unknown): a program of 32-key tiles in 4 warps streams
# its keys slower than one of 128-key tiles in 8. Two ragged Gemma-2 decodes with 66 and 81
# such programs (4 x 10k + 28 x 1.5k keys, 8 x 8k + 24 x 700) took 1.65x and 1.71x the time
# in it; `auto` splits their keys where it knows them.
TRITON_DECODE_WIDE_HEADS = KernelConfig("qblock", tile_size=32, block_m=16, num_warps=4, num_stages=2)
# memory bound: large KV tiles keep enough bytes in flight (H100: 90-98% of copy BW)
TRITON_DECODE = KernelConfig("qblock", tile_size=128, block_m=16, num_warps=8, num_stages=2)


def default_config(shape: BatchShape, p: Platform) -> KernelConfig:
    """H100 values measured (docs/perf/kernels-h100.md), wide-head decodes on an H200
    (`TRITON_DECODE_WIDE_HEADS`); ROCm values from the paper's Listing 2 and the talk's platform
    table, not yet measured here."""
    if p.vendor == "hip":
        # Listing 2: BLOCK_M 16 and tile 32 on AMD; talk: TILE_SIZE_PREFILL 64, 1 stage
        tile = 64 if shape.max_seqlen_q > 1 else 32
        return KernelConfig("qblock", tile_size=tile, block_m=16, num_warps=4, num_stages=1)
    if shape.decode_only:
        # many decodes at a wide head: a 128-key tile of 256 columns takes 143 KB of shared
        # memory, one program per SM; 32-key tiles in 4 warps take 42 KB, five
        many = shape.at_full_length(shape.num_seqs * shape.num_kv_heads) > p.num_sms
        return TRITON_DECODE_WIDE_HEADS if shape.head_size > WIDE_HEAD and many else TRITON_DECODE
    if shape.max_seqlen_q <= 16:
        # speculative decodes and tiny chunks: a 16-row Q-block wastes no rows
        return KernelConfig("qblock", tile_size=64, block_m=16, num_warps=4, num_stages=3)
    # prefill and mixed batches: 128-row Q-blocks cut K/V re-reads 8x versus 16 rows and
    # feed the tensor cores (wgmma) with 8 warps
    return prefill_config(shape.head_size)


STEP = Step("qblock", "sec. 4.4, Listing 4, with the decoupled tile size of sec. 4.6", launch, default_config)
