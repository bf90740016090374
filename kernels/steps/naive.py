"""Step 1 of the paper (sec. 4.3, Listing 3): the baseline paged-attention kernel.

One program per (query token, query head). The program walks the sequence's KV cache one
page at a time (tile = KV block, as in the original PagedAttention), with the scores
computed as an element-wise product and a sum: a single query row is too small for the
matrix units. K and V are re-read by every query head of a GQA group and by every query
token of a prefill, which is what the next step fixes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..config import BatchShape, KernelConfig, Platform, Step, next_power_of_2
from .blocks import LOG2E, Geometry, apply_softcap, find_seq_idx, kv_tile_slots, launch_or_compile, per_token_args


@triton.jit(do_not_specialize=["num_seqs"])
def naive_attention_kernel(
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
    BLOCK_SIZE: tl.constexpr, BLOCK_SIZE_PAD: tl.constexpr,
    USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr,
):
    token = tl.program_id(0)
    q_head = tl.program_id(1)
    kv_head = q_head // QPK

    # which sequence this token belongs to, and its absolute position in it
    seq = find_seq_idx(cu_seqlens_q_ptr, token, num_seqs, 1, False)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    query_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    pos_q = seq_len - query_len + (token - q_start)

    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < HEAD_SIZE
    q = tl.load(q_ptr + token * stride_qt + q_head * stride_qh + offs_d, mask=d_mask, other=0.0)
    q = q.to(tl.float32)

    # walk the pages this token can see: all of them up to its own position, or the window
    first_page = 0
    if USE_WINDOW:
        first_page = tl.maximum(pos_q - sliding_window + 1, 0) // BLOCK_SIZE
    last_page = pos_q // BLOCK_SIZE + 1
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([HEAD_PAD], dtype=tl.float32)
    offs_s = tl.arange(0, BLOCK_SIZE_PAD)
    bt_row = block_table_ptr + tl.cast(seq, tl.int64) * stride_bt
    for page in range(first_page, last_page):
        pos_k = page * BLOCK_SIZE + offs_s
        visible = (offs_s < BLOCK_SIZE) & (pos_k <= pos_q)
        if USE_WINDOW:
            visible = visible & (pos_k > pos_q - sliding_window)
        page, slot = kv_tile_slots(bt_row, pos_k, seq_len, BLOCK_SIZE)
        kv_mask = visible[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + (page * stride_kb + slot * stride_ks)[:, None] + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + (page * stride_vb + slot * stride_vs)[:, None] + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)

        # scores of this page: q . k for each key, in base 2
        s = tl.sum(q[None, :] * k.to(tl.float32), axis=1)
        if USE_SOFTCAP:
            s = apply_softcap(s * (qk_scale / LOG2E), softcap) * LOG2E
        else:
            s = s * qk_scale
        s = tl.where(visible, s, float("-inf"))

        # online softmax update (every page holds at least one visible key)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp2(s - m_new)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m_i = m_new

    out = acc / l_i
    tl.store(out_ptr + token * stride_ot + q_head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
           scale: float, sliding_window: int | None, softcap: float,
           config: KernelConfig, compile_only: bool = False, **_unused) -> None:
    """Launch grid: one program per (query token, query head).

    For a decode-only batch this is (num_seqs, num_q_heads), the grid the paper found best
    for decode; for prefill it is (total query tokens, num_q_heads).
    """
    g = Geometry.of(q, k_cache, seq_lens)
    grid = (g.num_tokens, g.num_q_heads)
    launch_or_compile(
        naive_attention_kernel, grid, compile_only,
        *per_token_args(g, out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, softcap,
                        sliding_window),
        QPK=g.qpk, HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad,
        BLOCK_SIZE=g.block_size, BLOCK_SIZE_PAD=next_power_of_2(g.block_size),
        USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def default_config(shape: BatchShape, platform: Platform) -> KernelConfig:
    """One page per iteration (the tile is the page); nothing else to choose."""
    return KernelConfig("naive", tile_size=16, num_warps=4, num_stages=1)


STEP = Step("naive", "sec. 4.3, Listing 3", launch, default_config)
