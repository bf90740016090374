"""fp32 PyTorch paged attention: the oracle for every kernel test and benchmark.

Semantics (shared by every kernel in this package, and by vLLM's Triton backend):

* The batch is ragged. Sequence ``s`` has ``query_len = cu_seqlens_q[s+1] - cu_seqlens_q[s]``
  new tokens (rows of ``q``) and ``seq_len = seq_lens[s]`` tokens in total in the KV cache,
  so its context (tokens cached before this step) is ``seq_len - query_len``.
* Query row ``i`` of sequence ``s`` sits at absolute position ``pos_q = context_len + i`` and
  attends causally to keys at positions ``0 .. pos_q``.
* ``sliding_window = W`` keeps only the ``W`` most recent keys, the query's own included:
  key ``j`` is visible iff ``pos_q - W < j <= pos_q``.
* ``softcap = c > 0`` squashes the scaled scores: ``s = c * tanh(s / c)`` (Gemma-2 style),
  applied after ``scale`` and before the softmax.
* Query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)`` (GQA; MQA when there
  is one KV head).
"""

from __future__ import annotations

import torch

# How close a kernel's output must be to the fp32 reference, per output dtype: elementwise
# |out - ref| <= atol + rtol * |ref|. rtol is one unit in the last place of the dtype (the
# output itself is rounded to it), atol covers the low-precision P @ V product. Tight enough
# that an off-by-one mask or a dropped tile fails (tests/test_kernels_correctness.py).
TOLERANCES = {  # dtype: (atol, rtol)
    torch.float16: (2e-3, 2**-10),
    torch.bfloat16: (1.6e-2, 2**-7),
}


def within_tolerance(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> tuple[float, bool]:
    """(max |out - ref|, whether every element is within `TOLERANCES`); NaN fails."""
    out, ref = out.float(), ref.float().to(out.device)
    if not torch.isfinite(out).all():
        return float("nan"), False
    atol, rtol = TOLERANCES[dtype]
    err = (out - ref).abs()
    return err.max().item(), bool((err <= atol + rtol * ref.abs()).all())


def gather_kv(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """Return the first ``seq_len`` tokens of one sequence as ``[seq_len, kv_heads, head]``.

    ``cache`` is ``[num_blocks, block_size, kv_heads, head]``; ``block_table_row`` lists the
    sequence's physical blocks in logical order.
    """
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    pages = cache[block_table_row[:num_blocks].long()]  # [n, block_size, kv_heads, head]
    return pages.reshape(-1, *cache.shape[2:])[:seq_len]


def attention_mask(
    query_len: int, seq_len: int, sliding_window: int | None, device=None
) -> torch.Tensor:
    """Boolean ``[query_len, seq_len]`` mask, True where a query row may see a key."""
    context_len = seq_len - query_len
    pos_q = torch.arange(query_len, device=device)[:, None] + context_len
    pos_k = torch.arange(seq_len, device=device)[None, :]
    mask = pos_k <= pos_q
    if sliding_window is not None:
        mask &= pos_k > pos_q - sliding_window
    return mask


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    softcap: float = 0.0,
    rows_per_chunk: int = 1024,
) -> torch.Tensor:
    """Paged attention in fp32, one sequence (and ``rows_per_chunk`` query rows) at a time.

    Shapes follow vLLM: ``q [num_tokens, num_q_heads, head]``,
    ``k_cache/v_cache [num_blocks, block_size, num_kv_heads, head]``,
    ``block_table [num_seqs, max_blocks]``, ``cu_seqlens_q [num_seqs + 1]``,
    ``seq_lens [num_seqs]``. Returns fp32 ``[num_tokens, num_q_heads, head]``.
    """
    num_q_heads, head_size = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_size**-0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for s in range(len(lens)):
        start, end = cu[s], cu[s + 1]
        query_len, seq_len = end - start, lens[s]
        if query_len == 0:
            continue
        k = gather_kv(k_cache, block_table[s], seq_len).float()
        v = gather_kv(v_cache, block_table[s], seq_len).float()
        k = k.repeat_interleave(group, dim=1)  # [seq_len, num_q_heads, head]
        v = v.repeat_interleave(group, dim=1)
        mask = attention_mask(query_len, seq_len, sliding_window, device=q.device)
        for lo in range(0, query_len, rows_per_chunk):
            hi = min(lo + rows_per_chunk, query_len)
            qs = q[start + lo : start + hi].float()
            scores = torch.einsum("qhd,khd->hqk", qs, k) * scale
            if softcap > 0:
                scores = softcap * torch.tanh(scores / softcap)
            scores = scores.masked_fill(~mask[lo:hi], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[start + lo : start + hi] = torch.einsum("hqk,khd->qhd", probs, v)
    return out
