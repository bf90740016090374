"""`PagedBatch`: a ragged batch in vLLM's paged KV-cache layout, with its roofline counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..config import BatchShape
from .reference import paged_attention_reference


@dataclass(frozen=True)
class SeqSpec:
    """One sequence of a batch: ``query_len`` new tokens after ``context_len`` cached ones."""

    query_len: int
    context_len: int

    @property
    def seq_len(self) -> int:
        return self.query_len + self.context_len


@dataclass
class PagedBatch:
    """A batch of sequences with random Q and a randomly scattered, paged KV cache.

    Layout (vLLM V1):
      q             ``[num_tokens, num_q_heads, head_size]``
      k_cache/v_cache ``[num_blocks, block_size, num_kv_heads, head_size]``
      block_table   ``[num_seqs, max_blocks_per_seq] int32`` (unused entries point at block 0)
      cu_seqlens_q  ``[num_seqs + 1] int32``, prefix sums of query lengths
      seq_lens      ``[num_seqs] int32``, context + query length of each sequence
    Every sequence's pages are drawn at random from a pool with ``spare_blocks`` extra pages,
    so no kernel can pass by assuming contiguous pages.
    """

    seqs: list[SeqSpec]
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    device: torch.device
    sliding_window: int | None = None
    softcap: float = 0.0
    q: torch.Tensor = field(init=False, repr=False)
    k_cache: torch.Tensor = field(init=False, repr=False)
    v_cache: torch.Tensor = field(init=False, repr=False)
    block_table: torch.Tensor = field(init=False, repr=False)
    cu_seqlens_q: torch.Tensor = field(init=False, repr=False)
    seq_lens: torch.Tensor = field(init=False, repr=False)

    @classmethod
    def build(
        cls,
        seqs: Sequence[tuple[int, int]] | Sequence[SeqSpec],
        *,
        num_q_heads: int = 32,
        num_kv_heads: int = 8,
        head_size: int = 128,
        block_size: int = 16,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cuda",
        sliding_window: int | None = None,
        softcap: float = 0.0,
        spare_blocks: int = 7,
        seed: int | None = None,
    ) -> "PagedBatch":
        """Build a batch from ``(query_len, context_len)`` pairs with fresh random data."""
        specs = [s if isinstance(s, SeqSpec) else SeqSpec(*s) for s in seqs]
        if not specs:
            raise ValueError("seqs: expected at least one (query_len, context_len) pair")
        for i, s in enumerate(specs):
            if s.query_len < 0 or s.context_len < 0:
                raise ValueError(f"seqs[{i}]: lengths must be >= 0, got {s}")
        batch = cls(
            specs, num_q_heads, num_kv_heads, head_size, block_size, dtype,
            torch.device(device), sliding_window, softcap,
        )
        batch._materialize(spare_blocks, seed)
        return batch

    def _materialize(self, spare_blocks: int, seed: int | None) -> None:
        gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
        blocks_per_seq = [-(-s.seq_len // self.block_size) for s in self.seqs]
        num_blocks = sum(blocks_per_seq) + spare_blocks
        max_blocks = max(1, max(blocks_per_seq))
        perm = torch.randperm(num_blocks, generator=gen)
        table = torch.zeros(len(self.seqs), max_blocks, dtype=torch.int32)
        used = 0
        for i, n in enumerate(blocks_per_seq):
            table[i, :n] = perm[used : used + n]
            used += n
        num_tokens = sum(s.query_len for s in self.seqs)

        def randn(*shape):
            return torch.randn(*shape, generator=gen).to(self.dtype).to(self.device)

        self.q = randn(num_tokens, self.num_q_heads, self.head_size)
        kv_shape = (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        self.k_cache = randn(*kv_shape)
        self.v_cache = randn(*kv_shape)
        self.block_table = table.to(self.device)
        cu = [0]
        for s in self.seqs:
            cu.append(cu[-1] + s.query_len)
        self.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=self.device)
        self.seq_lens = torch.tensor(
            [s.seq_len for s in self.seqs], dtype=torch.int32, device=self.device
        )

    # ----------------------------------------------------------------- shape facts
    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def max_seqlen_q(self) -> int:
        return max(s.query_len for s in self.seqs)

    @property
    def max_seqlen_k(self) -> int:
        return max(s.seq_len for s in self.seqs)

    @property
    def decode_share(self) -> float:
        """Fraction of sequences that are plain decodes (query_len == 1)."""
        return sum(s.query_len == 1 for s in self.seqs) / self.num_seqs

    @property
    def shape(self) -> BatchShape:
        """The facts the heuristics choose a kernel config from (within the batch's window,
        as `paged_attention` sees them: `BatchShape.in_window`)."""
        return BatchShape(self.num_seqs, self.num_tokens, self.max_seqlen_q, self.max_seqlen_k,
                          self.num_q_heads, self.num_kv_heads, self.head_size,
                          self.sum_seqlen_k).in_window(self.sliding_window)

    @property
    def sum_seqlen_k(self) -> int:
        """Keys summed over the batch's sequences (the CSV's ``sum_seq_lens``)."""
        return sum(s.seq_len for s in self.seqs)

    def attention_kwargs(self) -> dict:
        """Keyword arguments for `attnbench.kernels.paged_attention` (and the reference)."""
        return dict(
            q=self.q, k_cache=self.k_cache, v_cache=self.v_cache,
            block_table=self.block_table, cu_seqlens_q=self.cu_seqlens_q,
            seq_lens=self.seq_lens, max_seqlen_q=self.max_seqlen_q,
            max_seqlen_k=self.max_seqlen_k, sum_seqlen_k=self.sum_seqlen_k, sliding_window=self.sliding_window,
            softcap=self.softcap,
        )

    def reference(self) -> torch.Tensor:
        """fp32 output of `paged_attention_reference` for this batch."""
        return paged_attention_reference(
            self.q, self.k_cache, self.v_cache, self.block_table, self.cu_seqlens_q,
            self.seq_lens, sliding_window=self.sliding_window, softcap=self.softcap,
        )

    # ----------------------------------------------------------------- roofline
    def _visible_keys(self, s: SeqSpec) -> tuple[int, int]:
        """(keys any row of ``s`` must read, sum over rows of keys each row attends to)."""
        w = self.sliding_window
        first_pos = s.context_len  # absolute position of the first query row
        if w is None:
            needed = s.seq_len
            pairs = sum(first_pos + i + 1 for i in range(s.query_len))
        else:
            needed = s.seq_len - max(0, first_pos - w + 1)
            pairs = sum(min(first_pos + i + 1, w) for i in range(s.query_len))
        return (needed if s.query_len else 0), pairs

    def bytes_moved(self) -> int:
        """Fewest bytes any kernel must move through device memory.

        Q read once, output written once (same dtype), and each KV head's visible K and V
        rows read once per sequence; block-table and length metadata are counted too.
        """
        elt = self.q.element_size()
        qo = 2 * self.num_tokens * self.num_q_heads * self.head_size * elt
        kv_tokens = sum(self._visible_keys(s)[0] for s in self.seqs)
        kv = 2 * kv_tokens * self.num_kv_heads * self.head_size * elt
        meta = sum(-(-s.seq_len // self.block_size) for s in self.seqs) * 4 + 8 * self.num_seqs
        return qo + kv + meta

    def flops(self) -> int:
        """Useful FLOPs: 2*D for QK^T plus 2*D for PV, per (query row, head, visible key)."""
        pairs = sum(self._visible_keys(s)[1] for s in self.seqs)
        return 4 * self.head_size * self.num_q_heads * pairs

    def roofline_floor_s(self, bandwidth_bytes_s: float, flops_s: float) -> float:
        """Lower bound on kernel time: max(bytes / bandwidth, FLOPs / matmul rate), seconds."""
        return max(self.bytes_moved() / bandwidth_bytes_s, self.flops() / flops_s)


class StaticBatchBuffers:
    """Fixed-address metadata and Q/KV buffers for any batch up to a capacity.

    What a CUDA/HIP graph needs: the kernels see the same pointers and the same scalar
    arguments on every replay, and a smaller batch is loaded by copying its data in place.
    Sequences past the batch are padding with zero query and sequence length; token rows
    past the batch are never read.
    """

    def __init__(self, *, max_seqs: int, max_tokens: int, max_blocks_per_seq: int,
                 num_blocks: int, like: PagedBatch):
        dev, dt = like.device, like.dtype
        self.q = torch.zeros(max_tokens, like.num_q_heads, like.head_size, dtype=dt, device=dev)
        self.out = torch.zeros_like(self.q)
        kv_shape = (num_blocks, like.block_size, like.num_kv_heads, like.head_size)
        self.k_cache = torch.zeros(kv_shape, dtype=dt, device=dev)
        self.v_cache = torch.zeros(kv_shape, dtype=dt, device=dev)
        self.block_table = torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.zeros(max_seqs + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int32, device=dev)

    def load(self, batch: PagedBatch) -> None:
        """Copy ``batch`` into the buffers (in place) and pad the remaining sequences."""
        s, t = batch.num_seqs, batch.num_tokens
        nb, mb = batch.k_cache.shape[0], batch.block_table.shape[1]
        if s > self.seq_lens.shape[0] or t > self.q.shape[0] or nb > self.k_cache.shape[0] \
                or mb > self.block_table.shape[1]:
            raise ValueError(f"batch: exceeds the buffers' capacity ({s} seqs, {t} tokens, "
                             f"{nb} blocks, {mb} blocks/seq)")
        self.q[:t].copy_(batch.q)
        self.k_cache[:nb].copy_(batch.k_cache)
        self.v_cache[:nb].copy_(batch.v_cache)
        self.block_table.zero_()
        self.block_table[:s, :mb].copy_(batch.block_table)
        self.cu_seqlens_q[: s + 1].copy_(batch.cu_seqlens_q)
        self.cu_seqlens_q[s + 1 :].fill_(t)
        self.seq_lens.zero_()
        self.seq_lens[:s].copy_(batch.seq_lens)

    def attention_kwargs(self, *, max_seqlen_q: int, max_seqlen_k: int) -> dict:
        return dict(q=self.q, k_cache=self.k_cache, v_cache=self.v_cache,
                    block_table=self.block_table, cu_seqlens_q=self.cu_seqlens_q,
                    seq_lens=self.seq_lens, out=self.out,
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
