"""The Q-block step (sec. 4.4 + 4.6) written for Hopper's asynchronous tensor cores, in Gluon.

Same function, same grid and same Q-block packing as `steps/qblock.py`; what changes is the
schedule inside a program, which Triton's own pipeliner does not give this loop on sm_90
(docs/perf/kernels-h100.md: it waits on every QK^T right after issuing it, so the softmax
sits between the two matrix products with the tensor cores idle). Here the program says
when each asynchronous operation is issued and waited for:

* K and V tiles are gathered page by page with ``cp.async`` (any page size, zero-filled past
  the sequence) into rings of shared memory, one tile ahead of the tile being computed;
* per KV tile ``j`` the program issues ``S_j = Q K_j^T`` and, right behind it, the previous
  tile's ``O += P_{j-1} V_{j-1}``; it waits only for ``S_j`` and runs the softmax of tile
  ``j`` while ``P_{j-1} V_{j-1}`` is still on the tensor cores (FlashAttention 3's
  intra-warpgroup overlap), then waits for the product before rescaling ``O``.

Eight warps (two warpgroups) share a 128-row Q-block: each warpgroup's ``wgmma`` covers 64
rows. ``P`` stays in registers as the A operand of ``P V`` (no shared-memory round trip).

Hopper only (sm_90), head sizes 64 and 128, fp16/bf16; `supports` says whether a call can
run here. Gluon has no interpreter, so this kernel is checked against the fp32 reference on
the GPU (tests/test_kernels_wgmma.py) and compiled for sm_90 on CPU-only machines.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .. import config as kconfig

# Triton 3.6 (the GPU image) and 3.9 (the CPU test environment, which compiles this kernel
# for sm_90) name two builtins differently
_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

LOG2E = gl.constexpr(kconfig.LOG2E)
BLOCK_M = 128  # rows of a Q-block: two warpgroups of 64
NUM_WARPS = 8
K_STAGES = 2  # K tile j is read by S_j only: the next tile's K can replace tile j-1's
V_STAGES = 3  # V tile j is read by P_j V_j, issued one tile later: one more buffer
HEAD_SIZES = (64, 128)
TILE_SIZES = (64, 128)


@gluon.jit
def _find_qblock_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q: gl.constexpr):
    """The sequence owning global Q-block ``q_block``: sequence ``s`` starts at Q-block
    ``cu_seqlens_q[s] // BLOCK_Q + s`` (`steps.blocks.find_seq_idx`, Q-block mode)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = gl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if start <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@gluon.jit
def _issue_kv_tile(k_buf, v_buf, k_ptr, v_ptr, bt_row, tile, seq_len, kv_head,
                   stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                   BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, HEAD_SIZE: gl.constexpr,
                   load_layout: gl.constexpr):
    """Start copying KV tile ``tile`` into ``k_buf`` / ``v_buf`` ([TILE_SIZE, HEAD_SIZE]) and
    commit the copies as one group. Each token's page comes from the block table; rows
    past ``seq_len`` are zero-filled (their scores are masked, and zeros keep ``P V`` finite)."""
    pos_k = tile * TILE_SIZE + gl.arange(0, TILE_SIZE, layout=gl.SliceLayout(1, load_layout))
    in_seq = pos_k < seq_len
    page = gl.load(bt_row + pos_k // BLOCK_SIZE, mask=in_seq, other=0).to(gl.int64)
    slot = (pos_k % BLOCK_SIZE).to(gl.int64)
    offs_d = gl.arange(0, HEAD_SIZE, layout=gl.SliceLayout(0, load_layout))
    k_rows = page * stride_kb + slot * stride_ks + kv_head * stride_kh
    v_rows = page * stride_vb + slot * stride_vs + kv_head * stride_vh
    mask = gl.expand_dims(in_seq, 1)
    _cp_async(k_buf, k_ptr + gl.expand_dims(k_rows, 1) + gl.expand_dims(offs_d, 0), mask)
    _cp_async(v_buf, v_ptr + gl.expand_dims(v_rows, 1) + gl.expand_dims(offs_d, 0), mask)
    async_copy.commit_group()


@gluon.jit
def _softmax_tile(s, m_i, l_i, tile, first_masked, pos_q, qk_scale, softcap, sliding_window,
                  TILE_SIZE: gl.constexpr, USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr):
    """Online softmax of one score tile ``s`` (raw ``Q K^T``) in base 2: returns ``P``
    (unnormalized), the factor ``alpha`` that rescales the old accumulator, and the new row
    max and sum. Tiles before ``first_masked`` are visible in full to every row (one FMA per
    score, no mask); later ones apply the causal / window mask. A row that has seen no
    visible key keeps ``m = -inf, l = 0`` (`steps.blocks.attend_tiles`). With a sliding
    window ``first_masked`` is the first tile: every tile is masked."""
    if USE_SOFTCAP:
        # softcap acts on natural-scale scores: scale, squash, then move to base 2
        x = s * (qk_scale / LOG2E) / softcap
        s = softcap * (1.0 - 2.0 / (gl.exp(2.0 * x) + 1.0)) * LOG2E
        scale = 1.0
    else:
        scale = qk_scale
    if tile >= first_masked:
        pos_k = tile * TILE_SIZE + gl.arange(0, TILE_SIZE, layout=gl.SliceLayout(0, s.type.layout))
        visible = gl.expand_dims(pos_k, 0) <= gl.expand_dims(pos_q, 1)
        if USE_WINDOW:
            visible = visible & (gl.expand_dims(pos_k, 0) > gl.expand_dims(pos_q, 1) - sliding_window)
        s = gl.where(visible, s * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - gl.expand_dims(m_safe, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
        m_safe = m_new
        p = gl.exp2(s * scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit(do_not_specialize=["num_seqs"])
def qblock_wgmma_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_bt,
    QPK: gl.constexpr, HEAD_SIZE: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_Q: gl.constexpr,
    USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr,
):
    # -- layouts: S = Q K^T and O = P V on wgmma (8 warps along M: 64 rows per warpgroup);
    #    P as the register A operand of P V; 16-byte rows for loads, stores and cp.async
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, TILE_SIZE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, HEAD_SIZE, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    io_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // HEAD_SIZE, HEAD_SIZE // 8],
                                               warps_per_cta=[8, 1], order=[1, 0])
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_SIZE], dtype)
    kv_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE_SIZE, HEAD_SIZE], dtype)

    # -- which Q-block: last ones first (under the causal mask they see the most keys)
    q_block = gl.num_programs(0) - 1 - gl.program_id(0)
    kv_head = gl.program_id(1)
    seq = _find_qblock_seq(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    query_len = gl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    q_block_local = q_block - (q_start // BLOCK_Q + seq)
    if q_block_local * BLOCK_Q >= query_len:
        return
    seq_len = gl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len
    bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt

    # -- the KV tiles this Q-block sees (`steps.blocks.tile_ranges`)
    first_pos = context_len + q_block_local * BLOCK_Q
    max_pos = context_len + gl.minimum(query_len, (q_block_local + 1) * BLOCK_Q) - 1
    end_tile = max_pos // TILE_SIZE + 1
    if USE_WINDOW:
        first_tile = gl.maximum(first_pos - sliding_window + 1, 0) // TILE_SIZE
        first_masked = first_tile  # rows see different windows: every tile is masked
    else:
        first_tile = 0
        first_masked = (first_pos + 1) // TILE_SIZE  # keys before the first row's position: no mask

    # -- shared memory: the Q-block, a ring of K tiles and a ring of V tiles
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_SIZE], q_smem_layout)
    k_smem = gl.allocate_shared_memory(dtype, [2, TILE_SIZE, HEAD_SIZE], kv_smem_layout)
    v_smem = gl.allocate_shared_memory(dtype, [3, TILE_SIZE, HEAD_SIZE], kv_smem_layout)

    # the first tile's copies go out before the Q-block is loaded
    _issue_kv_tile(k_smem.index(0), v_smem.index(0), k_ptr, v_ptr, bt_row, first_tile, seq_len, kv_head,
                   stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                   BLOCK_SIZE, TILE_SIZE, HEAD_SIZE, io_layout)

    # -- the Q-block: BLOCK_Q tokens x QPK heads of one KV head as BLOCK_M rows (sec. 4.4)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, io_layout))
    offs_d = gl.arange(0, HEAD_SIZE, layout=gl.SliceLayout(0, io_layout))
    tok = q_block_local * BLOCK_Q + offs_m // QPK
    head = kv_head * QPK + offs_m % QPK
    row_valid = (offs_m < BLOCK_Q * QPK) & (tok < query_len)
    q_rows = (q_start + tok).to(gl.int64) * stride_qt + head * stride_qh
    q = gl.load(q_ptr + gl.expand_dims(q_rows, 1) + gl.expand_dims(offs_d, 0),
                mask=gl.expand_dims(row_valid, 1), other=0.0)
    q_smem.store(q)
    rows_s = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    pos_q = context_len + q_block_local * BLOCK_Q + rows_s // QPK

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HEAD_SIZE], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, TILE_SIZE], gl.float32, layout=s_layout)

    # -- tile 0 of the range: no P V to overlap with yet. Each thread's copies (and the Q
    #    store) are complete, made visible to wgmma's async proxy, then shared by all warps
    async_copy.wait_group(0)
    fence_async_shared()
    _cta_barrier()
    if first_tile + 1 < end_tile:
        _issue_kv_tile(k_smem.index(1), v_smem.index(1), k_ptr, v_ptr, bt_row, first_tile + 1, seq_len, kv_head,
                       stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                       BLOCK_SIZE, TILE_SIZE, HEAD_SIZE, io_layout)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, first_tile, first_masked, pos_q, qk_scale, softcap,
                                       sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    # -- steady state, tile j: S_j and P_{j-1} V_{j-1} in flight together; the softmax of
    #    tile j runs while P_{j-1} V_{j-1} is still on the tensor cores
    for j in range(1, end_tile - first_tile):
        tile = first_tile + j
        # tile j's copies have landed (every thread's), and every warpgroup is past the
        # waits of iteration j-1, so K buffer (j+1)%2 and V buffer (j+1)%3 are free
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
        if tile + 1 < end_tile:
            _issue_kv_tile(k_smem.index((j + 1) % 2), v_smem.index((j + 1) % 3), k_ptr, v_ptr, bt_row, tile + 1,
                           seq_len, kv_head, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                           BLOCK_SIZE, TILE_SIZE, HEAD_SIZE, io_layout)
        s = warpgroup_mma(q_smem, k_smem.index(j % 2).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        acc = warpgroup_mma(p_op, v_smem.index((j - 1) % 3), acc, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, tile, first_masked, pos_q, qk_scale, softcap,
                                           sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    # -- the last tile's P V, then normalize and store the valid rows
    last = end_tile - first_tile - 1
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    acc = warpgroup_mma(p_op, v_smem.index(last % 3), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
    o = gl.convert_layout(o.to(dtype), io_layout)
    o_rows = (q_start + tok).to(gl.int64) * stride_ot + head * stride_oh
    gl.store(out_ptr + gl.expand_dims(o_rows, 1) + gl.expand_dims(offs_d, 0), o, mask=gl.expand_dims(row_valid, 1))


def unsupported_reason(q, k_cache) -> str | None:
    """Why this kernel cannot run a call with these tensors here, or None when it can."""
    import torch

    if q.device.type != "cuda" or torch.version.hip or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs an sm_90 (Hopper) GPU"
    if q.shape[2] not in HEAD_SIZES:
        return f"head size {q.shape[2]} (supported: {HEAD_SIZES})"
    qpk = q.shape[1] // k_cache.shape[2]
    if qpk > BLOCK_M:
        return f"{qpk} query heads per KV head (at most {BLOCK_M})"
    return None


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float, tile_size: int = 128,
           compile_only: bool = False) -> None:
    """Launch grid: (Q-blocks, KV heads), as `steps.qblock.launch`: ``num_tokens // BLOCK_Q +
    num_seqs`` bounds the Q-blocks of any batch with these token and sequence counts, and
    surplus programs return at once. One Q-block is ``BLOCK_M = 128`` rows."""
    from ..steps.blocks import Geometry, base2_scale, cache_strides, launch_or_compile

    if tile_size not in TILE_SIZES:
        raise ValueError(f"tile_size: expected one of {TILE_SIZES}, got {tile_size}")
    g = Geometry.of(q, k_cache, seq_lens)
    block_q = BLOCK_M // g.qpk
    grid = (g.q_blocks_bound(block_q), g.num_kv_heads)
    launch_or_compile(
        qblock_wgmma_kernel, grid, compile_only,
        out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
        g.num_seqs, base2_scale(scale), softcap, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *cache_strides(k_cache, v_cache), block_table.stride(0),
        QPK=g.qpk, HEAD_SIZE=g.head_size, BLOCK_SIZE=g.block_size, TILE_SIZE=tile_size,
        BLOCK_M=BLOCK_M, BLOCK_Q=block_q,
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=NUM_WARPS,
    )
