"""Step 3 of the paper (sec. 4.5, Listing 5): parallel tiled softmax.

A small decode batch has few Q-blocks, so the 2D grid leaves most SMs idle while each
program walks thousands of KV tokens. Here the tiles of every Q-block are split into
``NUM_SEGMENTS`` segments on a third grid axis. Each segment program runs the usual tiled
softmax over its tiles and stores its unnormalized partial output with the running max and
sum of exponentials; `reduce_segments_kernel` then merges the segments exactly like one
more step of the online softmax.

Sentinels do the bookkeeping: a segment with no visible key (short sequences, or tiles
outside a sliding window) stores ``max = -inf, sum = 0``, and the reduction pads the
segment axis to a power of two with the same sentinel, so both contribute ``exp(-inf) = 0``.

With ``equal_segments`` (`KernelConfig`), a segment is as long as one of the longest range's
``NUM_SEGMENTS`` segments, so a short sequence of a ragged batch fills a few segments and
leaves the rest empty: those programs store only the sentinel and stop, and the reduction
zeroes the output they never wrote.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import BatchShape, KernelConfig, Platform, Step, keys_in_window, next_power_of_2
from .blocks import (Geometry, attend_qblock, base2_scale, cache_strides, launch_or_compile, locate_qblock,
                     qblock_rows, segment_tiles)


@triton.jit(do_not_specialize=["num_seqs", "min_segment_tiles"])
def segmented_attention_kernel(
    segm_out_ptr, segm_max_ptr, segm_sum_ptr,
    q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, num_q_heads, min_segment_tiles, qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    QPK: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, EQUAL_SEGMENTS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    seq, q_start, query_len, q_block_local, seq_len = locate_qblock(
        cu_seqlens_q_ptr, seq_lens_ptr, q_block, num_seqs, BLOCK_Q)
    if q_block_local * BLOCK_Q >= query_len:
        return
    # this program's segment of the Q-block's KV tiles
    seg_first, seg_end, first_unmasked, first_masked = segment_tiles(
        seq_len - query_len, query_len, q_block_local, sliding_window, segment, NUM_SEGMENTS, min_segment_tiles,
        BLOCK_Q, TILE_SIZE, USE_WINDOW)
    if EQUAL_SEGMENTS:
        if seg_first >= seg_end:
            # one of a short range's many empty segments: the sentinel alone, which tells the
            # reduction to skip its output. (Without equal segments an empty segment is rare,
            # and its program loads the Q-block first, which keeps that load off the critical
            # path of every other program.)
            tok, head, row_valid, _pos = qblock_rows(q_block_local, query_len, seq_len - query_len, kv_head,
                                                     BLOCK_M, BLOCK_Q, QPK)
            row = ((q_start + tok).to(tl.int64) * num_q_heads + head) * NUM_SEGMENTS + segment
            tl.store(segm_max_ptr + row, tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), mask=row_valid)
            tl.store(segm_sum_ptr + row, tl.zeros([BLOCK_M], dtype=tl.float32), mask=row_valid)
            return
    acc, m_i, l_i, tok, head, row_valid = attend_qblock(
        q_ptr, k_ptr, v_ptr, block_table_ptr, seq, q_start, query_len, q_block_local, seq_len, kv_head,
        seg_first, seg_end, first_unmasked, first_masked, qk_scale, softcap, sliding_window,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        QPK, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_SIZE, BLOCK_M, BLOCK_Q, USE_SOFTCAP, USE_WINDOW,
        False)  # masks its whole range: segments of a few tiles run slower in three loops

    # store the partial result (an empty segment stores the -inf / 0 sentinel)
    row = ((q_start + tok).to(tl.int64) * num_q_heads + head) * NUM_SEGMENTS + segment
    offs_d = tl.arange(0, HEAD_PAD)
    tl.store(segm_out_ptr + row[:, None] * HEAD_PAD + offs_d[None, :], acc, mask=row_valid[:, None])
    tl.store(segm_max_ptr + row, m_i, mask=row_valid)
    tl.store(segm_sum_ptr + row, l_i, mask=row_valid)


@triton.jit
def reduce_segments_kernel(
    out_ptr, segm_out_ptr, segm_max_ptr, segm_sum_ptr,
    num_q_heads, stride_ot, stride_oh,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr, SEGMENTS_PAD: tl.constexpr, EQUAL_SEGMENTS: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    row = (token.to(tl.int64) * num_q_heads + head) * NUM_SEGMENTS
    offs_s = tl.arange(0, SEGMENTS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    seg_mask = offs_s < NUM_SEGMENTS

    # pow2 padding lanes load the empty-segment sentinel
    seg_max = tl.load(segm_max_ptr + row + offs_s, mask=seg_mask, other=float("-inf"))
    seg_sum = tl.load(segm_sum_ptr + row + offs_s, mask=seg_mask, other=0.0)
    m = tl.max(seg_max, axis=0)
    weight = tl.exp2(seg_max - m)  # 0 for empty segments
    total = tl.sum(seg_sum * weight, axis=0)
    seg_out = tl.load(segm_out_ptr + (row + offs_s)[:, None] * HEAD_PAD + offs_d[None, :],
                      mask=seg_mask[:, None], other=0.0)
    if EQUAL_SEGMENTS:
        # an empty segment stored no output (its scratch may hold anything, NaN included):
        # zero it after the load, which then need not wait for the max
        seg_out = tl.where((seg_max > float("-inf"))[:, None], seg_out, 0.0)
    out = tl.sum(seg_out * weight[:, None], axis=0) / total
    tl.store(out_ptr + token * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_SIZE)


def min_segment_tiles(config: KernelConfig, max_seqlen_q: int, max_seqlen_k: int, sliding_window: int | None) -> int:
    """Fewest KV tiles per segment: 1, or with ``equal_segments`` `equal_segment_tiles`."""
    if not config.equal_segments:
        return 1
    return equal_segment_tiles(config.num_segments, config.tile_size, max_seqlen_q, max_seqlen_k, sliding_window)


def equal_segment_tiles(num_segments: int, tile_size: int, max_seqlen_q: int, max_seqlen_k: int,
                        sliding_window: int | None) -> int:
    """KV tiles of one of ``num_segments`` equal segments of the longest Q-block range
    (the keys a sequence reads, `keys_in_window`, plus the tile a window's edge may
    straddle), at least 1: a shorter range fills its first segments only. The Gluon
    kernel's split cuts its ranges so too (`hopper.host.launch_qblock`)."""
    tiles = -(-keys_in_window(max_seqlen_q, max_seqlen_k, sliding_window) // tile_size)
    if sliding_window is not None:
        tiles += 1
    return max(1, -(-tiles // num_segments))


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float,
           config: KernelConfig, max_seqlen_q: int, max_seqlen_k: int, compile_only: bool = False,
           **_unused) -> None:
    """Two launches.

    Segment kernel grid: (Q-blocks, KV heads, NUM_SEGMENTS), the 2D grid of `qblock` times
    the segment axis. Reduction grid: (query tokens, query heads), one program per output
    row. Partial results live in fp32 scratch ``[tokens, q_heads, NUM_SEGMENTS, HEAD_PAD]``.
    The segments' least length is a run-time argument (`min_segment_tiles`); with
    ``equal_segments`` both kernels compile once more (the empty segments' early exit).
    """
    g = Geometry.of(q, k_cache, seq_lens)
    block_m, block_q = g.q_block(config)
    nseg = config.num_segments
    rows = 1 if compile_only else g.num_tokens  # compiling needs the scratch's dtype, not its size
    segm_out = torch.empty(rows, g.num_q_heads, nseg, g.head_pad, dtype=torch.float32, device=q.device)
    segm_max = torch.empty(rows, g.num_q_heads, nseg, dtype=torch.float32, device=q.device)
    segm_sum = torch.empty_like(segm_max)

    grid = (g.q_blocks_bound(block_q), g.num_kv_heads, nseg)
    launch_or_compile(
        segmented_attention_kernel, grid, compile_only,
        segm_out, segm_max, segm_sum, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
        g.num_seqs, g.num_q_heads, min_segment_tiles(config, max_seqlen_q, max_seqlen_k, sliding_window),
        base2_scale(scale), softcap, sliding_window or 0,
        q.stride(0), q.stride(1), *cache_strides(k_cache, v_cache), block_table.stride(0),
        QPK=g.qpk, HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad,
        BLOCK_SIZE=g.block_size, TILE_SIZE=config.tile_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, NUM_SEGMENTS=nseg, EQUAL_SEGMENTS=config.equal_segments,
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    launch_or_compile(
        reduce_segments_kernel, (g.num_tokens, g.num_q_heads), compile_only,
        out, segm_out, segm_max, segm_sum, g.num_q_heads, out.stride(0), out.stride(1),
        HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad,
        NUM_SEGMENTS=nseg, SEGMENTS_PAD=next_power_of_2(nseg), EQUAL_SEGMENTS=config.equal_segments,
        num_warps=config.reduce_num_warps,
    )


def default_config(shape: BatchShape, p: Platform) -> KernelConfig:
    if p.vendor == "hip":
        # talk appendix: NUM_WARPS_DECODE_3D 4 on ROCm; 16 segments as in vLLM; the reduction
        # keeps 4 warps there (1 was measured on the H100 only)
        return KernelConfig("parallel_tiled", tile_size=16, block_m=16, num_warps=4,
                            num_stages=1, num_segments=16, reduce_num_warps=4)
    # H100: 32 segments when there are very few (sequence, KV head) pairs, else 16
    segments = 32 if shape.num_seqs * shape.num_kv_heads <= 8 else 16
    return KernelConfig("parallel_tiled", tile_size=64, block_m=16, num_warps=4,
                        num_stages=3, num_segments=segments)


STEP = Step("parallel_tiled", "sec. 4.5, Listing 5", launch, default_config)
