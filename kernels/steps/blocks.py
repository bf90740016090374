"""Building blocks shared by the steps: on the device, sequence lookup, masking and one
softmax tile in Triton; on the host, the sizes and strides every launcher passes.

Every step computes the same function (see `bench/reference.py`); these are the pieces
that do not change from one step of the paper to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from .. import config
from ..config import KernelConfig, next_power_of_2

# log2(e) inside the kernels (a constexpr: Triton kernels read no other globals)
LOG2E = tl.constexpr(config.LOG2E)


@dataclass(frozen=True)
class Geometry:
    """The sizes of one call, read from the tensors' shapes on the host (no sync)."""

    num_tokens: int
    num_q_heads: int
    head_size: int
    num_kv_heads: int
    block_size: int  # KV-cache page size
    num_seqs: int

    @classmethod
    def of(cls, q, k_cache, seq_lens) -> "Geometry":
        num_tokens, num_q_heads, head_size = q.shape
        return cls(num_tokens, num_q_heads, head_size, k_cache.shape[2], k_cache.shape[1], seq_lens.shape[0])

    @property
    def qpk(self) -> int:
        """Query heads per KV head (the GQA group)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def head_pad(self) -> int:
        return next_power_of_2(self.head_size)

    def q_block(self, cfg: KernelConfig) -> tuple[int, int]:
        """(BLOCK_M rows, BLOCK_Q query tokens) of a Q-block: all QPK heads of a token share it."""
        block_m = cfg.block_m_for(self.qpk)
        return block_m, block_m // self.qpk

    def q_blocks_bound(self, block_q: int) -> int:
        """Q-blocks of any batch with these token and sequence counts, at most (`find_seq_idx`)."""
        return self.num_tokens // block_q + self.num_seqs


def cache_strides(k_cache, v_cache) -> tuple[int, ...]:
    """(page, slot, head) strides of K, then of V: the ``stride_k*`` / ``stride_v*`` arguments."""
    return (*k_cache.stride()[:3], *v_cache.stride()[:3])


def per_token_args(g: Geometry, out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
                   scale: float, softcap: float, sliding_window: int | None) -> tuple:
    """The run-time arguments of the kernels that write ``out`` row by row (naive, Q-block,
    and the Hopper Q-block kernels): tensors, sizes, the base-2 scale, then the strides."""
    return (out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
            g.num_seqs, base2_scale(scale), softcap, sliding_window or 0,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            *cache_strides(k_cache, v_cache), block_table.stride(0))


def base2_scale(scale: float) -> float:
    """The softmax scale folded with log2(e): scores come out in base 2, for exp2."""
    return scale * config.LOG2E


def launch_or_compile(kernel, grid, compile_only: bool, *args, **kwargs) -> None:
    """Launch ``kernel`` on ``grid``; with ``compile_only``, only compile (into Triton's
    cache) the binary this launch would run and launch nothing, which is safe during
    CUDA-graph capture. See `api.precompile`."""
    if compile_only:
        kernel.warmup(*args, grid=grid, **kwargs)
    else:
        kernel[grid](*args, **kwargs)


@triton.jit
def find_seq_idx(cu_seqlens_q_ptr, target, num_seqs, BLOCK_Q: tl.constexpr, Q_BLOCK_MODE: tl.constexpr):
    """Binary search for the sequence that owns ``target``.

    Token mode (``Q_BLOCK_MODE=False``): ``target`` is a token row; returns the largest ``s``
    with ``cu_seqlens_q[s] <= target``.
    Q-block mode: ``target`` is a global Q-block index; sequence ``s`` owns the Q-blocks
    starting at ``cu_seqlens_q[s] // BLOCK_Q + s``. That start is an upper bound on the
    Q-blocks of all earlier sequences, so the grid needs only ``num_tokens // BLOCK_Q +
    num_seqs`` Q-blocks and no prefix-sum tensor has to be built on the host.
    """
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(cu_seqlens_q_ptr + mid)
        if Q_BLOCK_MODE:
            start = start // BLOCK_Q + mid
        if start <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def apply_softcap(s, softcap):
    """``softcap * tanh(s / softcap)`` with tanh written through exp (portable)."""
    x = s / softcap
    e = tl.exp(2.0 * x)
    return softcap * (1.0 - 2.0 / (e + 1.0))


@triton.jit
def kv_tile_slots(block_table_row_ptr, pos_k, seq_len, BLOCK_SIZE: tl.constexpr):
    """(page, slot in page) of the KV-cache rows holding token positions ``pos_k``, int64.

    A position maps to page ``pos_k // BLOCK_SIZE`` of the sequence's block table and slot
    ``pos_k % BLOCK_SIZE`` inside it, so the tile size is free of the page size (sec. 4.6),
    and pages need not be powers of two. Positions past ``seq_len`` read page 0 (masked later).
    """
    page = tl.load(block_table_row_ptr + pos_k // BLOCK_SIZE, mask=pos_k < seq_len, other=0)
    return page.to(tl.int64), (pos_k % BLOCK_SIZE).to(tl.int64)


@triton.jit
def attend_tiles(
    acc, m_i, l_i, q, pos_q, tile_lo, tile_hi,
    k_ptr, v_ptr, bt_row, seq_len, kv_head,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    qk_scale, softcap, sliding_window,
    HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr, MASKED: tl.constexpr,
):
    """Tiled (online) softmax of a Q-block over KV tiles ``tile_lo .. tile_hi - 1``.

    ``q [M, D]`` against each tile's ``K^T [D, T]`` and ``V [T, D]``, gathered through the
    block table. Scores are kept in base 2 (``qk_scale`` includes log2(e)); ``m_i`` is the
    running row max, ``l_i`` the running sum of exponentials, ``acc`` the unnormalized
    output. ``MASKED=False`` is for tiles every row sees in full (below the causal
    diagonal, inside the sequence and every row's window: `tile_ranges`): no mask is built
    at all, which is most of a prefill. With masks, a row that has seen no visible key
    keeps ``m_i = -inf, l_i = 0, acc = 0``: the sentinel the segment reductions rely on.
    """
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    offs_t = tl.arange(0, TILE_SIZE)
    for tile in range(tile_lo, tile_hi):
        pos_k = tile * TILE_SIZE + offs_t
        page, slot = kv_tile_slots(bt_row, pos_k, seq_len, BLOCK_SIZE)
        k_ptrs = k_ptr + kv_head * stride_kh + (page * stride_kb + slot * stride_ks)[None, :] + offs_d[:, None]
        v_ptrs = v_ptr + kv_head * stride_vh + (page * stride_vb + slot * stride_vs)[:, None] + offs_d[None, :]
        if MASKED:
            in_seq = pos_k < seq_len
            k_t = tl.load(k_ptrs, mask=in_seq[None, :] & d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=in_seq[:, None] & d_mask[None, :], other=0.0)
        else:
            k_t = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)

        s = tl.dot(q, k_t)
        if MASKED or USE_SOFTCAP:
            if USE_SOFTCAP:
                # softcap acts on natural-scale scores: scale, squash, then move to base 2
                s = apply_softcap(s * (qk_scale / LOG2E), softcap) * LOG2E
            else:
                s = s * qk_scale
            if MASKED:
                # causal (with context offset) and sliding-window visibility
                visible = pos_k[None, :] <= pos_q[:, None]
                if USE_WINDOW:
                    visible = visible & (pos_k[None, :] > pos_q[:, None] - sliding_window)
                s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
        else:
            # every key visible: the max is finite and the scale (> 0) commutes with it, so
            # scaling and subtracting the max is one FMA per score (the softmax's hot path)
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
            m_safe = m_new
            p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def tile_ranges(context_len, q_block_local, max_pos, sliding_window,
                BLOCK_Q: tl.constexpr, TILE_SIZE: tl.constexpr, USE_WINDOW: tl.constexpr):
    """(first tile, first unmasked tile, first masked tile, end tile) of a Q-block's KV range.

    Keys up to the Q-block's first position are visible to every row, so whole tiles of
    them need no mask; the tiles after that reach the causal diagonal. With a sliding
    window the range starts at the first row's window; its leading tiles, up to the first
    one inside the last row's window, are cut by the window for some rows and masked too.
    Without one, the first unmasked tile is the first tile.
    """
    first_pos = context_len + q_block_local * BLOCK_Q
    end_tile = max_pos // TILE_SIZE + 1
    first_masked = (first_pos + 1) // TILE_SIZE
    if USE_WINDOW:
        first_tile = tl.maximum(first_pos - sliding_window + 1, 0) // TILE_SIZE
        first_unmasked = tl.cdiv(tl.maximum(max_pos - sliding_window + 1, 0), TILE_SIZE)
    else:
        first_tile = 0
        first_unmasked = 0
    return first_tile, first_unmasked, first_masked, end_tile


@triton.jit
def qblock_rows(
    q_block_local, query_len, context_len, kv_head,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, QPK: tl.constexpr,
):
    """Map the ``BLOCK_M`` rows of a Q-block to (token in sequence, query head, valid, pos).

    Row ``m`` holds token ``m // QPK`` of the block and query head ``m % QPK`` of the KV
    head's group (all query heads of a KV head are packed together, sec. 4.4). Rows past
    ``BLOCK_Q * QPK`` (when QPK does not divide BLOCK_M) and past the query are invalid.
    """
    offs_m = tl.arange(0, BLOCK_M)
    tok = q_block_local * BLOCK_Q + offs_m // QPK
    head = kv_head * QPK + offs_m % QPK
    valid = (offs_m < BLOCK_Q * QPK) & (tok < query_len)
    pos = context_len + tok
    return tok, head, valid, pos


@triton.jit
def locate_qblock(cu_seqlens_q_ptr, seq_lens_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """(sequence, its first query row, query length, Q-block index within it, sequence length).

    The Q-block has rows only if ``q_block_local * BLOCK_Q < query_len``: surplus indices of
    the upper-bound grid and padding sequences have none.
    """
    seq = find_seq_idx(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q, True)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    q_block_local = q_block - (q_start // BLOCK_Q + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    return seq, q_start, query_len, q_block_local, seq_len


@triton.jit
def segment_tiles(context_len, query_len, q_block_local, sliding_window, segment, num_segments, min_segment_tiles,
                  BLOCK_Q: tl.constexpr, TILE_SIZE: tl.constexpr, USE_WINDOW: tl.constexpr):
    """(first tile, end tile, first unmasked tile, first masked tile) of segment ``segment``
    of a Q-block's KV tiles (`tile_ranges`), computed from the lengths alone (no load).

    The range is cut into ``num_segments`` equal parts, each of at least
    ``min_segment_tiles`` tiles: a range shorter than ``num_segments x min_segment_tiles``
    fills its first segments and leaves the rest empty (first tile >= end tile).
    """
    # the Q-block's last query token (the caller has checked that it has one)
    max_pos = context_len + tl.minimum(query_len, (q_block_local + 1) * BLOCK_Q) - 1
    first_tile, first_unmasked, first_masked, end_tile = tile_ranges(context_len, q_block_local, max_pos,
                                                                     sliding_window, BLOCK_Q, TILE_SIZE, USE_WINDOW)
    tiles_per_segment = tl.maximum(tl.cdiv(end_tile - first_tile, num_segments), min_segment_tiles)
    seg_first = first_tile + segment * tiles_per_segment
    seg_end = tl.minimum(seg_first + tiles_per_segment, end_tile)
    return seg_first, seg_end, first_unmasked, first_masked


@triton.jit
def attend_qblock(
    q_ptr, k_ptr, v_ptr, block_table_ptr,
    seq, q_start, query_len, q_block_local, seq_len, kv_head, seg_first, seg_end, first_unmasked, first_masked,
    qk_scale, softcap, sliding_window,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    QPK: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr, WINDOW_EDGE_LOOP: tl.constexpr,
):
    """Load one Q-block and run the tiled softmax over KV tiles ``[seg_first, seg_end)``, a
    segment of its range or all of it, with the range's first unmasked and first masked
    tiles (`segment_tiles`, which the caller computes: it may need the range first).

    ``WINDOW_EDGE_LOOP``: with a sliding window, mask only the tiles the window cuts and
    the diagonal ones, in loops of their own, and run the tiles inside every row's window
    mask-free (on the H100, 0.87-0.98x the time of masking all on Gemma-2's windowed cases,
    one program over a Q-block's whole range); False masks every tile in one loop, which the
    split-KV step keeps: its segments of a few tiles each took 1.12-1.25x as long split into
    three loops (the H100's held-out grid before and after: docs/perf/kernels-h100.md).

    Returns the unnormalized ``acc``, the row max ``m_i`` and sum ``l_i``, and where the
    rows go: (token in sequence, query head, valid).
    """
    context_len = seq_len - query_len
    # BLOCK_Q tokens x QPK heads of one KV head, flattened to BLOCK_M rows
    tok, head, row_valid, pos_q = qblock_rows(q_block_local, query_len, context_len, kv_head, BLOCK_M, BLOCK_Q, QPK)
    offs_d = tl.arange(0, HEAD_PAD)
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :],
                mask=row_valid[:, None] & (offs_d < HEAD_SIZE)[None, :], other=0.0)

    # the tiles the window cuts (with one), the mask-free tiles, then the ones that reach
    # the diagonal (the online softmax takes tiles in any order)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    bt_row = block_table_ptr + tl.cast(seq, tl.int64) * stride_bt
    if USE_WINDOW:
        if WINDOW_EDGE_LOOP:
            acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, pos_q, seg_first, tl.minimum(seg_end, first_unmasked),
                                         k_ptr, v_ptr, bt_row, seq_len, kv_head,
                                         stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                         qk_scale, softcap, sliding_window, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE,
                                         TILE_SIZE, USE_SOFTCAP, USE_WINDOW, True)
            seg_first = tl.maximum(seg_first, first_unmasked)
        else:  # every tile masked, in the last loop
            first_masked = 0
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, pos_q, seg_first, tl.minimum(seg_end, first_masked),
                                 k_ptr, v_ptr, bt_row, seq_len, kv_head,
                                 stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                 qk_scale, softcap, sliding_window, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE,
                                 TILE_SIZE, USE_SOFTCAP, USE_WINDOW, False)
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, pos_q, tl.maximum(seg_first, first_masked), seg_end,
                                 k_ptr, v_ptr, bt_row, seq_len, kv_head,
                                 stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                 qk_scale, softcap, sliding_window, HEAD_SIZE, HEAD_PAD, BLOCK_SIZE,
                                 TILE_SIZE, USE_SOFTCAP, USE_WINDOW, True)
    return acc, m_i, l_i, tok, head, row_valid


@triton.jit
def store_rows(out_ptr, acc, l_i, q_start, tok, head, row_valid, stride_ot, stride_oh,
               HEAD_SIZE: tl.constexpr, HEAD_PAD: tl.constexpr):
    """Normalize ``acc`` by ``l_i`` and store the valid rows of a Q-block."""
    offs_d = tl.arange(0, HEAD_PAD)
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_valid[:, None] & (offs_d < HEAD_SIZE)[None, :])
