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

from .common import attend_tile, find_seq_idx, kv_tile_offsets, qblock_rows
from .heuristics import KernelConfig


@triton.jit
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
    d_mask = offs_d < HEAD_SIZE
    offs_t = tl.arange(0, TILE_SIZE)
    offs_m = tl.arange(0, BLOCK_M)

    # persistent loop: this program takes every NUM_PROGRAMS-th work item; the segment
    # varies fastest so the pieces of one long sequence spread over many programs
    for item in range(tl.program_id(0), num_work_items, NUM_PROGRAMS):
        segment = item % num_segments
        kv_head = (item // num_segments) % num_kv_heads
        q_block = item // (num_segments * num_kv_heads)

        seq = find_seq_idx(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q, True)
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
        q_block_local = q_block - (q_start // BLOCK_Q + seq)
        # surplus Q-block indices and padding sequences have no rows: nothing to do
        if q_block_local * BLOCK_Q < query_len:
            seq_len = tl.load(seq_lens_ptr + seq)
            context_len = seq_len - query_len
            tok, head, row_valid, pos_q = qblock_rows(q_block_local, query_len, context_len, kv_head, BLOCK_M, BLOCK_Q, QPK)
            q_rows = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
            q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=row_valid[:, None] & d_mask[None, :], other=0.0)

            # this item's tiles: the whole causal range, or its segment of it
            max_pos = tl.max(tl.where(row_valid, pos_q, 0), axis=0)
            first_tile = 0
            if USE_WINDOW:
                first_tile = tl.maximum(context_len + q_block_local * BLOCK_Q - sliding_window + 1, 0) // TILE_SIZE
            end_tile = max_pos // TILE_SIZE + 1
            tiles_per_segment = tl.cdiv(end_tile - first_tile, num_segments)
            seg_first = first_tile + segment * tiles_per_segment
            seg_end = tl.minimum(seg_first + tiles_per_segment, end_tile)

            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
            bt_row = block_table_ptr + tl.cast(seq, tl.int64) * stride_bt
            for tile in range(seg_first, seg_end):
                pos_k = tile * TILE_SIZE + offs_t
                k_off = kv_tile_offsets(bt_row, pos_k, seq_len, stride_kb, stride_ks, BLOCK_SIZE)
                v_off = kv_tile_offsets(bt_row, pos_k, seq_len, stride_vb, stride_vs, BLOCK_SIZE)
                in_seq = pos_k < seq_len
                k_t = tl.load(k_ptr + kv_head * stride_kh + k_off[None, :] + offs_d[:, None],
                              mask=in_seq[None, :] & d_mask[:, None], other=0.0)
                v = tl.load(v_ptr + kv_head * stride_vh + v_off[:, None] + offs_d[None, :],
                            mask=in_seq[:, None] & d_mask[None, :], other=0.0)
                visible = pos_k[None, :] <= pos_q[:, None]
                if USE_WINDOW:
                    visible = visible & (pos_k[None, :] > pos_q[:, None] - sliding_window)
                acc, m_i, l_i = attend_tile(acc, m_i, l_i, q, k_t, v, visible, qk_scale, softcap, USE_SOFTCAP)

            if num_segments == 1:
                # whole range done here: normalize and write the output rows
                acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
                o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
                tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
                         mask=row_valid[:, None] & d_mask[None, :])
            else:
                # one compact slot per (sequence, KV head, segment); empty segments store
                # the -inf / 0 sentinel
                slot = (tl.cast(seq, tl.int64) * num_kv_heads + kv_head) * num_segments + segment
                tl.store(part_out_ptr + (slot * BLOCK_M + offs_m)[:, None] * HEAD_PAD + offs_d[None, :], acc)
                tl.store(part_max_ptr + slot * BLOCK_M + offs_m, m_i)
                tl.store(part_sum_ptr + slot * BLOCK_M + offs_m, l_i)


@triton.jit
def static_grid_reduce_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    cu_seqlens_q_ptr, num_seqs, num_kv_heads, num_segments,
    stride_ot, stride_oh,
    QPK: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    offs_m = tl.arange(0, BLOCK_M)
    # one work item per (sequence, KV head): merge its segments row by row
    for item in range(tl.program_id(0), num_seqs * num_kv_heads, NUM_PROGRAMS):
        seq = item // num_kv_heads
        kv_head = item % num_kv_heads
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
        if query_len > 0:
            tok, head, row_valid, pos_q = qblock_rows(0, query_len, 0, kv_head, BLOCK_M, BLOCK_Q, QPK)
            base = tl.cast(item, tl.int64) * num_segments * BLOCK_M
            m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            for s in range(0, num_segments):
                m = tl.maximum(m, tl.load(part_max_ptr + base + s * BLOCK_M + offs_m))
            m = tl.where(m == float("-inf"), 0.0, m)
            total = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
            for s in range(0, num_segments):
                slot_rows = base + s * BLOCK_M + offs_m
                w = tl.exp2(tl.load(part_max_ptr + slot_rows) - m)  # 0 for empty segments
                total += w * tl.load(part_sum_ptr + slot_rows)
                acc += w[:, None] * tl.load(part_out_ptr + slot_rows[:, None] * HEAD_PAD + offs_d[None, :])
            acc = acc / tl.where(total == 0.0, 1.0, total)[:, None]
            o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
            tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
                     mask=row_valid[:, None] & d_mask[None, :])


def num_programs(device: torch.device, config: KernelConfig) -> int:
    """The static grid: ``programs_per_sm`` programs per SM/CU of ``device``.

    Depends on the device and the config only, never on a batch. Under the CPU interpreter
    (no SM count) a small fixed grid keeps every program looping over several items.
    """
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    return max(1, int(sms * config.programs_per_sm))


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float,
           config: KernelConfig, max_seqlen_q: int, **_unused) -> None:
    """Launch grid: ``(num_programs(device),)`` for both kernels, whatever the batch.

    ``num_segments`` > 1 only when every sequence fits one Q-block (``max_seqlen_q <=
    BLOCK_Q``, decode-like); it is a run-time argument, so it does not change the binary.
    """
    num_tokens, num_q_heads, head_size = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    qpk = num_q_heads // num_kv_heads
    block_m = config.block_m_for(qpk)
    block_q = block_m // qpk
    head_pad = triton.next_power_of_2(head_size)
    num_seqs = seq_lens.shape[0]
    programs = num_programs(q.device, config)
    nseg = config.num_segments if max_seqlen_q <= block_q else 1
    work_items = (num_tokens // block_q + num_seqs) * num_kv_heads * nseg
    slots = num_seqs * num_kv_heads * nseg if nseg > 1 else 1
    part_out = torch.empty(slots, block_m, head_pad, dtype=torch.float32, device=q.device)
    part_max = torch.empty(slots, block_m, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)

    common = dict(QPK=qpk, HEAD_SIZE=head_size, HEAD_PAD=head_pad, BLOCK_M=block_m,
                  BLOCK_Q=block_q, NUM_PROGRAMS=programs)
    static_grid_attention_kernel[(programs,)](
        out, part_out, part_max, part_sum, q, k_cache, v_cache,
        block_table, cu_seqlens_q, seq_lens,
        num_seqs, num_kv_heads, work_items, nseg,
        scale * 1.4426950408889634, softcap, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        BLOCK_SIZE=block_size, TILE_SIZE=config.tile_size,
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=config.num_warps, num_stages=config.num_stages, **common,
    )
    if nseg > 1:
        static_grid_reduce_kernel[(programs,)](
            out, part_out, part_max, part_sum, cu_seqlens_q, num_seqs, num_kv_heads, nseg,
            out.stride(0), out.stride(1), num_warps=config.reduce_num_warps, **common,
        )
