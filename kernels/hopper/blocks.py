"""Gluon building blocks shared by the Hopper kernels: the Q-block's place in the batch, its
KV tile range, the rows of a Q-block, one KV tile's gather addresses and the online softmax
of one score tile. The same definitions as the Triton steps' `steps/blocks.py` (which
Gluon code cannot call), written with explicit layouts.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .. import config as kconfig

# Triton 3.6 (the GPU image) and 3.9 (the CPU test environment, which compiles these
# kernels for sm_90) name two builtins differently
cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

LOG2E = gl.constexpr(kconfig.LOG2E)

# the rings of KV tiles in shared memory: K tile j is read by S_j only, so its buffer can be
# refilled one tile later; V tile j is read by P_j V_j, issued one tile after S_j: one more
K_STAGES = gl.constexpr(2)
V_STAGES = gl.constexpr(3)

# how far (base 2) `softmax_tile` with LAZY_MAX lets a new score exceed a row's running max
# before it moves the max: P < 2^8 (FlashAttention 4 uses the same bound)
STALE_MAX_LOG2 = gl.constexpr(8.0)


@gluon.constexpr_function
def row_layout(head_size, num_warps):
    """Rows of ``head_size`` 16-bit elements spread over ``num_warps`` warps, 8 contiguous
    elements (16 bytes) per thread: loads, stores and ``cp.async`` of whole 16-byte pieces."""
    return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[256 // head_size, head_size // 8],
                            warps_per_cta=[num_warps, 1], order=[1, 0])


@gluon.constexpr_function
def _warps_on_slots(head_size, num_warps, block_size):
    """How many of `page_layout`'s warps lie along a page's slots (the rest along pages):
    as many as a page has rows for, at ``256 // head_size`` rows per warp, in a power of two."""
    fit = max(1, min(num_warps, block_size // (256 // head_size)))
    return 1 << (fit.bit_length() - 1)


@gluon.constexpr_function
def page_layout(head_size, num_warps, block_size):
    """``[pages, slots, head_size]`` of a KV tile of ``block_size``-token pages, 8 contiguous
    elements per thread as in `row_layout`: the same rows, split into whole pages. Warps
    lie along the slots, or where a page has too few rows for all of them (a narrow column
    piece: 8 rows per warp at 32 columns), along pages too."""
    slots = _warps_on_slots(head_size, num_warps, block_size)
    return gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 256 // head_size, head_size // 8],
                            warps_per_cta=[num_warps // slots, slots, 1], order=[2, 1, 0])


@gluon.constexpr_function
def tiles_of_whole_pages(tile_size, block_size, head_size, num_warps):
    """Whether a KV tile is whole pages that `page_layout` covers without repeating a row:
    pages divide the tile, the rows one pass of the layout covers divide a page, and the
    pages it covers divide the tile's."""
    slots = _warps_on_slots(head_size, num_warps, block_size)
    return (tile_size % block_size == 0 and block_size % ((256 // head_size) * slots) == 0
            and (tile_size // block_size) % (num_warps // slots) == 0)


@gluon.jit
def locate_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block, num_seqs, QPK: gl.constexpr, BLOCK_M: gl.constexpr):
    """(sequence, its first query row, query length, Q-block index within it, sequence
    length) of global Q-block ``q_block``. A sequence's rows are its tokens' query heads,
    token-major (``query_len * QPK`` per KV head: `qblock_rows`), cut into Q-blocks of
    ``BLOCK_M``; sequence ``s`` starts at Q-block ``cu_seqlens_q[s] * QPK // BLOCK_M + s``
    (with ``QPK`` dividing ``BLOCK_M``, the Q-block numbering of `steps.blocks.find_seq_idx`).
    The Q-block has rows only if ``q_block_local * BLOCK_M < query_len * QPK``."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = gl.load(cu_seqlens_q_ptr + mid) * QPK // BLOCK_M + mid
        if start <= q_block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start, query_len, seq_len = sequence_lengths(cu_seqlens_q_ptr, seq_lens_ptr, seq)
    return seq, q_start, query_len, q_block - (q_start * QPK // BLOCK_M + seq), seq_len


@gluon.jit
def sequence_lengths(cu_seqlens_q_ptr, seq_lens_ptr, seq):
    """(first query row, query length, sequence length) of sequence ``seq``."""
    q_start = gl.load(cu_seqlens_q_ptr + seq)
    return q_start, gl.load(cu_seqlens_q_ptr + seq + 1) - q_start, gl.load(seq_lens_ptr + seq)


@gluon.jit
def program_rounds(num_items):
    """How many rounds of `program_item` this launch's programs deal: every program takes
    one item per round (none when the round runs past the list)."""
    return (num_items + gl.num_programs(0) - 1) // gl.num_programs(0)


@gluon.jit
def program_item(r):
    """This program's item in round ``r``: the programs take the next ``programs`` items of
    the list in turn, in snake order (forward in even rounds, backward in odd ones), so
    that on a list sorted longest first no program always gets the longest of its round.
    A launch of one program per item has one round: program ``p`` takes item ``p``."""
    p = gl.program_id(0)
    programs = gl.num_programs(0)
    return r * programs + gl.where(r % 2 == 0, p, programs - 1 - p)


@gluon.jit
def sequence_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block, q_blocks_per_seq, num_seqs):
    """`locate_qblock` where the list holds ``q_blocks_per_seq`` Q-blocks of every sequence,
    in order (`host.listed_q_blocks_per_seq`): sequence ``q_block // q_blocks_per_seq``,
    the Q-block itself for one per sequence, else found by bisection on integers alone, no
    load. (A division by the run-time count costs its reciprocal in registers that live
    through the producer's copy loop: at head 256, spills inside it.) Q-blocks past a
    shorter query have no rows."""
    seq = q_block
    if q_blocks_per_seq > 1:
        lo = 0
        hi = num_seqs
        while lo < hi:
            mid = (lo + hi) // 2
            if mid * q_blocks_per_seq <= q_block:
                lo = mid + 1
            else:
                hi = mid
        seq = lo - 1
    q_start, query_len, seq_len = sequence_lengths(cu_seqlens_q_ptr, seq_lens_ptr, seq)
    return seq, q_start, query_len, q_block - seq * q_blocks_per_seq, seq_len


@gluon.jit
def qblock_item(item, num_items, num_q_blocks, q_blocks_per_seq, cu_seqlens_q_ptr, seq_lens_ptr, block_table_ptr,
                num_seqs, sliding_window, stride_bt, min_segment_tiles, QPK: gl.constexpr, BLOCK_M: gl.constexpr,
                TILE_SIZE: gl.constexpr, USE_WINDOW: gl.constexpr, NUM_SEGMENTS: gl.constexpr):
    """Work item ``item`` of a flat list of (Q-block, KV head) pairs, last Q-blocks first and
    KV heads innermost (under the causal mask the last Q-blocks see the most keys: for one
    sequence the list runs longest first): (KV head, first query row, query length, Q-block
    within its sequence, context length, sequence length, block-table row, and its tile range
    as `tile_range` gives it: first tile, first unmasked tile, first masked tile, end tile).
    The Q-blocks are numbered as `locate_qblock` numbers them, a bound with spare Q-blocks
    that have no rows; or, with ``q_blocks_per_seq`` (run time; 0: the bound), that many per
    sequence, in order (`sequence_qblock`). A Q-block past its
    sequence's query, or an item past the list (``item >= num_items``), has no tiles and no
    rows (query length 0).

    With ``NUM_SEGMENTS > 1`` every (Q-block, KV head) pair is that many items, segments
    innermost, each a run of its tiles (`segment_range`); the tile range returned is the
    segment's, and its index is the last value returned (0 without segments)."""
    in_list = item < num_items
    item = gl.minimum(item, num_items - 1)
    segment = item % NUM_SEGMENTS
    pair = item // NUM_SEGMENTS
    num_kv_heads = num_items // (num_q_blocks * NUM_SEGMENTS)
    q_block = num_q_blocks - 1 - pair // num_kv_heads
    kv_head = pair % num_kv_heads
    if q_blocks_per_seq != 0:
        seq, q_start, query_len, q_block_local, seq_len = sequence_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block,
                                                                          q_blocks_per_seq, num_seqs)
    else:
        seq, q_start, query_len, q_block_local, seq_len = locate_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block,
                                                                        num_seqs, QPK, BLOCK_M)
    context_len = seq_len - query_len
    query_len = gl.where(in_list, query_len, 0)
    bt_row = block_table_ptr + seq.to(gl.int64) * stride_bt
    first_tile, first_unmasked, first_masked, end_tile = tile_range(context_len, query_len, q_block_local,
                                                                    sliding_window, QPK, BLOCK_M, TILE_SIZE,
                                                                    USE_WINDOW)
    end_tile = gl.where(q_block_local * BLOCK_M < query_len * QPK, end_tile, first_tile)
    if NUM_SEGMENTS > 1:
        first_tile, end_tile = segment_range(first_tile, end_tile, segment, min_segment_tiles, NUM_SEGMENTS)
    return (kv_head, q_start, query_len, q_block_local, context_len, seq_len, bt_row, first_tile, first_unmasked,
            first_masked, end_tile, segment)


@gluon.jit
def segment_range(first_tile, end_tile, segment, min_segment_tiles, NUM_SEGMENTS: gl.constexpr):
    """(first tile, end tile) of segment ``segment`` of the tiles ``[first_tile, end_tile)``:
    ``NUM_SEGMENTS`` runs of equal length, each at least ``min_segment_tiles`` long, so that
    a short range fills its first segments and leaves the rest empty (first = end), as the
    split-KV step cuts them (`steps.blocks.segment_tiles`)."""
    per_segment = gl.maximum((end_tile - first_tile + NUM_SEGMENTS - 1) // NUM_SEGMENTS, min_segment_tiles)
    seg_first = gl.minimum(first_tile + segment * per_segment, end_tile)
    return seg_first, gl.minimum(seg_first + per_segment, end_tile)


@gluon.jit
def tile_range(context_len, query_len, q_block_local, sliding_window, QPK: gl.constexpr, BLOCK_M: gl.constexpr,
               TILE_SIZE: gl.constexpr, USE_WINDOW: gl.constexpr):
    """(first tile, first unmasked tile, first masked tile, end tile) of a Q-block's KV
    range: from its first token's window start (or key 0) up to its last token (causal).
    Only tiles in ``[first unmasked, first masked)`` are visible in full to every row and
    skip the mask (`softmax_tile`): keys up to the Q-block's first token that lie inside its
    last token's window. The tiles before are cut by the window for some rows, those from
    ``first masked`` on by the causal diagonal. Without a window every tile from the first
    is inside it (first unmasked = first tile); with one, a long sequence has a masked tile
    or two at each end and its middle unmasked, as FlashAttention masks local attention
    (the ranges of `steps.blocks.tile_ranges`). The Q-block's tokens are those of its first
    and last rows (`qblock_rows`)."""
    first_pos = context_len + q_block_local * BLOCK_M // QPK
    max_pos = context_len + (gl.minimum(query_len * QPK, (q_block_local + 1) * BLOCK_M) - 1) // QPK
    end_tile = max_pos // TILE_SIZE + 1
    first_masked = (first_pos + 1) // TILE_SIZE
    if USE_WINDOW:
        # the last row sees keys from max_pos - window + 1 on; the first row's window starts
        # at first_pos - window + 1 (the range's start)
        first_tile = gl.maximum(first_pos - sliding_window + 1, 0) // TILE_SIZE
        first_unmasked = (gl.maximum(max_pos - sliding_window + 1, 0) + TILE_SIZE - 1) // TILE_SIZE
    else:
        first_tile = first_pos * 0
        first_unmasked = first_tile
    return first_tile, first_unmasked, first_masked, end_tile


@gluon.jit
def row_tokens(q_block_local, offs, QPK: gl.constexpr, BLOCK_M: gl.constexpr):
    """(token in sequence, query head within the KV head's group) of rows ``offs`` of a
    Q-block (`qblock_rows`). Where ``QPK`` divides ``BLOCK_M`` the Q-block is whole tokens
    and each row's part is a constant of its place in the layout, as the Triton steps
    compute it: a division of the row's own index would keep it live through the tile loop
    (at head 256, where the consumers' registers are tightest, 20% more spills in it)."""
    if BLOCK_M % QPK == 0:
        tok = q_block_local * (BLOCK_M // QPK) + offs // QPK
        group_head = offs % QPK
    else:
        row = q_block_local * BLOCK_M + offs
        tok = row // QPK
        group_head = row % QPK
    return tok, group_head


@gluon.jit
def qblock_rows(row0, q_block_local, query_len, kv_head,
                ROWS: gl.constexpr, BLOCK_M: gl.constexpr, QPK: gl.constexpr, layout: gl.constexpr):
    """Rows ``row0 .. row0 + ROWS - 1`` of a Q-block (in ``layout``): (token in sequence,
    query head, valid). A sequence's rows are its tokens' query heads of one KV head,
    token-major (sec. 4.4), and Q-block ``b`` holds rows ``b * BLOCK_M ..`` of them: row
    ``r`` of the sequence is token ``r // QPK`` and the ``r % QPK``-th query head of the KV
    head. Where ``QPK`` divides ``BLOCK_M`` a Q-block is ``BLOCK_M // QPK`` whole tokens,
    as the Triton steps pack it; elsewhere a token's heads may straddle two Q-blocks, so
    that no row is left empty (Falcon-7B's 71 heads: 128 rows over two tokens, not 71 over
    one). Rows past the query are invalid."""
    tok, group_head = row_tokens(q_block_local, row0 + gl.arange(0, ROWS, layout=layout), QPK, BLOCK_M)
    head = kv_head * QPK + group_head
    valid = tok < query_len
    return tok, head, valid


@gluon.jit
def kv_tile_slots(bt_row, tile, seq_len, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, layout: gl.constexpr):
    """(page, slot in page, inside the sequence) of the ``TILE_SIZE`` tokens of KV tile
    ``tile`` (along dim 0 of ``layout``): each token's page comes from the block table, so
    the tile size is free of the page size (sec. 4.6). Positions past ``seq_len`` read
    page 0 and are flagged (`steps.blocks.kv_tile_slots`)."""
    pos_k = tile * TILE_SIZE + gl.arange(0, TILE_SIZE, layout=gl.SliceLayout(1, layout))
    in_seq = pos_k < seq_len
    pos_k = pos_k.to(gl.uint32)  # never negative: the page and slot are a shift and a mask
    page = gl.load(bt_row + pos_k // BLOCK_SIZE, mask=in_seq, other=0)
    return page, pos_k % BLOCK_SIZE, in_seq


@gluon.jit
def kv_page_offsets(bt_row, tile, seq_len, stride_b, stride_s, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr,
                    HEAD_SIZE: gl.constexpr, layout: gl.constexpr, MASKED: gl.constexpr):
    """Element offsets ``[pages, BLOCK_SIZE, HEAD_SIZE]`` (``layout``: `page_layout`) of KV
    tile ``tile`` from the start of its KV head, in a tile of whole pages: the page numbers
    in vector loads, one 64-bit product per page, and each thread's slot and column one
    offset for all pages, where `kv_tile_offsets` pays per row. K and V share them. Without
    ``MASKED`` the tile lies inside the sequence; with it, pages past ``seq_len`` read page
    0 (`kv_page_rows` flags their rows)."""
    PAGES: gl.constexpr = TILE_SIZE // BLOCK_SIZE
    slots_layout: gl.constexpr = gl.SliceLayout(2, layout)
    page_idx = tile * PAGES + gl.arange(0, PAGES, layout=gl.SliceLayout(1, slots_layout))
    if MASKED:
        page = gl.load(bt_row + page_idx, mask=page_idx * BLOCK_SIZE < seq_len, other=0)
    else:
        page = gl.load(bt_row + page_idx)
    # pages are numbered from 0 and the stride is positive: a 32 x 32 -> 64-bit product
    page_off = page.to(gl.uint32).to(gl.int64) * stride_b.to(gl.uint32).to(gl.int64)
    slot = gl.arange(0, BLOCK_SIZE, layout=gl.SliceLayout(0, slots_layout))
    offs_d = gl.arange(0, HEAD_SIZE, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    in_page = gl.expand_dims(gl.expand_dims(slot * stride_s, 0), 2) + gl.expand_dims(gl.expand_dims(offs_d, 0), 1)
    return gl.expand_dims(gl.expand_dims(page_off, 1), 2) + in_page


@gluon.jit
def kv_page_rows(tile, seq_len, BLOCK_SIZE: gl.constexpr, TILE_SIZE: gl.constexpr, layout: gl.constexpr):
    """Which rows ``[pages, BLOCK_SIZE, 1]`` of KV tile ``tile`` (`kv_page_offsets`) lie
    inside the sequence."""
    slots_layout: gl.constexpr = gl.SliceLayout(2, layout)
    pos = tile * TILE_SIZE + gl.expand_dims(gl.arange(0, TILE_SIZE // BLOCK_SIZE,
                                                      layout=gl.SliceLayout(1, slots_layout)) * BLOCK_SIZE, 1) \
        + gl.expand_dims(gl.arange(0, BLOCK_SIZE, layout=gl.SliceLayout(0, slots_layout)), 0)
    return gl.expand_dims(pos < seq_len, 2)


@gluon.jit
def kv_tile_offsets(page, slot, stride_b, stride_s, HEAD_SIZE: gl.constexpr, layout: gl.constexpr):
    """Element offsets ``[TILE_SIZE, HEAD_SIZE]`` (``layout``) of a KV tile's rows from the
    start of their KV head in a cache. K and V share them (`host.launch_qblock` requires the
    two caches' strides to be equal, as vLLM's are), so a tile's addresses cost one 64-bit
    row offset per (page, slot) and one add per copied vector."""
    # pages are numbered from 0: zero-extended, one 64-bit product per row; the offset in
    # the page (slot x token stride) stays within 32 bits
    rows = page.to(gl.uint32).to(gl.int64) * stride_b + slot * stride_s
    offs_d = gl.arange(0, HEAD_SIZE, layout=gl.SliceLayout(0, layout))
    return gl.expand_dims(rows, 1) + gl.expand_dims(offs_d, 0)


@gluon.constexpr_function
def _pair_rounding(dtype):
    """PTX that rounds two fp32 values into one register of two 16-bit ones of ``dtype``
    (the first in the low half)."""
    return f"cvt.rn.{'bf16' if dtype == gl.bfloat16 else 'f16'}x2.f32 $0, $2, $1;"


@gluon.jit
def to_16bit_pairs(x, dtype: gl.constexpr):
    """``x.to(dtype)`` for an fp32 tile headed for a wgmma A operand, two columns per
    register (one ``cvt.rn.bf16x2.f32``, the same rounding). Rounded one value at a time,
    the pairs came back from ptxas with their halves swapped: one PRMT per register, 32
    per 64 x 128 tile of P, ~6% of a consumer's instructions per tile in `qblock_ws`
    (`qblock_wgmma`, which waits on a CTA barrier every tile, timed no faster with it)."""
    return gl.inline_asm_elementwise(_pair_rounding(dtype), "=r,r,r", [x], dtype=dtype.value, is_pure=True,
                                     pack=2)


@gluon.jit
def softcap_scores(s, qk_scale, softcap):
    """Raw scores ``s`` capped, in base 2: ``softcap * tanh(s * scale / softcap) * log2(e)``
    (``qk_scale`` is the base-2 scale: natural scale times log2(e)). One ``tanh.approx.f32``
    per score, as FlashAttention 3 does it: its relative error is below 2^-10.9, so a capped
    score is off by at most ``softcap * 2^-10.9`` (0.025 at Gemma-2's cap of 50, reached only
    by scores near the cap). Through exp and a division it took two more special-function
    ops and four more instructions per score, on a unit a quarter as wide as the FMA pipe."""
    x = s * (qk_scale / LOG2E / softcap)
    t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True, pack=1)
    return t * (softcap * LOG2E)


# $0 = $1 (a score) where $2 (its key's position) <= $3 (its query's), else -inf
_HIDE_LATER_KEY: gl.constexpr = gl.constexpr(
    "{ .reg .pred v; setp.le.s32 v, $2, $3; selp.f32 $0, $1, 0fFF800000, v; }")


@gluon.jit
def hide_later_keys(s, pos_k, pos_q):
    """Scores ``s`` with -inf where a key comes after the row's query (``pos_k > pos_q``;
    ``pos_k`` ``[1, TILE]``, ``pos_q`` ``[ROWS, 1]``): one compare and one select per
    score, written in PTX. As ``gl.where`` over a boolean tile of 128 keys, LLVM packed each
    thread's 64 compares into bitmasks and ptxas unpacked them again: ~630 instructions per
    masked 64 x 128 tile per warp in `qblock_ws`, ~370 this way (unmasked: ~205). Over 64-key
    tiles (32 compares per thread) it leaves them as they are; there, and with a window's
    second compare, `softmax_tile` keeps ``gl.where`` (with this, Gemma-2's head 256 and
    window over 64-key tiles took 1.016x the time on its 2 x 4k prefill, H100)."""
    return gl.inline_asm_elementwise(_HIDE_LATER_KEY, "=f,f,r,r", [s, pos_k, pos_q], dtype=gl.float32,
                                     is_pure=True, pack=1)


@gluon.jit
def softmax_tile(s, m_i, l_i, tile, first_unmasked, first_masked, pos_q, qk_scale, softcap, sliding_window,
                 TILE_SIZE: gl.constexpr, USE_SOFTCAP: gl.constexpr, USE_WINDOW: gl.constexpr,
                 LAZY_MAX: gl.constexpr):
    """Online softmax of one score tile ``s`` (raw ``Q K^T``) in base 2: returns ``P``
    (unnormalized), the factor ``alpha`` that rescales the old accumulator, and the new row
    max and sum. Tiles in ``[first_unmasked, first_masked)`` (`tile_range`) are visible in
    full to every row (one FMA per score, no mask); the others apply the causal / window
    mask. A row that has seen no visible key keeps ``m = -inf, l = 0``
    (`steps.blocks.attend_tiles`). A softcap squashes every score (`softcap_scores`).

    With ``LAZY_MAX`` a row keeps its running max until a tile raises it by more than
    `STALE_MAX_LOG2` (FlashAttention 4's conditional rescaling): ``P`` stays below
    ``2^STALE_MAX_LOG2`` (fp32 sums and bf16 products hold it) and ``alpha`` is exactly 1
    for such rows, so most tiles leave the accumulator as it is (`rescale_rows`). The
    result is the same softmax: ``l`` and the accumulator share the stale max."""
    if USE_SOFTCAP:
        s = softcap_scores(s, qk_scale, softcap)
        scale = 1.0
    else:
        scale = qk_scale
    # each branch computes its own max and exponentials (the same lines but for the masked
    # rows' guard), not one tail after the branch: the unmasked block, the hot one, keeps
    # the SASS that was timed (a joined tail moves its exponentials out of it; untimed)
    if (tile >= first_masked) | (tile < first_unmasked):
        pos_k = tile * TILE_SIZE + gl.arange(0, TILE_SIZE, layout=gl.SliceLayout(0, s.type.layout))
        if TILE_SIZE >= 128 and not USE_WINDOW:  # where LLVM packs the mask (`hide_later_keys`)
            s = hide_later_keys(s, gl.expand_dims(pos_k, 0), gl.expand_dims(pos_q, 1))
        else:
            visible = gl.expand_dims(pos_k, 0) <= gl.expand_dims(pos_q, 1)
            if USE_WINDOW:
                visible = visible & (gl.expand_dims(pos_k, 0) > gl.expand_dims(pos_q, 1) - sliding_window)
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
        if LAZY_MAX:
            m_new = gl.where(m_new > m_i + STALE_MAX_LOG2, m_new, m_i)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s * scale - gl.expand_dims(m_safe, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
        if LAZY_MAX:
            m_new = gl.where(m_new > m_i + STALE_MAX_LOG2, m_new, m_i)
        m_safe = m_new
        p = gl.exp2(s * scale - gl.expand_dims(m_new, 1))
    if LAZY_MAX:
        alpha = gl.where(m_new == m_i, 1.0, gl.exp2(m_i - m_safe))  # 1 also for a row still at -inf
    else:
        alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def any_row_moved(alpha):
    """Whether any row's max moved on the last tile (some ``alpha`` below 1): a scalar, so
    that `rescale_rows` can skip the multiply for the whole tile. A reduction over the rows
    of every warp of the partition; computed while the tensor cores are still busy."""
    return gl.min(alpha, axis=0) < 1.0


@gluon.jit
def rescale_rows(acc, alpha, moved):
    """``acc`` with row ``i`` times ``alpha[i]``; left as it is unless ``moved``
    (`any_row_moved`; under `softmax_tile`'s ``LAZY_MAX`` most tiles move no row)."""
    if moved:
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
    return acc


@gluon.jit
def normalized_rows(acc, l_i, dtype: gl.constexpr):
    """``acc / l`` row by row in ``dtype`` (rows that saw no key: 0), as ``acc`` times the
    row's reciprocal: one division per row, not per element (an fp32 division is four or
    five instructions around ``MUFU.RCP``; per element they were an eighth of a consumer's
    instructions on a 1k-token prefill, whose Q-blocks see few tiles)."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout))
    inv_l = 1.0 / gl.where(l_o == 0.0, 1.0, l_o)
    return (acc * gl.expand_dims(inv_l, 1)).to(dtype)
