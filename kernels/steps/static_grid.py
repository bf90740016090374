"""Step 4 of the paper (sec. 4.7): a static launch grid.

The grid is a fixed number of programs near the SM/CU count, set by the device and never
by the batch. Each program loops over work items ``(Q-block, KV head, segment)`` with a
stride of the grid size, so one compiled launch (and one captured CUDA/HIP graph) serves
every batch up to the capacity it was set up for: a smaller batch only changes the data in
``cu_seqlens_q`` / ``seq_lens`` / ``block_table`` (padding sequences have zero query and
sequence length), never the launch. This avoids the extra waves that a grid sized for the
largest batch costs under CUDA graphs.

Segments (the parallel tiled softmax of step 3) are used only for decode-like batches,
where every sequence has a single Q-block; then each sequence's tiles are split into
``num_segments`` parts (a run-time argument of the same binary) and a second static-grid
kernel merges them. Partial results are compact: one slot per (sequence, KV head,
segment), not per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import BatchShape, KernelConfig, Platform, Step
from .blocks import (Geometry, attend_qblock, base2_scale, cache_strides, launch_or_compile, locate_qblock,
                     segment_tiles, store_rows)


@triton.jit(do_not_specialize=["num_seqs", "num_work_items", "num_segments"])
def static_grid_attention_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, num_kv_heads, num_work_items, num_segments,
    qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    QPK: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr,
):
    offs_d = tl.arange(0, HEAD_PAD)
    offs_m = tl.arange(0, BLOCK_M)

    # persistent loop: this program takes every NUM_PROGRAMS-th work item; the segment
    # varies fastest so the pieces of one long sequence spread over many programs
    for item in range(tl.program_id(0), num_work_items, NUM_PROGRAMS):
        segment = item % num_segments
        kv_head = (item // num_segments) % num_kv_heads
        q_block = item // (num_segments * num_kv_heads)

        seq, q_start, query_len, q_block_local, seq_len = locate_qblock(
            cu_seqlens_q_ptr, seq_lens_ptr, q_block, num_seqs, BLOCK_Q)
        # surplus Q-block indices and padding sequences have no rows: nothing to do
        if q_block_local * BLOCK_Q < query_len:
            seg_first, seg_end, first_unmasked, first_masked = segment_tiles(
                seq_len - query_len, query_len, q_block_local, sliding_window, segment, num_segments, 1, BLOCK_Q,
                TILE_SIZE, USE_WINDOW)
            acc, m_i, l_i, tok, head, row_valid = attend_qblock(
                q_ptr, k_ptr, v_ptr, block_table_ptr, seq, q_start, query_len, q_block_local, seq_len, kv_head,
                seg_first, seg_end, first_unmasked, first_masked, qk_scale, softcap, sliding_window,
                stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                QPK, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE, TILE_SIZE, BLOCK_M, BLOCK_Q, USE_SOFTCAP, USE_WINDOW, True)

            if num_segments == 1:
                # whole range done here: normalize and write the output rows
                store_rows(out_ptr, acc, l_i, q_start, tok, head, row_valid, stride_ot, stride_oh, HEAD_SIZE, HEAD_PAD)
            else:
                # one compact slot per (sequence, KV head, segment); empty segments store
                # the -inf / 0 sentinel
                slot = (tl.cast(seq, tl.int64) * num_kv_heads + kv_head) * num_segments + segment
                tl.store(part_out_ptr + (slot * BLOCK_M + offs_m)[:, None] * HEAD_PAD + offs_d[None, :], acc)
                tl.store(part_max_ptr + slot * BLOCK_M + offs_m, m_i)
                tl.store(part_sum_ptr + slot * BLOCK_M + offs_m, l_i)


@triton.jit(do_not_specialize=["num_seqs", "num_segments"])
def static_grid_reduce_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    cu_seqlens_q_ptr, num_seqs, num_kv_heads, num_segments,
    stride_ot, stride_oh,
    QPK: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, SEGMENTS_PAD: tl.constexpr,
):
    offs_d = tl.arange(0, HEAD_PAD)
    offs_s = tl.arange(0, SEGMENTS_PAD)
    seg_mask = offs_s < num_segments
    # one work item per Q-block row (sequence, KV head, row): merge its segments at once
    for item in range(tl.program_id(0), num_seqs * num_kv_heads * BLOCK_M, NUM_PROGRAMS):
        row = item % BLOCK_M
        kv_head = (item // BLOCK_M) % num_kv_heads
        seq = item // (BLOCK_M * num_kv_heads)
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
        tok = row // QPK
        if (row < BLOCK_Q * QPK) & (tok < query_len):
            slots = (tl.cast(seq, tl.int64) * num_kv_heads + kv_head) * num_segments + offs_s
            part_rows = slots * BLOCK_M + row
            # padding lanes and empty segments carry the -inf / 0 sentinel: weight 0
            seg_max = tl.load(part_max_ptr + part_rows, mask=seg_mask, other=float("-inf"))
            seg_sum = tl.load(part_sum_ptr + part_rows, mask=seg_mask, other=0.0)
            m = tl.max(seg_max, axis=0)
            weight = tl.exp2(seg_max - m)
            total = tl.sum(seg_sum * weight, axis=0)
            seg_out = tl.load(part_out_ptr + part_rows[:, None] * HEAD_PAD + offs_d[None, :],
                              mask=seg_mask[:, None], other=0.0)
            out = tl.sum(seg_out * weight[:, None], axis=0) / total
            head = kv_head * QPK + row % QPK
            o_row = tl.cast(q_start + tok, tl.int64) * stride_ot + head * stride_oh
            tl.store(out_ptr + o_row + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_SIZE)


# upper bound of num_segments: the reduction loads all segments of a row at once, padded
# to this constant so that the segment count stays a run-time argument of one binary
MAX_SEGMENTS = 64


def num_programs(device: torch.device, config: KernelConfig) -> int:
    """The static grid: ``programs_per_sm`` programs per SM/CU of ``device``.

    Depends on the device and the config only, never on a batch. Under the CPU interpreter
    the platform's small SM count keeps every program looping over several items.
    """
    return max(1, int(Platform.detect(device).num_sms * config.programs_per_sm))


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float,
           config: KernelConfig, max_seqlen_q: int, compile_only: bool = False, **_unused) -> None:
    """Launch grid: ``(num_programs(device),)`` for both kernels, whatever the batch.

    ``num_segments`` > 1 only when every sequence fits one Q-block (``max_seqlen_q <=
    BLOCK_Q``, decode-like); it is a run-time argument, so it does not change the binary.
    ``compile_only`` compiles both kernels of the config (the reduction too, whatever this
    batch would need) and launches nothing.
    """
    g = Geometry.of(q, k_cache, seq_lens)
    block_m, block_q = g.q_block(config)
    programs = num_programs(q.device, config)
    if config.num_segments > MAX_SEGMENTS:
        raise ValueError(f"config.num_segments: expected <= {MAX_SEGMENTS} for static_grid, got {config.num_segments}")
    nseg = config.num_segments if max_seqlen_q <= block_q or compile_only else 1
    work_items = g.q_blocks_bound(block_q) * g.num_kv_heads * nseg
    slots = g.num_seqs * g.num_kv_heads * nseg if nseg > 1 and not compile_only else 1
    part_out = torch.empty(slots, block_m, g.head_pad, dtype=torch.float32, device=q.device)
    part_max = torch.empty(slots, block_m, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)

    common = dict(QPK=g.qpk, HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad, BLOCK_M=block_m,
                  BLOCK_Q=block_q, NUM_PROGRAMS=programs)
    launch_or_compile(
        static_grid_attention_kernel, (programs,), compile_only,
        out, part_out, part_max, part_sum, q, k_cache, v_cache,
        block_table, cu_seqlens_q, seq_lens,
        g.num_seqs, g.num_kv_heads, work_items, nseg,
        base2_scale(scale), softcap, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *cache_strides(k_cache, v_cache), block_table.stride(0),
        BLOCK_SIZE=g.block_size, TILE_SIZE=config.tile_size,
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=config.num_warps, num_stages=config.num_stages, **common,
    )
    if nseg > 1:
        launch_or_compile(
            static_grid_reduce_kernel, (programs,), compile_only,
            out, part_out, part_max, part_sum, cu_seqlens_q, g.num_seqs, g.num_kv_heads, nseg,
            out.stride(0), out.stride(1), SEGMENTS_PAD=MAX_SEGMENTS,
            num_warps=config.reduce_num_warps, **common,
        )


def default_config(shape: BatchShape, p: Platform) -> KernelConfig:
    """Fixed grid of a few programs per SM; decode sequences split until ~2 items per program."""
    stages = 1 if p.vendor == "hip" else 2
    if not shape.decode_only and shape.max_seqlen_q > 16:
        return KernelConfig("static_grid", tile_size=64, block_m=128, num_warps=8,
                            num_stages=stages, programs_per_sm=2)
    programs_per_sm = 4
    items = shape.num_seqs * shape.num_kv_heads
    segments = min(32, max(1, -(-2 * programs_per_sm * p.num_sms // items)))
    # its reduction's programs each walk many rows of MAX_SEGMENTS padded segments: 4 warps
    return KernelConfig("static_grid", tile_size=64, block_m=16, num_warps=4, num_stages=stages,
                        num_segments=segments, programs_per_sm=programs_per_sm, reduce_num_warps=4)


STEP = Step("static_grid", "sec. 4.7", launch, default_config)
