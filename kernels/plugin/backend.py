"""attnbench's paged-attention kernels as a vLLM attention backend (vLLM 0.26 and later).

Serve with ``--attention-backend CUSTOM`` (recipe: ``attention_backend: CUSTOM``) once the
plugin in `register` has registered this class; ``ATTNBENCH_VARIANT`` (recipe:
``kernel_variant``) picks the kernel that runs: ``auto`` (default, the heuristics), a step
of the paper (``naive``, ``qblock``, ``parallel_tiled``, ``static_grid``) or, on Hopper,
``qblock_ws``. End-to-end runs can then compare the paper's
steps under the same server, scheduler and load.

Everything around the attention itself is vLLM's Triton backend, inherited unchanged: the
KV-cache layout (logical ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``, K then
V in the last dimension, stored block-major), the metadata builder, and the cache write
(``do_kv_cache_update``, run by vLLM before ``forward``). ``forward`` takes K and V as
strided views ``[num_blocks, block_size, num_kv_heads, head_size]`` of that cache, which
is the layout `paged_attention` reads, and calls it.

What the kernels do not implement is refused where vLLM chooses a backend (`validate_configuration`
reads the ``supports_*`` answers below) or, for what reaches the layer anyway, when the
layer is built: FP8 KV cache, ALiBi, attention sinks, non-causal and encoder attention,
chunked-local lookback, multimodal prefix ranges, batch invariance.

CUDA graphs: the launch grids depend only on the token and sequence counts, which a
captured graph fixes, so full graphs are declared for uniform batches (decode, and spec
decode with a fixed query length); mixed batches run piecewise, attention eager. The
kernel configuration (``auto``) is chosen when a graph is captured and replayed as is, so
there the builder gives no sum of keys and ``auto`` picks what holds for any lengths up
to max_model_len (vLLM captures with that as max_seq_len); eager steps give the sum.

No compilation while serving: the first forward with real metadata (vLLM's warm-up and
graph capture, before the server answers ``/health``) compiles every binary the variant
can pick for batches within the server's limits (`api.precompile`), so vLLM's JIT monitor
("Triton kernel JIT compilation during inference") stays silent.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import ClassVar

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)

from ..config import GLUON_QBLOCK
from ..dispatch.api import MAX_HEAD_SIZE, MIN_HEAD_SIZE, paged_attention, precompile
from ..hopper import host as hopper
from ..schema import VARIANT_ENV, VLLM_BACKEND_NAME
from ..variants import AUTO, check_variant

# under vLLM's logger namespace, so that vLLM's log configuration prints our messages
logger = init_logger(f"vllm.{__name__}")


def variant_from_env() -> str:
    """The kernel variant named by ``ATTNBENCH_VARIANT`` ("auto" when unset); the runner
    sets it from the recipe's ``serve.kernel_variant``."""
    return check_variant(os.environ.get(VARIANT_ENV, AUTO).strip() or AUTO, VARIANT_ENV)


# Limits assumed when the server's own are not known (a layer built outside vLLM's config)
_FALLBACK_LIMITS = (1024, 16384, 131072)
# layouts already compiled in this process: every layer of a model shares one
_PRECOMPILED: set[tuple] = set()


def server_limits() -> tuple[int, int, int]:
    """(max_num_seqs, max_num_batched_tokens, max_model_len) of the vLLM server being built."""
    from vllm.config import get_current_vllm_config_or_none  # lazy: as the plugin's other vLLM imports

    config = get_current_vllm_config_or_none()
    if config is None or config.model_config is None:
        return _FALLBACK_LIMITS
    sched = config.scheduler_config
    return sched.max_num_seqs, sched.max_num_batched_tokens, config.model_config.max_model_len


def summed_seq_lens(lens: torch.Tensor | None, max_seq_len: int, num_seqs: int) -> int | None:
    """The keys of a batch from vLLM's host copy of its lengths (None where vLLM gives
    none), held within what `paged_attention` accepts (``max_seq_len`` to ``num_seqs x
    max_seq_len``) whatever the slack of vLLM's bound and padding."""
    if lens is None or max_seq_len < 1 or num_seqs < 1:
        return None
    return min(max(int(lens.sum()), max_seq_len), max_seq_len * num_seqs)


@dataclasses.dataclass
class AttnbenchMetadata(TritonAttentionMetadata):
    """vLLM's Triton metadata and the batch's keys, summed on the host."""

    # keys summed over the batch's sequences, from vLLM's host copy of the lengths (an upper
    # bound under async speculative decoding); None in a captured graph, which replays for
    # any lengths up to max_seq_len (`paged_attention`'s ``sum_seqlen_k``)
    sum_seq_len: int | None = None


class AttnbenchMetadataBuilder(TritonAttentionMetadataBuilder):
    """vLLM's Triton metadata, with full CUDA graphs only for uniform batches (module doc),
    and the batch's keys summed, so that ``auto`` sees a ragged batch."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AttnbenchMetadata:
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        lens = getattr(common_attn_metadata, "seq_lens_cpu_upper_bound", None)
        fields = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata) if f.init}
        return AttnbenchMetadata(**fields,
                                 sum_seq_len=summed_seq_lens(lens, metadata.max_seq_len, metadata.seq_lens.shape[0]))

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> AttnbenchMetadata:
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        metadata.sum_seq_len = None  # the graph replays for any lengths: the config must hold for all
        return metadata


class AttnbenchImpl(TritonAttentionImpl):
    """vLLM's Triton attention layer with `paged_attention` as its kernel."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant_from_env()
        refused = {
            "an FP8 KV cache (--kv-cache-dtype auto, float16 or bfloat16)":
                self.kv_cache_dtype not in ("auto", "float16", "bfloat16"),
            "ALiBi": self.alibi_slopes is not None,
            "attention sinks": self.sinks is not None,
            f"attention type {self.attn_type} (decoder only)": self.attn_type != AttentionType.DECODER,
            "chunked-local lookback": getattr(self, "chunk_lookback", -1) > -1,
        }
        for what, present in refused.items():
            if present:
                raise NotImplementedError(f"attnbench backend (CUSTOM): {what} is not supported")
        self.supports_quant_query_input = False  # the query stays in the model's dtype
        left, _ = self.sliding_window  # vLLM's (window - 1, 0), or (-1, -1) for none
        self.window = None if left < 0 else left + 1
        self.limits = server_limits()
        self.precompiled = False
        self._kv_views: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _precompile(self, query, key_cache, value_cache, attn_metadata, out) -> None:
        """Compile all binaries of the variant once per process and cache layout (module doc).
        Skipped while a CUDA graph is being captured; vLLM runs each shape eagerly first."""
        if query.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        self.precompiled = True
        layout = (self.variant, query.dtype, query.device, query.stride(), key_cache.stride(),
                  value_cache.stride(), tuple(key_cache.shape[1:]), attn_metadata.block_table.stride(),
                  self.window, self.logits_soft_cap)
        if layout in _PRECOMPILED:
            return
        start = time.perf_counter()
        max_num_seqs, max_tokens, max_model_len = self.limits
        compiled = precompile(
            query, key_cache, value_cache, attn_metadata.block_table, attn_metadata.query_start_loc,
            attn_metadata.seq_lens, out, variant=self.variant, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_tokens, max_model_len=max_model_len, scale=self.scale,
            sliding_window=self.window, softcap=self.logits_soft_cap)
        _PRECOMPILED.add(layout)
        logger.info("attnbench (CUSTOM, %s): compiled %d kernel configurations before serving in "
                    "%.1f s: %s", self.variant, len(compiled), time.perf_counter() - start,
                    "; ".join(str(c.as_dict()) for c in compiled))

    def _cache_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V as views [blocks, block_size, kv_heads, head] of the layer's cache
        [blocks, kv_heads, block_size, 2*head]. Made once per cache tensor: the layer gets
        the same one at every step, and the two view ops cost microseconds of host time
        per call, which eager (piecewise) attention pays 32 times per decode step."""
        if self._kv_views is None or self._kv_views[0] is not kv_cache:
            key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
            self._kv_views = (kv_cache, key_cache, value_cache)
        return self._kv_views[1], self._kv_views[2]

    def forward(self, layer: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: TritonAttentionMetadata,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``query`` [num_tokens, num_heads, head_size] over the paged cache
        (the new tokens' K/V are already in it) into ``output``; returns ``output``."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("attnbench backend (CUSTOM): fused output quantization is not supported")
        if attn_metadata is None:  # vLLM's profiling run
            return output.fill_(0)
        if attn_metadata.causal is not True or getattr(attn_metadata, "mm_prefix_range_tensor", None) is not None:
            raise NotImplementedError("attnbench backend (CUSTOM): only causal attention without "
                                      "multimodal prefix ranges is supported")
        n = attn_metadata.num_actual_tokens
        key_cache, value_cache = self._cache_views(kv_cache)
        out = output[:n].view(n, self.num_heads, self.head_size)
        if not self.precompiled:
            self._precompile(query[:n], key_cache, value_cache, attn_metadata, out)
        paged_attention(
            query[:n], key_cache, value_cache, attn_metadata.block_table,
            attn_metadata.query_start_loc, attn_metadata.seq_lens,
            max_seqlen_q=attn_metadata.max_query_len, max_seqlen_k=attn_metadata.max_seq_len,
            sum_seqlen_k=getattr(attn_metadata, "sum_seq_len", None),
            scale=self.scale, out=out, sliding_window=self.window, softcap=self.logits_soft_cap,
            variant=self.variant,  # the default call reads no tensor value: no sync, graph-safe
        )
        return output


class AttnbenchBackend(TritonAttentionBackend):
    """The ``CUSTOM`` attention backend: vLLM's Triton backend around attnbench's kernels."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        return VLLM_BACKEND_NAME  # vLLM maps the name back to its AttentionBackendEnum member

    @staticmethod
    def get_impl_cls() -> type[AttnbenchImpl]:
        return AttnbenchImpl

    @staticmethod
    def get_builder_cls() -> type[AttnbenchMetadataBuilder]:
        return AttnbenchMetadataBuilder

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        """Heads the kernels take; a server that names the Gluon kernel (``qblock_ws``) takes
        only its heads, refused where vLLM picks the backend rather than at the first batch."""
        if not (MIN_HEAD_SIZE <= head_size <= MAX_HEAD_SIZE and head_size % 8 == 0):
            return False
        return variant_from_env() != GLUON_QBLOCK or head_size in hopper.PIECEWISE_HEAD_SIZES

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    # What the kernels do not implement, answered where vLLM picks a backend. Batch
    # invariance: the segment split, hence the summation order, follows the batch.
    supports_non_causal = supports_sink = supports_mm_prefix = supports_alibi_sqrt = \
        supports_batch_invariance = supports_rswa = classmethod(lambda cls: False)
