"""The Q-block step for Hopper with warp specialization, in Gluon: FlashAttention 3's
division of labour on a paged cache.

Same function, grid and Q-block packing as `qblock_wgmma` (`blocks.qblock_rows`: 128 rows
of a sequence's tokens x query heads of one KV head, so that Falcon-7B's 71 heads fill a
Q-block over two tokens); the difference is who does what inside a program. Three
warpgroups, each its own partition:

* a **producer** gathers K and V tiles page by page with ``cp.async`` (zero-filled past
  the sequence) into rings of shared memory and signals each buffer on an mbarrier when
  its copies land; it waits on "empty" mbarriers before reusing a buffer. Where a tile is
  made of whole pages (pages of 16 or 32 tokens, for instance) it computes addresses once
  per page, not per row, and masks only the tile that reaches past the sequence: ~200
  instructions per tile instead of ~340, issue slots its warps would otherwise take from
  the consumers' on the same SM sub-partitions;
* two **consumers**, one per 64-row half of the 128-row Q-block, run `qblock_wgmma`'s
  loop: per tile ``S_j = Q K_j^T`` issued with the previous tile's ``P V``, the softmax of
  tile ``j`` while ``P_{j-1} V_{j-1}`` is on the tensor cores. Each keeps its Q rows in
  its own shared buffer (in registers, as the A operand, they left too few registers for
  the wgmma pipeline: ptxas serialized it) and releases a K buffer once its ``S_j`` is done
  and a V buffer once its ``P V`` is, every thread for itself (`_release`). Its O rows
  leave through the same buffer, in 16-byte pieces. Where an item's rows all lie in the
  first half (a decode's, a short speculative query's: up to 64 rows), the second consumer
  only releases each tile as it lands (`_pass_item`).

A persistent program of a prefill-sized launch walks the items the producer claims from
an atomic counter as it frees up, posted to the consumers through a small ring of shared
slots (`_post_item`, `_take_item`; `host.launch_qblock` decides), so programs end together.
A launch whose items would leave most SMs idle splits each Q-block's tiles into
``NUM_SEGMENTS`` items instead (`host.split_segments`): each stores its rows unnormalized
with their running max and sum (`_store_partial`), and the split-KV step's reduction merges
them.

No CTA-wide barrier per tile: the two consumers run at their own pace, so one's softmax
can overlap the other's matrix products, and neither spends issue slots on addresses.
Registers are split by ``setmaxnreg``: 216 per consumer thread, 72 for the producer.

A head whose size is not a power of two (96, 192) is computed in two column pieces, each
a power of two (`host.head_pieces`: 64 + 32, 128 + 64), with a Q buffer and K and V rings
per piece: ``Q K^T`` is two products into one score tile (`_issue_scores`), ``P V`` one
per piece into its own accumulator, both from the same registers of ``P``. Every product
runs over the head's own columns (padded to 128, a head of 96 took a third more
tensor-core work).

Registered as the kernel ``qblock_ws`` (`STEP`, at the end: its configs, and the calls it
refuses in one line). Hopper only (sm_90), head sizes 64, 96, 128, 192 and 256 (64-key
tiles past 128: `host.max_tile_size`), fp16/bf16. Gluon has no interpreter:
checked against the fp32 reference on the GPU (tests/test_kernels_hopper.py), compiled for
sm_90 on CPU-only machines.
"""

from __future__ import annotations

from dataclasses import replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ..config import SHORT_QUERY, BatchShape, KernelConfig, Platform, Step
from .blocks import (K_STAGES, V_STAGES, any_row_moved, cp_async, cta_barrier, kv_page_offsets,
                     kv_page_rows, kv_tile_offsets, kv_tile_slots, normalized_rows, page_layout, program_item,
                     program_rounds, qblock_item, qblock_rows, rescale_rows, row_layout, row_tokens, softmax_tile,
                     tiles_of_whole_pages, to_16bit_pairs)
from .host import (ONE_PER_ITEM, PERSISTENT, PIECEWISE_HEAD_SIZES, even_short_queries, head_pieces, launch_qblock,
                   many_items, max_tile_size, prefill_deals_static_shares, q_block_span, split_segments,
                   unsupported_reason)

NUM_WARPS = 4  # the default partition (consumer 0); consumer 1 and the producer are workers
# the heads it takes: 64, 128 and 256 whole, 96 and 192 in two column pieces (`host.head_pieces`)
HEAD_SIZES = PIECEWISE_HEAD_SIZES
# the two workers (consumer 1, producer) get 4 warps each and 216 / 72 registers per thread
# (`warp_specialize` in the kernel); consumer 0 gets what is left of maxnreg x 12 warps
LAUNCH_OPTIONS = {"maxnreg": 168}  # 168 x 384 threads fit the 64K registers of an SM
# the ring of claimed work items a DYNAMIC producer posts to the consumers (`_post_item`)
ITEM_SLOTS: gl.constexpr = gl.constexpr(4)
ITEM_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # one item, every thread of a partition
ITEM_SMEM_LAYOUT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])


@gluon.jit
def _producer(k_ptr, v_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, item_counter_ptr, num_seqs,
              num_q_blocks, num_items, q_blocks_per_seq, min_segment_tiles, sliding_window, stride_bt, stride_kb,
              stride_ks, stride_kh, stride_vh, k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready,
              v_empty, items_smem, item_ready, item_empty, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
              HEAD_FIRST: gl.constexpr, HEAD_REST: gl.constexpr, QPK: gl.constexpr, BLOCK_M: gl.constexpr,
              USE_WINDOW: gl.constexpr,
              DYNAMIC: gl.constexpr, NUM_SEGMENTS: gl.constexpr):
    """Fill the K and V rings for every work item of this program, one tile ahead of the
    consumers as far as buffers allow: the items `blocks.program_item` deals it, or with
    ``DYNAMIC`` the next item of the list whenever it is ready for one, claimed from
    ``item_counter_ptr`` (`_claim`) and posted to the consumers (`_post_item`; a claim past
    the list, posted too, ends the program)."""
    t = gl.program_id(0) * 0  # tiles of this program's earlier items: the rings' position
    if DYNAMIC:
        r = gl.program_id(0) * 0  # items claimed so far
        item = _claim(item_counter_ptr)
        while item < num_items:
            _post_item(items_smem, item_ready, item_empty, r, item)
            t += _produce_item(item, t, k_ptr, v_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs,
                               num_q_blocks, num_items, q_blocks_per_seq, min_segment_tiles, sliding_window,
                               stride_bt, stride_kb, stride_ks, stride_kh, stride_vh, k_smem, v_smem, k_rest_smem,
                               v_rest_smem, k_ready, k_empty, v_ready, v_empty, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST,
                               HEAD_REST, QPK, BLOCK_M, USE_WINDOW, NUM_SEGMENTS)
            r += 1
            item = _claim(item_counter_ptr)
        _post_item(items_smem, item_ready, item_empty, r, item)
    else:
        for r in range(program_rounds(num_items)):
            t += _produce_item(program_item(r), t, k_ptr, v_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr,
                               num_seqs, num_q_blocks, num_items, q_blocks_per_seq, min_segment_tiles,
                               sliding_window, stride_bt, stride_kb, stride_ks, stride_kh, stride_vh, k_smem, v_smem,
                               k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, BLOCK_SIZE, TILE_SIZE,
                               HEAD_FIRST, HEAD_REST, QPK, BLOCK_M, USE_WINDOW, NUM_SEGMENTS)


@gluon.jit
def _claim(item_counter_ptr):
    """The list's next unclaimed item: one atomic increment of the launch's counter. Relaxed,
    as a work counter needs: it publishes no data (every input was written before the
    launch). Triton's default, acq_rel, puts a GPU-wide fence of the claiming thread's
    earlier memory operations before each claim and an L1 invalidation after it
    (``MEMBAR.ALL.GPU`` ... ``CCTL.IVALL`` in the SASS)."""
    return gl.atomic_add(item_counter_ptr, 1, sem="relaxed")


@gluon.jit
def _post_item(items_smem, item_ready, item_empty, r, item):
    """Hand the consumers the ``r``-th item claimed (`_producer`, ``DYNAMIC``) through ring
    slot ``r % ITEM_SLOTS`` of ``items_smem``, once both have taken what the slot held
    before (`_take_item`): the producer's warps write it, sync, and one thread arrives on
    the slot's "ready" barrier, which releases the write to the consumers that wait on it."""
    slot = r % ITEM_SLOTS
    mbarrier.wait(item_empty.index(slot), ((r // ITEM_SLOTS) & 1) ^ 1)
    items_smem.index(slot).store(gl.full([1], item, gl.int32, layout=ITEM_LAYOUT))
    cta_barrier()  # in a partition: its own warps
    mbarrier.arrive(item_ready.index(slot))


@gluon.jit
def _take_item(items_smem, item_ready, item_empty, r):
    """The ``r``-th item the producer claimed for this program (`_post_item`); every thread
    of the consumer releases the slot for itself once it has read it (`_release`)."""
    slot = r % ITEM_SLOTS
    mbarrier.wait(item_ready.index(slot), (r // ITEM_SLOTS) & 1)
    item = gl.max(items_smem.index(slot).load(ITEM_LAYOUT), axis=0)
    _release(item_empty.index(slot))
    return item


@gluon.jit
def _produce_item(item, t, k_ptr, v_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs, num_q_blocks,
                  num_items, q_blocks_per_seq, min_segment_tiles, sliding_window, stride_bt, stride_kb, stride_ks,
                  stride_kh, stride_vh, k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty,
                  BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, HEAD_FIRST: gl.constexpr,
                  HEAD_REST: gl.constexpr, QPK: gl.constexpr, BLOCK_M: gl.constexpr, USE_WINDOW: gl.constexpr,
                  NUM_SEGMENTS: gl.constexpr):
    """Fill ring positions ``t, t + 1, ...`` with the KV tiles of work item ``item``; returns
    how many. Where a piece's tiles are whole pages its addresses are computed per page and
    only the tile that reaches past the sequence is masked (`_piece_offsets`); elsewhere
    per row, every tile masked."""
    WHOLE_PAGES: gl.constexpr = (tiles_of_whole_pages(TILE_SIZE, BLOCK_SIZE, HEAD_FIRST, 4)
                                 or (HEAD_REST > 0 and tiles_of_whole_pages(TILE_SIZE, BLOCK_SIZE, HEAD_REST, 4)))
    (kv_head, q_start, query_len, q_block_local, context_len, seq_len, bt_row, first_tile, first_unmasked,
     first_masked, end_tile, _segment) = qblock_item(item, num_items, num_q_blocks, q_blocks_per_seq,
                                                     cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs,
                                                     sliding_window, stride_bt, min_segment_tiles, QPK, BLOCK_M,
                                                     TILE_SIZE, USE_WINDOW, NUM_SEGMENTS)
    k_head = k_ptr + kv_head * stride_kh  # the item's KV head in each cache
    v_head = v_ptr + kv_head * stride_vh
    for j in range(end_tile - first_tile):
        tile = first_tile + j
        if WHOLE_PAGES and (tile + 1) * TILE_SIZE <= seq_len:  # inside the sequence: no row masks
            _fill(k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, t + j, k_head,
                  v_head, bt_row, tile, seq_len, stride_kb, stride_ks, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST,
                  HEAD_REST, False)
        else:
            _fill(k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, t + j, k_head,
                  v_head, bt_row, tile, seq_len, stride_kb, stride_ks, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST,
                  HEAD_REST, True)
    return end_tile - first_tile


@gluon.jit
def _piece_offsets(bt_row, tile, seq_len, stride_b, stride_s, COL0: gl.constexpr, WIDTH: gl.constexpr,
                   BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, MASKED: gl.constexpr):
    """Element offsets from the start of a KV head of columns ``COL0 .. COL0 + WIDTH - 1``
    of KV tile ``tile``; K and V share them. Where the tile is whole pages that
    `page_layout` covers: ``[pages, BLOCK_SIZE, WIDTH]``, one address per page
    (`blocks.kv_page_offsets`; ~200 producer instructions per tile instead of ~340), rows
    past the sequence reading page 0 only with ``MASKED``. Elsewhere (pages that straddle
    tiles, as 48-token pages do, or a narrow piece whose rows per pass of the layout span
    more than a page): ``[TILE_SIZE, WIDTH]``, one address per row (`blocks.kv_tile_slots`)."""
    if tiles_of_whole_pages(TILE_SIZE, BLOCK_SIZE, WIDTH, 4):
        offs = kv_page_offsets(bt_row, tile, seq_len, stride_b, stride_s, BLOCK_SIZE, TILE_SIZE, WIDTH,
                               page_layout(WIDTH, 4, BLOCK_SIZE), MASKED)
    else:
        layout: gl.constexpr = row_layout(WIDTH, 4)
        page, slot, _in_seq = kv_tile_slots(bt_row, tile, seq_len, BLOCK_SIZE, TILE_SIZE, layout)  # `_copy_piece` masks
        offs = kv_tile_offsets(page, slot, stride_b, stride_s, WIDTH, layout)
    return offs + COL0


@gluon.jit
def _copy_piece(smem, ptrs, tile, seq_len, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, WIDTH: gl.constexpr,
                MASKED: gl.constexpr):
    """``cp.async`` of one piece of KV tile ``tile`` (``ptrs``: `_piece_offsets`) into its
    ``[TILE_SIZE, WIDTH]`` buffer, seen as pages where the offsets are. Rows past the
    sequence are zero-filled: masked per page only with ``MASKED``, per row always."""
    if tiles_of_whole_pages(TILE_SIZE, BLOCK_SIZE, WIDTH, 4):
        pages: gl.constexpr = [TILE_SIZE // BLOCK_SIZE, BLOCK_SIZE, WIDTH]
        if MASKED:
            cp_async(smem.reshape(pages), ptrs, kv_page_rows(tile, seq_len, BLOCK_SIZE, TILE_SIZE,
                                                             page_layout(WIDTH, 4, BLOCK_SIZE)))
        else:
            cp_async(smem.reshape(pages), ptrs, None)
    else:
        pos = tile * TILE_SIZE + gl.arange(0, TILE_SIZE, layout=gl.SliceLayout(1, row_layout(WIDTH, 4)))
        cp_async(smem, ptrs, gl.expand_dims(pos < seq_len, 1))


@gluon.jit
def _fill(k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, g, k_head, v_head, bt_row,
          tile, seq_len, stride_kb, stride_ks, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
          HEAD_FIRST: gl.constexpr, HEAD_REST: gl.constexpr, MASKED: gl.constexpr):
    """Copy KV tile ``tile`` into ring position ``g``, each of its column pieces into its own
    buffers, once the buffers are free. A buffer is free once both consumers have arrived on
    its "empty" barrier (the first pass through a ring waits on the phase before the first:
    already complete); its "ready" barrier completes when the copies have landed."""
    offs = _piece_offsets(bt_row, tile, seq_len, stride_kb, stride_ks, 0, HEAD_FIRST, BLOCK_SIZE, TILE_SIZE, MASKED)
    if HEAD_REST > 0:
        offs_rest = _piece_offsets(bt_row, tile, seq_len, stride_kb, stride_ks, HEAD_FIRST, HEAD_REST, BLOCK_SIZE,
                                   TILE_SIZE, MASKED)
    mbarrier.wait(k_empty.index(g % K_STAGES), ((g // K_STAGES) & 1) ^ 1)
    _copy_piece(k_smem.index(g % K_STAGES), k_head + offs, tile, seq_len, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST, MASKED)
    if HEAD_REST > 0:
        _copy_piece(k_rest_smem.index(g % K_STAGES), k_head + offs_rest, tile, seq_len, BLOCK_SIZE, TILE_SIZE,
                    HEAD_REST, MASKED)
    async_copy.mbarrier_arrive(k_ready.index(g % K_STAGES), increment_count=False)
    mbarrier.wait(v_empty.index(g % V_STAGES), ((g // V_STAGES) & 1) ^ 1)
    _copy_piece(v_smem.index(g % V_STAGES), v_head + offs, tile, seq_len, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST, MASKED)
    if HEAD_REST > 0:
        _copy_piece(v_rest_smem.index(g % V_STAGES), v_head + offs_rest, tile, seq_len, BLOCK_SIZE, TILE_SIZE,
                    HEAD_REST, MASKED)
    async_copy.mbarrier_arrive(v_ready.index(g % V_STAGES), increment_count=False)


@gluon.jit
def _q_rows(q_ptr, q_start, query_len, q_block_local, kv_head, stride_qt, stride_qh, row0,
            ROWS: gl.constexpr, BLOCK_M: gl.constexpr, QPK: gl.constexpr, COL0: gl.constexpr, WIDTH: gl.constexpr,
            layout: gl.constexpr):
    """(pointers ``[ROWS, WIDTH]``, valid ``[ROWS, 1]``) of columns ``COL0 .. COL0 + WIDTH - 1``
    of rows ``row0 .. row0 + ROWS - 1`` of a Q-block in ``layout`` (`blocks.qblock_rows`)."""
    tok, head, valid = qblock_rows(row0, q_block_local, query_len, kv_head, ROWS, BLOCK_M, QPK,
                                   gl.SliceLayout(1, layout))
    offs_d = COL0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    q_rows = (q_start + tok).to(gl.int64) * stride_qt + head * stride_qh
    return q_ptr + gl.expand_dims(q_rows, 1) + gl.expand_dims(offs_d, 0), gl.expand_dims(valid, 1)


@gluon.jit
def _q_piece(q_ptr, q_start, query_len, q_block_local, kv_head, stride_qt, stride_qh, row0,
             ROWS: gl.constexpr, BLOCK_M: gl.constexpr, QPK: gl.constexpr, COL0: gl.constexpr, WIDTH: gl.constexpr):
    """One column piece of this half's Q rows, loaded in rows of 16-byte pieces (zeros past
    the query)."""
    q_ptrs, q_valid = _q_rows(q_ptr, q_start, query_len, q_block_local, kv_head, stride_qt, stride_qh, row0, ROWS,
                              BLOCK_M, QPK, COL0, WIDTH, row_layout(WIDTH, 4))
    return gl.load(q_ptrs, mask=q_valid, other=0.0)


@gluon.jit
def _store_o(out_ptr, o_smem, o, q_start, query_len, q_block_local, kv_head, stride_ot, stride_oh, row0,
             ROWS: gl.constexpr, BLOCK_M: gl.constexpr, QPK: gl.constexpr, COL0: gl.constexpr, WIDTH: gl.constexpr):
    """Store the valid rows of one column piece of this half's normalized output: through
    ``o_smem`` (the piece's Q buffer, which the caller has seen every warp done with), read
    back in rows of 16-byte pieces, a quarter of the stores that the accumulator's layout
    (pairs of columns per thread) would need."""
    out_layout: gl.constexpr = row_layout(WIDTH, 4)
    o_smem.store(o)
    cta_barrier()
    o = o_smem.load(out_layout)
    o_ptrs, o_valid = _q_rows(out_ptr, q_start, query_len, q_block_local, kv_head, stride_ot, stride_oh, row0, ROWS,
                              BLOCK_M, QPK, COL0, WIDTH, out_layout)
    gl.store(o_ptrs, o, mask=o_valid)


@gluon.jit
def _release(empty):
    """This consumer thread is done with the buffer of ``empty``: one arrival of the
    barrier's 256 (both consumers' threads). Each thread arrives after its own
    ``warpgroup_mma_wait``, so no partition-wide sync is needed first, as it is before a
    single thread's ``mbarrier.arrive``. (``cp.async``'s arrive: it counts once all of the
    thread's earlier ``cp.async`` copies have landed; a consumer issues none.)"""
    async_copy.mbarrier_arrive(empty, increment_count=False)


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, layout: gl.constexpr, P_AT_PRODUCT: gl.constexpr,
               AT_PRODUCT: gl.constexpr):
    """``P`` as the A operand of ``P V`` (16-bit, ``layout``) where the kernel converts it:
    right after the softmax, or (``P_AT_PRODUCT``) just before the product, carrying it
    over the loop edge in fp32 (32 more registers per thread, which a 128-key tile cannot
    spare); elsewhere ``p`` as it is. Rounded two columns per register
    (`blocks.to_16bit_pairs`)."""
    if P_AT_PRODUCT == AT_PRODUCT:
        p = gl.convert_layout(to_16bit_pairs(p, dtype), layout)
    return p


@gluon.jit
def _rows_moved(alpha, LAZY_RESCALE: gl.constexpr):
    """Whether the accumulator needs rescaling by ``alpha``: always, or with
    ``LAZY_RESCALE`` only when some row's max moved (`blocks.any_row_moved`)."""
    if LAZY_RESCALE:
        moved = any_row_moved(alpha)
    else:
        moved = True
    return moved


@gluon.jit
def _take_turn(turns, k, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """Before this half's ``k``-th issue of matrix products: wait until the other half has
    issued its ``k``-th (half 0 goes first). Two warpgroups doing the same work from the
    same start stay in step, softmax against softmax, with the tensor cores idle between;
    taking turns keeps them half an iteration apart, so one's softmax runs while the
    other's products do (FlashAttention 3's ping-pong)."""
    if PINGPONG:
        mbarrier.wait(turns.index(HALF), (k + 1 - HALF) & 1)


@gluon.jit
def _pass_turn(turns, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """After this half has issued its products: the other half's turn."""
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - HALF))


@gluon.jit
def _issue_scores(q_smem, q_rest_smem, k_smem, k_rest_smem, slot, s_zero, HEAD_REST: gl.constexpr):
    """Issue ``S = Q K^T`` for the K tile in ring slot ``slot``: one product per column piece
    of the head, the second adding to the first (the pieces split its inner dimension)."""
    s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if HEAD_REST > 0:
        s = warpgroup_mma(q_rest_smem, k_rest_smem.index(slot).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _consumer_item(out_ptr, q_ptr, q_start, query_len, q_block_local, context_len, kv_head, first_tile,
                   first_unmasked, first_masked, end_tile, t, k, qk_scale, softcap, sliding_window, stride_qt,
                   stride_qh, stride_ot, stride_oh, q_smem, q_rest_smem, k_smem, v_smem, k_rest_smem, v_rest_smem,
                   k_ready, k_empty, v_ready, v_empty, turns, segment, segm_out_ptr, segm_max_ptr, segm_sum_ptr,
                   num_q_heads,
                   HALF: gl.constexpr, ROWS: gl.constexpr, QPK: gl.constexpr, HEAD_FIRST: gl.constexpr,
                   HEAD_REST: gl.constexpr, TILE_SIZE: gl.constexpr, BLOCK_M: gl.constexpr,
                   USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr, PINGPONG: gl.constexpr,
                   LAZY_RESCALE: gl.constexpr, P_AT_PRODUCT: gl.constexpr, HEAD_PAD: gl.constexpr,
                   NUM_SEGMENTS: gl.constexpr):
    """One ``ROWS``-row half (``HALF`` 0 or 1) of one work item's Q-block: the overlapped
    loop of `qblock_wgmma`, fed by the producer's mbarriers, then the normalized rows
    stored. Its tiles sit at ring positions ``t, t + 1, ...`` and its product issues at turn
    ``k, k + 1, ...`` (the counts of the program's earlier items). With ``PINGPONG`` the two
    halves take turns to issue their products (`_take_turn`). A head of two column pieces
    (``HEAD_REST > 0``) takes two products per ``Q K^T`` (`_issue_scores`) and two
    accumulators, one per piece of ``P V``'s output columns. An item that is one of
    ``NUM_SEGMENTS > 1`` segments of its Q-block's tiles stores its rows unnormalized, with
    their running max and sum, for the reduction (`_store_partial`)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, TILE_SIZE, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_FIRST, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    # matrix products in flight per P V issue: one per column piece
    PV_PRODUCTS: gl.constexpr = 2 if HEAD_REST > 0 else 1

    # this half's Q rows in its own shared buffers (the A operand of Q K^T), visible to the
    # tensor cores and to the partition's four warps before the first product.
    # (Copied by the producer instead, behind a pair of mbarriers per half, they cost more
    # than they saved; loaded during the previous item, no faster: docs/perf/kernels-h100.md.)
    # Written once every warp is done with the buffers' last contents (the previous item's O rows).
    q = _q_piece(q_ptr, q_start, query_len, q_block_local, kv_head, stride_qt, stride_qh, HALF * ROWS, ROWS, BLOCK_M,
                 QPK, 0, HEAD_FIRST)
    if HEAD_REST > 0:
        q_rest = _q_piece(q_ptr, q_start, query_len, q_block_local, kv_head, stride_qt, stride_qh, HALF * ROWS, ROWS,
                          BLOCK_M, QPK, HEAD_FIRST, HEAD_REST)
    cta_barrier()
    q_smem.store(q)
    if HEAD_REST > 0:
        q_rest_smem.store(q_rest)
    fence_async_shared()
    cta_barrier()  # in a partition: its own warps
    pos_q = context_len + row_tokens(q_block_local, HALF * ROWS + gl.arange(0, ROWS, layout=rows), QPK, BLOCK_M)[0]

    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=rows)
    l_i = gl.zeros([ROWS], gl.float32, layout=rows)
    acc = gl.zeros([ROWS, HEAD_FIRST], gl.float32, layout=o_layout)
    if HEAD_REST > 0:
        o_rest_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                instr_shape=[16, HEAD_REST, 16])
        acc_rest = gl.zeros([ROWS, HEAD_REST], gl.float32, layout=o_rest_layout)
    s_zero = gl.zeros([ROWS, TILE_SIZE], gl.float32, layout=s_layout)

    n = end_tile - first_tile
    if n > 0:
        # tile 0: no P V to overlap with yet
        mbarrier.wait(k_ready.index(t % K_STAGES), (t // K_STAGES) & 1)
        fence_async_shared()  # the producer's cp.async writes, before the tensor cores read them
        _take_turn(turns, k, HALF, PINGPONG)
        s = _issue_scores(q_smem, q_rest_smem, k_smem, k_rest_smem, t % K_STAGES, s_zero, HEAD_REST)
        _pass_turn(turns, HALF, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        _release(k_empty.index(t % K_STAGES))
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, first_tile, first_unmasked, first_masked, pos_q, qk_scale,
                                          softcap, sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW, LAZY_RESCALE)
        moved = _rows_moved(alpha, LAZY_RESCALE)
        p = _p_operand(p, dtype, p_layout, P_AT_PRODUCT, False)

        # tile j: S_j and P_{j-1} V_{j-1} in flight together, the softmax of tile j while
        # P_{j-1} V_{j-1} is still on the tensor cores
        for j in range(1, n):
            g = t + j  # this tile's ring position; the previous tile's is g - 1
            mbarrier.wait(k_ready.index(g % K_STAGES), (g // K_STAGES) & 1)
            mbarrier.wait(v_ready.index((g - 1) % V_STAGES), ((g - 1) // V_STAGES) & 1)
            fence_async_shared()
            _take_turn(turns, k + j, HALF, PINGPONG)
            s = _issue_scores(q_smem, q_rest_smem, k_smem, k_rest_smem, g % K_STAGES, s_zero, HEAD_REST)
            acc = rescale_rows(acc, alpha, moved)  # before P V adds to it; S_j needs no wait
            p_op = _p_operand(p, dtype, p_layout, P_AT_PRODUCT, True)
            acc = warpgroup_mma(p_op, v_smem.index((g - 1) % V_STAGES), acc, is_async=True)
            if HEAD_REST > 0:
                acc_rest = rescale_rows(acc_rest, alpha, moved)
                acc_rest = warpgroup_mma(p_op, v_rest_smem.index((g - 1) % V_STAGES), acc_rest, is_async=True)
            _pass_turn(turns, HALF, PINGPONG)
            s = warpgroup_mma_wait(num_outstanding=PV_PRODUCTS, deps=(s,))
            _release(k_empty.index(g % K_STAGES))
            p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, first_tile + j, first_unmasked, first_masked, pos_q,
                                              qk_scale, softcap, sliding_window, TILE_SIZE, USE_SOFTCAP, USE_WINDOW,
                                              LAZY_RESCALE)
            moved = _rows_moved(alpha, LAZY_RESCALE)  # its reduction while P V is on the tensor cores
            if HEAD_REST > 0:
                acc, acc_rest, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_rest, p_op))
            else:
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
            _release(v_empty.index((g - 1) % V_STAGES))
            p = _p_operand(p, dtype, p_layout, P_AT_PRODUCT, False)

        # the last tile's P V (its ring position: t + n - 1)
        last = t + n - 1
        mbarrier.wait(v_ready.index(last % V_STAGES), (last // V_STAGES) & 1)
        fence_async_shared()
        acc = rescale_rows(acc, alpha, moved)
        _take_turn(turns, k + n, HALF, PINGPONG)
        p_op = _p_operand(p, dtype, p_layout, P_AT_PRODUCT, True)
        acc = warpgroup_mma(p_op, v_smem.index(last % V_STAGES), acc, is_async=True)
        if HEAD_REST > 0:
            acc_rest = rescale_rows(acc_rest, alpha, moved)
            acc_rest = warpgroup_mma(p_op, v_rest_smem.index(last % V_STAGES), acc_rest, is_async=True)
        _pass_turn(turns, HALF, PINGPONG)
        if HEAD_REST > 0:
            acc, acc_rest, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_rest, p_op))
        else:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        _release(v_empty.index(last % V_STAGES))  # the program's next item refills it

    if NUM_SEGMENTS > 1:
        # a segment's rows as they are (an empty segment's: max -inf, sum 0), for the reduction
        _store_partial(segm_out_ptr, acc, q_start, query_len, q_block_local, kv_head, segment, num_q_heads,
                       HALF * ROWS, ROWS, BLOCK_M, QPK, 0, HEAD_PAD, NUM_SEGMENTS)
        if HEAD_REST > 0:
            _store_partial(segm_out_ptr, acc_rest, q_start, query_len, q_block_local, kv_head, segment,
                           num_q_heads, HALF * ROWS, ROWS, BLOCK_M, QPK, HEAD_FIRST, HEAD_PAD, NUM_SEGMENTS)
        row, valid = _segment_rows(q_start, query_len, q_block_local, kv_head, segment, num_q_heads, HALF * ROWS,
                                   ROWS, BLOCK_M, QPK, NUM_SEGMENTS, rows)
        gl.store(segm_max_ptr + row, m_i, mask=valid)
        gl.store(segm_sum_ptr + row, l_i, mask=valid)
    else:
        # the normalized rows out, one column piece at a time, through the Q buffers once
        # every warp's products are done with them
        o = normalized_rows(acc, l_i, dtype)
        if HEAD_REST > 0:
            o_rest = normalized_rows(acc_rest, l_i, dtype)
        cta_barrier()
        _store_o(out_ptr, q_smem, o, q_start, query_len, q_block_local, kv_head, stride_ot, stride_oh, HALF * ROWS,
                 ROWS, BLOCK_M, QPK, 0, HEAD_FIRST)
        if HEAD_REST > 0:
            _store_o(out_ptr, q_rest_smem, o_rest, q_start, query_len, q_block_local, kv_head, stride_ot, stride_oh,
                     HALF * ROWS, ROWS, BLOCK_M, QPK, HEAD_FIRST, HEAD_REST)


@gluon.jit
def _segment_rows(q_start, query_len, q_block_local, kv_head, segment, num_q_heads, row0, ROWS: gl.constexpr,
                  BLOCK_M: gl.constexpr, QPK: gl.constexpr, NUM_SEGMENTS: gl.constexpr, layout: gl.constexpr):
    """(row of the split's scratch, valid) of rows ``row0 .. row0 + ROWS - 1`` of a Q-block
    (``layout``): the scratch of `steps.parallel_tiled` holds ``[tokens, query heads,
    NUM_SEGMENTS]`` rows, which its reduction merges."""
    tok, head, valid = qblock_rows(row0, q_block_local, query_len, kv_head, ROWS, BLOCK_M, QPK, layout)
    return ((q_start + tok).to(gl.int64) * num_q_heads + head) * NUM_SEGMENTS + segment, valid


@gluon.jit
def _store_partial(segm_out_ptr, acc, q_start, query_len, q_block_local, kv_head, segment, num_q_heads, row0,
                   ROWS: gl.constexpr, BLOCK_M: gl.constexpr, QPK: gl.constexpr, COL0: gl.constexpr,
                   HEAD_PAD: gl.constexpr, NUM_SEGMENTS: gl.constexpr):
    """Store one column piece (from column ``COL0``) of a segment's unnormalized rows in
    fp32 into the split's scratch ``[rows, HEAD_PAD]``, straight from the accumulator."""
    row, valid = _segment_rows(q_start, query_len, q_block_local, kv_head, segment, num_q_heads, row0, ROWS,
                               BLOCK_M, QPK, NUM_SEGMENTS, gl.SliceLayout(1, acc.type.layout))
    cols = COL0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    gl.store(segm_out_ptr + gl.expand_dims(row * HEAD_PAD, 1) + gl.expand_dims(cols, 0), acc,
             mask=gl.expand_dims(valid, 1))


@gluon.jit
def _consumer(out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs, num_q_blocks, num_items,
              q_blocks_per_seq, qk_scale, softcap, sliding_window, stride_qt, stride_qh, stride_ot, stride_oh,
              stride_bt, q_smem, q_rest_smem, k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready,
              v_empty, items_smem, item_ready, item_empty, turns, split, HALF: gl.constexpr, ROWS: gl.constexpr,
              QPK: gl.constexpr, HEAD_FIRST: gl.constexpr, HEAD_REST: gl.constexpr, TILE_SIZE: gl.constexpr,
              BLOCK_M: gl.constexpr, USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr, PINGPONG: gl.constexpr,
              LAZY_RESCALE: gl.constexpr, P_AT_PRODUCT: gl.constexpr, DYNAMIC: gl.constexpr,
              HEAD_PAD: gl.constexpr, NUM_SEGMENTS: gl.constexpr):
    """This half's part of every work item of the program, in the producer's order (with
    ``DYNAMIC``, the items it posts: `_take_item`)."""
    t = gl.program_id(0) * 0  # tiles of this program's earlier items: the rings' position
    k = gl.program_id(0) * 0  # product issues of its earlier items: the turns' position
    if DYNAMIC:
        r = gl.program_id(0) * 0
        item = _take_item(items_smem, item_ready, item_empty, r)
        while item < num_items:
            n = _consume_item(item, t, k, out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs,
                              num_q_blocks, num_items, q_blocks_per_seq, qk_scale, softcap, sliding_window,
                              stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, q_smem, q_rest_smem, k_smem,
                              v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, turns, split,
                              HALF, ROWS, QPK, HEAD_FIRST, HEAD_REST, TILE_SIZE, BLOCK_M, USE_SOFTCAP, USE_WINDOW,
                              PINGPONG, LAZY_RESCALE, P_AT_PRODUCT, HEAD_PAD, NUM_SEGMENTS)
            t += n
            k += gl.where(n > 0, n + 1, 0)  # an item with tiles issues n + 1 times
            r += 1
            item = _take_item(items_smem, item_ready, item_empty, r)
    else:
        for r in range(program_rounds(num_items)):
            n = _consume_item(program_item(r), t, k, out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr,
                              num_seqs, num_q_blocks, num_items, q_blocks_per_seq, qk_scale, softcap, sliding_window,
                              stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, q_smem, q_rest_smem, k_smem,
                              v_smem, k_rest_smem, v_rest_smem, k_ready, k_empty, v_ready, v_empty, turns, split,
                              HALF, ROWS, QPK, HEAD_FIRST, HEAD_REST, TILE_SIZE, BLOCK_M, USE_SOFTCAP, USE_WINDOW,
                              PINGPONG, LAZY_RESCALE, P_AT_PRODUCT, HEAD_PAD, NUM_SEGMENTS)
            t += n
            k += gl.where(n > 0, n + 1, 0)


@gluon.jit
def _consume_item(item, t, k, out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs,
                  num_q_blocks, num_items, q_blocks_per_seq, qk_scale, softcap, sliding_window, stride_qt, stride_qh,
                  stride_ot, stride_oh, stride_bt, q_smem, q_rest_smem, k_smem, v_smem, k_rest_smem, v_rest_smem,
                  k_ready, k_empty, v_ready, v_empty, turns, split, HALF: gl.constexpr, ROWS: gl.constexpr,
                  QPK: gl.constexpr, HEAD_FIRST: gl.constexpr, HEAD_REST: gl.constexpr, TILE_SIZE: gl.constexpr,
                  BLOCK_M: gl.constexpr, USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr,
                  PINGPONG: gl.constexpr, LAZY_RESCALE: gl.constexpr, P_AT_PRODUCT: gl.constexpr,
                  HEAD_PAD: gl.constexpr, NUM_SEGMENTS: gl.constexpr):
    """This half of work item ``item`` (`_consumer_item`); returns its tile count. A half
    with none of the item's rows only passes its tiles on (`_pass_item`): the second half
    of a decode's or a short speculative query's Q-block (query tokens x query heads per KV
    head <= 64 rows), leaving the tensor cores and shared memory to the half with rows;
    either half of an item past the list or past its sequence's query (no rows, no tiles).
    ``split``: (scratch rows, maxes, sums, query heads, least tiles per segment) of a launch
    of ``NUM_SEGMENTS > 1`` segments per Q-block (`host.launch_qblock`)."""
    segm_out_ptr, segm_max_ptr, segm_sum_ptr, num_q_heads, min_segment_tiles = split
    (kv_head, q_start, query_len, q_block_local, context_len, seq_len, bt_row, first_tile, first_unmasked,
     first_masked, end_tile, segment) = qblock_item(item, num_items, num_q_blocks, q_blocks_per_seq,
                                                    cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs,
                                                    sliding_window, stride_bt, min_segment_tiles, QPK, BLOCK_M,
                                                    TILE_SIZE, USE_WINDOW, NUM_SEGMENTS)
    n = end_tile - first_tile
    rows = gl.minimum(query_len * QPK - q_block_local * BLOCK_M, BLOCK_M)  # the item's Q-block rows
    if rows <= HALF * ROWS:
        _pass_item(t, k, n, k_ready, k_empty, v_ready, v_empty, turns, HALF, PINGPONG)
    else:
        _consumer_item(out_ptr, q_ptr, q_start, query_len, q_block_local, context_len, kv_head, first_tile,
                       first_unmasked, first_masked, end_tile, t, k, qk_scale, softcap, sliding_window, stride_qt,
                       stride_qh, stride_ot, stride_oh, q_smem, q_rest_smem, k_smem, v_smem, k_rest_smem,
                       v_rest_smem, k_ready, k_empty, v_ready, v_empty, turns, segment, segm_out_ptr,
                       segm_max_ptr, segm_sum_ptr, num_q_heads, HALF, ROWS, QPK, HEAD_FIRST, HEAD_REST, TILE_SIZE,
                       BLOCK_M, USE_SOFTCAP, USE_WINDOW, PINGPONG, LAZY_RESCALE, P_AT_PRODUCT, HEAD_PAD, NUM_SEGMENTS)
    return n


@gluon.jit
def _pass_item(t, k, n, k_ready, k_empty, v_ready, v_empty, turns, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """A half with no rows in this item: release each of its ``n`` K and V tiles (ring
    positions ``t ..``) as it lands, and take and pass its ``n + 1`` turns, so that the
    producer and the other half run as if this half had computed. Each release waits for
    the tile's "ready" first: an arrival ahead of the ring would count toward an earlier
    phase of the buffer's "empty" barrier."""
    for j in range(n):
        g = t + j
        _take_turn(turns, k + j, HALF, PINGPONG)
        _pass_turn(turns, HALF, PINGPONG)
        mbarrier.wait(k_ready.index(g % K_STAGES), (g // K_STAGES) & 1)
        _release(k_empty.index(g % K_STAGES))
        mbarrier.wait(v_ready.index(g % V_STAGES), (g // V_STAGES) & 1)
        _release(v_empty.index(g % V_STAGES))
    if n > 0:
        _take_turn(turns, k + n, HALF, PINGPONG)
        _pass_turn(turns, HALF, PINGPONG)


@gluon.constexpr_function
def _smem_layout(shape, dtype):
    """The wgmma operand layout of a shared buffer of ``shape`` (swizzled as wide as its rows allow)."""
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


@gluon.jit(do_not_specialize=["num_seqs", "num_q_blocks", "num_items", "q_blocks_per_seq",
                              "item_counter_ptr", "min_segment_tiles"])
def qblock_ws_kernel(
    out_ptr, q_ptr, k_ptr, v_ptr,
    block_table_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    num_seqs, qk_scale, softcap, sliding_window,
    stride_qt, stride_qh,
    stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,  # equal to K's (launch_qblock checks): V reuses K's offsets
    stride_bt,
    num_q_blocks, num_items, q_blocks_per_seq, item_counter_ptr,
    segm_out_ptr, segm_max_ptr, segm_sum_ptr, num_q_heads, min_segment_tiles,
    QPK: gl.constexpr, HEAD_SIZE: gl.constexpr, HEAD_FIRST: gl.constexpr, HEAD_REST: gl.constexpr,
    BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr, PINGPONG: gl.constexpr, LAZY_RESCALE: gl.constexpr,
    DYNAMIC: gl.constexpr, HEAD_PAD: gl.constexpr, NUM_SEGMENTS: gl.constexpr,
):
    gl.static_assert(HEAD_FIRST + HEAD_REST == HEAD_SIZE, "the column pieces make up the head (host.head_pieces)")
    # -- the rings and their barriers: "ready" completes when the producer's 128 threads'
    #    copies have landed, "empty" when every thread of both consumers has released the
    #    buffer (`_release`). They live as long as the program: its work items
    #    (`blocks.program_item`: one per round, dealt in snake order) go through them one
    #    after another, each partition counting the tiles of the items before (a launch of
    #    one program per item runs one each)
    #    (a head of two column pieces, `host.head_pieces`, has a Q buffer and K and V rings
    #    per piece)
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    HALF_M: gl.constexpr = BLOCK_M // 2  # rows per consumer
    # where P becomes a 16-bit operand (`_p_operand`): at the product where a 64-key tile
    # leaves registers to carry it in fp32, but not beside a 128-register accumulator (head 256)
    P_AT_PRODUCT: gl.constexpr = TILE_SIZE <= 64 and HEAD_SIZE <= 128
    q_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, HEAD_FIRST], _smem_layout([HALF_M, HEAD_FIRST], dtype))
    k_smem = gl.allocate_shared_memory(dtype, [K_STAGES, TILE_SIZE, HEAD_FIRST],
                                       _smem_layout([TILE_SIZE, HEAD_FIRST], dtype))
    v_smem = gl.allocate_shared_memory(dtype, [V_STAGES, TILE_SIZE, HEAD_FIRST],
                                       _smem_layout([TILE_SIZE, HEAD_FIRST], dtype))
    if HEAD_REST > 0:
        q_rest_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, HEAD_REST], _smem_layout([HALF_M, HEAD_REST], dtype))
        k_rest_smem = gl.allocate_shared_memory(dtype, [K_STAGES, TILE_SIZE, HEAD_REST],
                                                _smem_layout([TILE_SIZE, HEAD_REST], dtype))
        v_rest_smem = gl.allocate_shared_memory(dtype, [V_STAGES, TILE_SIZE, HEAD_REST],
                                                _smem_layout([TILE_SIZE, HEAD_REST], dtype))
        q_rest_0 = q_rest_smem.index(0)
        q_rest_1 = q_rest_smem.index(1)
    else:  # one piece: the partitions' "rest" arguments are the first piece's buffers, never read
        k_rest_smem = k_smem
        v_rest_smem = v_smem
        q_rest_0 = q_smem.index(0)
        q_rest_1 = q_smem.index(1)
    k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_ready.index(i), count=128)
        mbarrier.init(k_empty.index(i), count=2 * 128)
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=128)
        mbarrier.init(v_empty.index(i), count=2 * 128)
    # the consumers' turns to issue products (used with PINGPONG)
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    # the items the producer claims (with DYNAMIC), posted to the consumers: one thread
    # arrives per item on "ready" (`_post_item`), every consumer thread on "empty"
    items_smem = gl.allocate_shared_memory(gl.int32, [ITEM_SLOTS, 1], ITEM_SMEM_LAYOUT)
    item_ready = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
    item_empty = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(ITEM_SLOTS):
        mbarrier.init(item_ready.index(i), count=1)
        mbarrier.init(item_empty.index(i), count=2 * 128)
    # a split launch's scratch (`host.launch_qblock`), for the consumers' partial rows
    split = (segm_out_ptr, segm_max_ptr, segm_sum_ptr, num_q_heads, min_segment_tiles)

    gl.warp_specialize([
        (_consumer, (out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs, num_q_blocks,
                     num_items, q_blocks_per_seq, qk_scale, softcap, sliding_window, stride_qt, stride_qh, stride_ot,
                     stride_oh, stride_bt, q_smem.index(0), q_rest_0, k_smem, v_smem, k_rest_smem, v_rest_smem,
                     k_ready, k_empty, v_ready, v_empty, items_smem, item_ready, item_empty, turns, split, 0,
                     HALF_M, QPK, HEAD_FIRST, HEAD_REST, TILE_SIZE, BLOCK_M, USE_SOFTCAP, USE_WINDOW, PINGPONG,
                     LAZY_RESCALE, P_AT_PRODUCT, DYNAMIC, HEAD_PAD, NUM_SEGMENTS)),
        (_consumer, (out_ptr, q_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, num_seqs, num_q_blocks,
                     num_items, q_blocks_per_seq, qk_scale, softcap, sliding_window, stride_qt, stride_qh, stride_ot,
                     stride_oh, stride_bt, q_smem.index(1), q_rest_1, k_smem, v_smem, k_rest_smem, v_rest_smem,
                     k_ready, k_empty, v_ready, v_empty, items_smem, item_ready, item_empty, turns, split, 1,
                     HALF_M, QPK, HEAD_FIRST, HEAD_REST, TILE_SIZE, BLOCK_M, USE_SOFTCAP, USE_WINDOW, PINGPONG,
                     LAZY_RESCALE, P_AT_PRODUCT, DYNAMIC, HEAD_PAD, NUM_SEGMENTS)),
        (_producer, (k_ptr, v_ptr, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr, item_counter_ptr, num_seqs,
                     num_q_blocks, num_items, q_blocks_per_seq, min_segment_tiles, sliding_window, stride_bt,
                     stride_kb, stride_ks, stride_kh, stride_vh, k_smem, v_smem, k_rest_smem, v_rest_smem, k_ready,
                     k_empty, v_ready, v_empty, items_smem, item_ready, item_empty, BLOCK_SIZE, TILE_SIZE, HEAD_FIRST,
                     HEAD_REST, QPK, BLOCK_M, USE_WINDOW, DYNAMIC, NUM_SEGMENTS)),
    ], [4, 4], [216, 72])  # worker warps and registers (module doc): consumer 1, producer


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *, scale: float,
           sliding_window: int | None, softcap: float, tile_size: int = 128, pingpong: bool = False,
           lazy_rescale: bool = False, persistent: bool = False, compile_only: bool = False,
           max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, dynamic: bool | None = None,
           num_segments: int = 1) -> None:
    """`host.launch_qblock` with three warpgroups per program and the register cap that
    lets ``setmaxnreg`` give the consumers 216 registers (module doc); ``pingpong``: the
    consumers take turns to issue their products (`_take_turn`); ``lazy_rescale``: a row's
    running max moves only by more than 2^8, and the accumulator is rescaled only when one
    does (`blocks.softmax_tile`). One program per work item, or with ``persistent`` one per
    SM, dealt the list (longest first) in snake order (`blocks.program_item`; FlashAttention
    3 runs a persistent grid too), or claiming items as they free up (``dynamic``; None:
    `host.launch_qblock` decides from ``max_seqlen_q``, ``max_seqlen_k`` and the list's
    length). ``num_segments`` > 1: each Q-block's tiles in that many work items, merged by
    the split-KV step's reduction (`host.launch_qblock`)."""
    head_first, head_rest = head_pieces(q.shape[2])
    launch_qblock(qblock_ws_kernel,
                  {"num_warps": NUM_WARPS, "PINGPONG": pingpong, "LAZY_RESCALE": lazy_rescale, **LAUNCH_OPTIONS,
                   "HEAD_FIRST": head_first, "HEAD_REST": head_rest},
                  out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale=scale,
                  sliding_window=sliding_window, softcap=softcap, tile_size=tile_size, compile_only=compile_only,
                  items=PERSISTENT if persistent else ONE_PER_ITEM, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k, dynamic=dynamic, num_segments=num_segments)


# Its configs: num_warps and num_stages as the kernel fixes them (3 warpgroups, a 2-deep K
# ring). 128-key tiles halve the fixed cost per tile (barrier waits, row reductions) that
# bounds it once a Q-block has many tiles; 64-key tiles waste less on the causal diagonal
# and the last partial tile. On the H100 (rules.yaml short-tiles and many-items, code
# 9b4c50f, docs/perf/h100/short-tiles-2026-11-28.csv) 128-key tiles took 0.94-0.99x the
# 64-key time on prefills and mixed batches over 700-1,024 keys at heads of 64 and 128, and
# 1.03-1.11x over 256-512 keys; from 2,048 keys they win by more (prefill B1 8k 1,070 vs
# 1,168 us, docs/perf/kernels-h100.md)
SHORT_KEYS = KernelConfig("qblock_ws", tile_size=64, block_m=128, num_warps=12, num_stages=2)
LONG_KEYS = replace(SHORT_KEYS, tile_size=128)
LONG_KEYS_FROM = 512  # max_seqlen_k above which LONG_KEYS' 128-key tiles run (where they fit)
EVEN_SHORT_QUERIES_LONG_KEYS_FROM = 256  # max_seqlen_k from which uniform short queries take them
EVEN_PROMPTS_LONG_KEYS_FROM = 512  # ... and prompts of one length in even static shares
PERSISTENT_SHORT_QUERIES_MAX_KEYS = 1024  # up to which batches of short queries launch persistent


WINDOW_SHORT_TILES_MIN_SAVING = 0.15  # share of a windowed Q-block's streamed keys 64-key tiles must save


def short_window_q_blocks(shape: BatchShape) -> bool:
    """Whether a batch of long queries has a sliding window so short that 64-key tiles
    stream at least `WINDOW_SHORT_TILES_MIN_SAVING` fewer keys per Q-block than 128-key
    ones. A Q-block reads its window and its tokens' span (`BatchShape.q_block_keys`), K
    keys that start anywhere in a tile: the tiles it touches hold K - 1 + T keys on
    average for T-key tiles. (Short queries are costed at their window already:
    `BatchShape.in_window`.)"""
    if shape.max_seqlen_q <= SHORT_QUERY or not shape.sliding_window:
        return False
    keys = shape.q_block_keys(q_block_span(shape.queries_per_kv))
    streamed = keys - 1 + SHORT_KEYS.tile_size
    return streamed <= (1 - WINDOW_SHORT_TILES_MIN_SAVING) * (keys - 1 + LONG_KEYS.tile_size)


def default_config(shape: BatchShape, p: Platform) -> KernelConfig:
    """64-key tiles up to `LONG_KEYS_FROM` keys, 128-key ones past them where they fit
    (`host.max_tile_size`: not with head 256). Persistent (one program per SM, each with a
    share of the items) wherever the batch has many items per SM (`host.many_items`: its
    programs then claim them as they free up), and up to `PERSISTENT_SHORT_QUERIES_MAX_KEYS`
    keys where it holds short queries (decodes, speculative decodes, or a mix): its items are
    short, so a program's start is a real share of each. On the H100's training set the
    persistent launch took 0.92-1.00x its one-per-item time on such batches (decodes and
    mixed batches of 1-256 sequences over 256-1k keys) and 1.02-1.06x on uniform prefills of
    a few items per SM, which keep one program per item.

    Short queries of equal, known lengths, each in one Q-block (`host.even_short_queries`),
    launch persistent at any length: their static shares are equal work, and the next
    item's tiles stream in while a program finishes one. They take 128-key tiles from
    `EVEN_SHORT_QUERIES_LONG_KEYS_FROM` keys: no causal diagonal wastes a tile's columns.
    On an H200 (recipes/microbench/rules.yaml; docs/perf/h200/rules-decodes-2026-11-29.csv)
    the persistent launch took 0.94-0.99x one program per item's time on the 18 uniform
    decodes and speculative decodes over 1.5-4k keys (Llama-8B B96 4-token queries over
    2k: 205 against 216 us), whatever share of its rounds they filled; over 256-512 keys
    (decode-tiles, 64-256 sequences) 128-key tiles took 0.91-0.98x the 64-key time
    (Llama-8B B256 over 384 keys: 115 against 127 us).

    Prompts of one length whose persistent launch is dealt in even static shares
    (`host.prefill_deals_static_shares`) take 128-key tiles from
    `EVEN_PROMPTS_LONG_KEYS_FROM` keys. On an H200 (rules.yaml many-items, short-tiles and
    busy-tiles; docs/perf/h200/rules-2026-11-29.csv, code "e37ec32 + Q-blocks listed per
    sequence") static shares of 128-key tiles took 0.83-1.02x the 64-key time on the 18
    prompts of 512 tokens to 1k (Llama-1B 40 x 512: 223 against 241 us), but 0.98-1.03x on
    the three of 384 and 1.03-1.07x on all four of 256 (Llama-8B 64 x 256: 192 against 181
    us). With 64-key tiles up to 384, `auto` came within 3% of the best static or claiming
    launch on all 27 prompts of those groups.

    Long queries under a sliding window short enough that 64-key tiles save 15% of the
    keys a Q-block streams (`short_window_q_blocks`: up to 299 keys per Q-block), 64-key
    tiles at any length. On an H200 (rules.yaml window-tiles and window-bounds;
    docs/perf/h200/rules-2026-11-29.csv, persistent launches) gpt-oss's
    prompts and chunks under its 128-key window (143 keys per 16-token Q-block, 24% saved)
    took 0.81-0.87x the 128-key tiles' time (its 8k prompt: 157 against 195 us, FA3 145),
    Llama-8B's 4k prompts under a 256-key window (287 keys, 16% saved) 0.92x; with less
    saved the two were level or the 128-key tiles won: 0.96x at 415 keys (12%), 0.99x at
    543 (10%), 1.09x and 1.11x for 128-token Q-blocks at 383 and 639 (13% and 8%).

    Long queries whose items fill at most three quarters of the SMs (a chunk over a long
    context at a few KV heads, a short prompt beside long decodes) cut each Q-block's tiles
    into `host.split_segments` items, one program each."""
    even_short = even_short_queries(shape)
    long_keys = (shape.max_seqlen_k >= EVEN_SHORT_QUERIES_LONG_KEYS_FROM if even_short
                 else shape.max_seqlen_k > LONG_KEYS_FROM or (shape.max_seqlen_k >= EVEN_PROMPTS_LONG_KEYS_FROM
                                                              and prefill_deals_static_shares(shape, p.num_sms)))
    if short_window_q_blocks(shape):
        long_keys = False
    config = LONG_KEYS if long_keys and max_tile_size(shape.head_size) >= LONG_KEYS.tile_size else SHORT_KEYS
    segments = split_segments(shape, p.num_sms)
    if segments > 1:
        return replace(config, num_segments=segments)
    if many_items(shape, p.num_sms) or even_short:
        return replace(config, persistent=True)
    if shape.max_seqlen_k > PERSISTENT_SHORT_QUERIES_MAX_KEYS:
        return config
    uniform_prefill = shape.max_seqlen_q > SHORT_QUERY and shape.num_tokens == shape.num_seqs * shape.max_seqlen_q
    return config if uniform_prefill else replace(config, persistent=True)


def refuses(q, k_cache, v_cache) -> str | None:
    """Why this kernel cannot run a call with these tensors here (`config.Step.refuses`)."""
    if k_cache.stride() != v_cache.stride():
        return (f"addresses K and V with one set of offsets: v_cache strides {tuple(v_cache.stride())} "
                f"differ from k_cache's {tuple(k_cache.stride())}")
    return unsupported_reason(q, k_cache, HEAD_SIZES)


def launch_config(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *, scale: float,
                  sliding_window: int | None, softcap: float, config: KernelConfig, compile_only: bool = False,
                  max_seqlen_q: int | None = None, max_seqlen_k: int | None = None, **_unused) -> None:
    """`launch` with a `KernelConfig`'s tile size and grid (the registered kernel's launch)."""
    launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale=scale, sliding_window=sliding_window,
           softcap=softcap, tile_size=config.tile_size, persistent=config.persistent, compile_only=compile_only,
           max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, num_segments=config.num_segments)


STEP = Step("qblock_ws", "the Q-block step of sec. 4.4 with FlashAttention 3's warp specialization (not in the paper)",
            launch_config, default_config, refuses)
