"""The Q-block step (sec. 4.4 + 4.6) written for Hopper's asynchronous tensor cores, in Gluon.

Same function as `steps/qblock.py`, and its Q-block packing wherever the query heads per KV
head divide the Q-block's 128 rows (elsewhere a token's heads may straddle two Q-blocks, so
that none is left part empty: `blocks.qblock_rows`); what changes is the schedule inside a
program, which Triton's own pipeliner does not give this loop on sm_90
(docs/perf/kernels-h100.md: it waits on every QK^T right after issuing it, so the softmax
sits between the two matrix products with the tensor cores idle). Here the program says
when each asynchronous operation is issued and waited for:

* K and V tiles are gathered page by page with ``cp.async`` (any page size, zero-filled past
  the sequence) into rings of shared memory, one tile ahead of the tile being computed, and
  issued after that tile's matrix products so that their addresses are computed while the
  tensor cores work;
* per KV tile ``j`` the program issues ``S_j = Q K_j^T`` and, right behind it, the previous
  tile's ``O += P_{j-1} V_{j-1}``; it waits only for ``S_j`` and runs the softmax of tile
  ``j`` while ``P_{j-1} V_{j-1}`` is still on the tensor cores (FlashAttention 3's
  intra-warpgroup overlap), then waits for the product before rescaling ``O``.

Eight warps (two warpgroups) share a 128-row Q-block: each warpgroup's ``wgmma`` covers 64
rows. ``P`` stays in registers as the A operand of ``P V`` (no shared-memory round trip).

Hopper only (sm_90), head sizes 64, 128 and 256 (64-key tiles), fp16/bf16; `supports`
says whether a call can run here. Gluon has no interpreter, so this kernel is checked
against the fp32 reference on the GPU (tests/test_kernels_hopper.py) and compiled for
sm_90 on CPU-only machines.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .blocks import (K_STAGES, V_STAGES, cp_async, cta_barrier, kv_tile_offsets, kv_tile_slots,
                     locate_qblock, normalized_rows, qblock_rows, rescale_rows, row_layout, row_tokens,
                     softmax_tile, tile_range)
from .host import HEAD_SIZES, launch_qblock  # HEAD_SIZES: the heads it takes, at their own width

NUM_WARPS = 8  # two warpgroups, 64 rows of the 128-row Q-block each


@gluon.jit
def _issue_kv_tile(k_buf, v_buf, k_head_ptr, v_head_ptr, bt_row, tile, seq_len, stride_b, stride_s,
                   BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, HEAD_SIZE: gl.constexpr,
                   load_layout: gl.constexpr):
    """Start copying KV tile ``tile`` of one KV head (``k_head_ptr`` / ``v_head_ptr``: the
    caches offset to that head) into ``k_buf`` / ``v_buf`` ([TILE_SIZE, HEAD_SIZE]) and commit
    the copies as one group. Rows past ``seq_len`` are zero-filled (their scores are masked,
    and zeros keep ``P V`` finite whatever the cache holds there)."""
    page, slot, in_seq = kv_tile_slots(bt_row, tile, seq_len, BLOCK_SIZE, TILE_SIZE, load_layout)
    rows_in_seq = gl.expand_dims(in_seq, 1)
    offs = kv_tile_offsets(page, slot, stride_b, stride_s, HEAD_SIZE, load_layout)
    cp_async(k_buf, k_head_ptr + offs, rows_in_seq)
    cp_async(v_buf, v_head_ptr + offs, rows_in_seq)
    async_copy.commit_group()


@gluon.jit(do_not_specialize=["num_seqs"])
def qblock_wgmma_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,  # equal to K's (launch_qblock checks): V reuses K's offsets
    stride_bt,
    QPK: gl.constexpr, HEAD_SIZE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr,
):
    # -- layouts: S = Q K^T and O = P V on wgmma (8 warps along M: 64 rows per warpgroup);
    #    P as the register A operand of P V; 16-byte rows for loads, stores and cp.async
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, TILE_SIZE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, HEAD_SIZE, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    io_layout: gl.constexpr = row_layout(HEAD_SIZE, 8)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_SIZE], dtype)
    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE_SIZE, HEAD_SIZE], dtype)

    # -- which Q-block: last ones first (under the causal mask they see the most keys)
    q_block = gl.num_programs(0) - 1 - gl.program_id(0)
    kv_head = gl.program_id(1)
    seq, q_start, query_len, q_block_local, seq_len = locate_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block,
                                                                    num_seqs, QPK, BLOCK_M)
    if q_block_local * BLOCK_M >= query_len * QPK:
        return
    context_len = seq_len - query_len
    bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
    k_head = k_ptr + kv_head * stride_kh  # this program's KV head in each cache
    v_head = v_ptr + kv_head * stride_vh
    first_tile, first_unmasked, first_masked, end_tile = tile_range(context_len, query_len, q_block_local,
                                                                    sliding_window, QPK, BLOCK_M, TILE_SIZE,
                                                                    USE_WINDOW)

    # -- shared memory: the Q-block, a ring of K tiles and a ring of V tiles
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_SIZE], q_smem_layout)
    k_smem = gl.allocate_shared_memory(dtype, [K_STAGES, TILE_SIZE, HEAD_SIZE], kv_smem_layout)
    v_smem = gl.allocate_shared_memory(dtype, [V_STAGES, TILE_SIZE, HEAD_SIZE], kv_smem_layout)

    # the first tile's copies go out before the Q-block is loaded
    _issue_kv_tile(k_smem.index(0), v_smem.index(0), k_head, v_head, bt_row, first_tile, seq_len,
                   stride_kb, stride_ks, BLOCK_SIZE, TILE_SIZE, HEAD_SIZE, io_layout)

    # -- the Q-block: BLOCK_M rows of the sequence's tokens x QPK heads of one KV head (sec. 4.4)
    tok, head, row_valid = qblock_rows(0, q_block_local, query_len, kv_head, BLOCK_M, BLOCK_M, QPK,
                                       gl.SliceLayout(1, io_layout))
    offs_d = gl.arange(0, HEAD_SIZE, layout=gl.SliceLayout(0, io_layout))
    q_rows = (q_start + tok).to(gl.int64) * stride_qt + head * stride_qh
    q = gl.load(q_ptr + gl.expand_dims(q_rows, 1) + gl.expand_dims(offs_d, 0),
                mask=gl.expand_dims(row_valid, 1), other=0.0)
    q_smem.store(q)
    rows_s = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    pos_q = context_len + row_tokens(q_block_local, rows_s, QPK, BLOCK_M)[0]

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_SIZE], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, TILE_SIZE], gl.float32, layout=s_layout)

    # -- tile 0 of the range: no P V to overlap with yet. Each thread's copies (and the Q
    #    store) are complete, made visible to wgmma's async proxy, then shared by all warps
    async_copy.wait_group(0)
    fence_async_shared()
    cta_barrier()
    if first_tile + 1 < end_tile:
        _issue_kv_tile(k_smem.index(1), v_smem.index(1), k_head, v_head, bt_row, first_tile + 1, seq_len,
                       stride_kb, stride_ks, BLOCK_SIZE, TILE_SIZE, HEAD_SIZE, io_layout)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, first_tile, first_unmasked, first_masked, pos_q, qk_scale,
                                       softcap, sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW, False)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    # -- steady state, tile j: S_j and P_{j-1} V_{j-1} in flight together; the softmax of
    #    tile j runs while P_{j-1} V_{j-1} is still on the tensor cores
    for j in range(1, end_tile - first_tile):
        tile = first_tile + j
        # tile j's copies have landed (every thread's), and every warpgroup is past the
        # waits of iteration j-1, so the K and V buffers of tile j+1 are free
        async_copy.wait_group(0)
        fence_async_shared()
        cta_barrier()
        s = warpgroup_mma(q_smem, k_smem.index(j % K_STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = rescale_rows(acc, alpha, True)
        acc = warpgroup_mma(p_op, v_smem.index((j - 1) % V_STAGES), acc, is_async=True)
        # the next tile's gathers go out while both products run (their buffers held tiles
        # j-1 and j-2, whose products every warpgroup has waited for)
        if tile + 1 < end_tile:
            _issue_kv_tile(k_smem.index((j + 1) % K_STAGES), v_smem.index((j + 1) % V_STAGES), k_head, v_head,
                           bt_row, tile + 1, seq_len, stride_kb, stride_ks, BLOCK_SIZE, TILE_SIZE, HEAD_SIZE,
                           io_layout)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, tile, first_unmasked, first_masked, pos_q, qk_scale,
                                           softcap, sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW, False)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    # -- the last tile's P V, then normalize and store the valid rows
    last = end_tile - first_tile - 1
    acc = rescale_rows(acc, alpha, True)
    acc = warpgroup_mma(p_op, v_smem.index(last % V_STAGES), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    o = gl.convert_layout(normalized_rows(acc, l_i, dtype), io_layout)
    o_rows = (q_start + tok).to(gl.int64) * stride_ot + head * stride_oh
    gl.store(out_ptr + gl.expand_dims(o_rows, 1) + gl.expand_dims(offs_d, 0), o, mask=gl.expand_dims(row_valid, 1))


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *, scale: float,
           sliding_window: int | None, softcap: float, tile_size: int = 128, compile_only: bool = False) -> None:
    """`host.launch_qblock` with eight warps (two warpgroups) per program."""
    launch_qblock(qblock_wgmma_kernel, {"num_warps": NUM_WARPS}, out, q, k_cache, v_cache, block_table,
                  cu_seqlens_q, seq_lens, scale=scale, sliding_window=sliding_window, softcap=softcap,
                  tile_size=tile_size, compile_only=compile_only)
