"""Triton building blocks shared by the kernels: sequence lookup, masking, one softmax tile.

Every kernel in this package computes the same function (see `reference.py`); these
helpers are the pieces that do not change from one step of the paper to the next.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


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
def kv_tile_offsets(
    block_table_row_ptr,
    offs_t,
    seq_len,
    stride_block,
    stride_slot,
    BLOCK_SIZE: tl.constexpr,
):
    """Element offsets of the KV-cache rows holding token positions ``offs_t``.

    A position maps to page ``offs_t // BLOCK_SIZE`` of the sequence's block table and slot
    ``offs_t % BLOCK_SIZE`` inside it, so the tile size is free of the page size (sec. 4.6),
    and pages need not be powers of two. Positions past ``seq_len`` read page 0 (masked later).
    """
    in_seq = offs_t < seq_len
    page = tl.load(block_table_row_ptr + offs_t // BLOCK_SIZE, mask=in_seq, other=0)
    return page.to(tl.int64) * stride_block + (offs_t % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def attend_tile(
    acc, m_i, l_i, q, k_t, v, visible,
    qk_scale, softcap,
    USE_SOFTCAP: tl.constexpr,
):
    """One step of the tiled (online) softmax for a Q-block against one KV tile.

    ``q [M, D]``, ``k_t [D, T]``, ``v [T, D]``; ``visible [M, T]`` masks causal / window /
    padding positions. Scores are kept in base 2 (``qk_scale`` includes log2(e)); ``m_i`` is
    the running row max, ``l_i`` the running sum of exponentials, ``acc`` the unnormalized
    output. A row that has seen no visible key keeps ``m_i = -inf, l_i = 0, acc = 0``, the
    sentinel the segment reductions rely on.
    """
    s = tl.dot(q, k_t)
    if USE_SOFTCAP:
        # softcap acts on natural-scale scores: scale, squash, then move to base 2
        s = apply_softcap(s * (qk_scale / 1.4426950408889634), softcap) * 1.4426950408889634
    else:
        s = s * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


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
