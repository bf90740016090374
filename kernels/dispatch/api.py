"""`paged_attention`: the one entry point to every kernel variant, with input checks;
`precompile`: every binary a server may launch, compiled before it serves.

The default call reads no tensor value on the host: no sync, and safe inside CUDA-graph
capture. Checks of the metadata's values (every sequence against ``block_table`` and the
max lengths) are opt-in (``check_metadata=True``), for debugging and tests."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

import torch

from ..config import BatchShape, KernelConfig, Platform
from ..variants import AUTO, step
from .heuristics import choose_config, reachable_configs

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MIN_HEAD_SIZE, MAX_HEAD_SIZE = 16, 256


def _fail(arg: str, expected: str, got) -> None:
    raise ValueError(f"{arg}: expected {expected}, got {got}")


def _check_tensor(name: str, t, ndim: int, dtypes, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, "a torch.Tensor", type(t).__name__)
    if t.dim() != ndim:
        _fail(name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        _fail(name, f"dtype in {[str(d) for d in dtypes]}", t.dtype)
    if device is not None and t.device != device:
        _fail(name, f"a tensor on {device}", t.device)


def _check_lengths(max_seqlen_q: int, max_seqlen_k: int) -> None:
    if max_seqlen_q < 1 or max_seqlen_k < max_seqlen_q:
        _fail("max_seqlen_q/max_seqlen_k", "1 <= max_seqlen_q <= max_seqlen_k", (max_seqlen_q, max_seqlen_k))


def validate_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, out,
                    max_seqlen_q, max_seqlen_k, sliding_window, softcap,
                    check_metadata: bool) -> None:
    """Raise ValueError naming the argument and the expected form for any bad input.

    Shape, dtype and layout checks are free (host-side facts of the tensors). With
    ``check_metadata`` it also reads the metadata tensors on the host (one sync) to check
    every sequence's lengths against ``block_table`` and ``max_seqlen_*``: never inside a
    timed loop or a CUDA-graph capture.
    """
    _check_tensor("q", q, 3, SUPPORTED_DTYPES)
    dev = q.device
    _check_tensor("k_cache", k_cache, 4, (q.dtype,), dev)
    _check_tensor("v_cache", v_cache, 4, (q.dtype,), dev)
    if k_cache.shape != v_cache.shape:
        _fail("v_cache", f"the shape of k_cache {tuple(k_cache.shape)}", tuple(v_cache.shape))
    num_tokens, num_q_heads, head_size = q.shape
    _, block_size, num_kv_heads, kv_head_size = k_cache.shape
    if kv_head_size != head_size:
        _fail("k_cache", f"head size {head_size} (from q) in dim 3 of "
              "[num_blocks, block_size, num_kv_heads, head_size]", kv_head_size)
    if not (MIN_HEAD_SIZE <= head_size <= MAX_HEAD_SIZE and head_size % 8 == 0):
        _fail("q", f"a head size that is a multiple of 8 in [{MIN_HEAD_SIZE}, {MAX_HEAD_SIZE}]", head_size)
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        _fail("k_cache", f"a KV head count that divides the {num_q_heads} query heads of q", num_kv_heads)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            _fail(name, "a contiguous head dimension (stride 1 in the last dim)", f"strides {t.stride()}")
    _check_tensor("block_table", block_table, 2, (torch.int32,), dev)
    _check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,), dev)
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,), dev)
    num_seqs = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        _fail("cu_seqlens_q", f"{num_seqs + 1} entries (num_seqs + 1, from seq_lens)", cu_seqlens_q.shape[0])
    if block_table.shape[0] != num_seqs:
        _fail("block_table", f"{num_seqs} rows (one per sequence, from seq_lens)", block_table.shape[0])
    if out is not None:
        _check_tensor("out", out, 3, (q.dtype,), dev)
        if out.shape != q.shape:
            _fail("out", f"the shape of q {tuple(q.shape)}", tuple(out.shape))
        if out.stride(-1) != 1:
            _fail("out", "a contiguous head dimension", f"strides {out.stride()}")
    if sliding_window is not None and sliding_window < 1:
        _fail("sliding_window", "None or a window of >= 1 tokens", sliding_window)
    if softcap < 0:
        _fail("softcap", "0 (off) or a positive cap", softcap)
    _check_lengths(max_seqlen_q, max_seqlen_k)
    if not check_metadata:
        return

    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    if cu[0] != 0 or cu[-1] > num_tokens:
        _fail("cu_seqlens_q", f"prefix sums from 0 up to at most num_tokens={num_tokens} "
              "(rows of q past the last sum are padding)", f"[{cu[0]} .. {cu[-1]}]")
    capacity = block_table.shape[1] * block_size
    for s in range(num_seqs):
        query_len = cu[s + 1] - cu[s]
        if query_len < 0:
            _fail("cu_seqlens_q", "non-decreasing prefix sums", f"{cu[s]} then {cu[s + 1]} at sequence {s}")
        if lens[s] < query_len:
            _fail("seq_lens", f"seq_lens[{s}] >= its query length {query_len}", lens[s])
        if lens[s] > capacity:
            _fail("block_table", f"at least {-(-lens[s] // block_size)} blocks per row for "
                  f"seq_lens[{s}]={lens[s]} (block_size {block_size})", f"{block_table.shape[1]} columns")
        if query_len > max_seqlen_q:
            _fail("max_seqlen_q", f">= the longest query ({query_len} at sequence {s})", max_seqlen_q)
        if lens[s] > max_seqlen_k:
            _fail("max_seqlen_k", f">= the longest sequence ({lens[s]} at sequence {s})", max_seqlen_k)


# Tensor layouts that passed `validate_inputs` (a bounded map), each to what later calls
# with that layout need: a call whose tensors have the same metadata as an earlier valid one
# skips the tensor checks, the size reads and (for max lengths seen before) the config
# choice. The key holds every fact those checks read, so a remembered call is exactly as
# checked as a fresh one; max lengths, which change at every decode step, are checked the
# first time each pair is seen with a layout.
class _Sizes(NamedTuple):
    """What the config choice reads of a call's tensors and window (the leading arguments
    of `_config_for`)."""

    num_seqs: int
    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    sliding_window: int
    device: torch.device


class _Layout:
    """A validated layout: its sizes, the default softmax scale, the configs chosen for it so
    far by (max_seqlen_q, max_seqlen_k, keys in whole longest sequences, variant), every one
    of those checked, and why each
    kernel asked about refuses tensors of this layout (`config.Step.refuses`)."""

    __slots__ = ("sizes", "default_scale", "configs", "refusals")
    MAX_CONFIGS = 4096

    def __init__(self, sizes: _Sizes):
        self.sizes = sizes
        self.default_scale = sizes.head_size ** -0.5
        self.configs: dict[tuple, KernelConfig] = {}
        self.refusals: dict[str, str | None] = {}

    def refusal(self, variant: str, q, k_cache, v_cache) -> str | None:
        """Why kernel ``variant`` cannot run tensors of this layout here; None where it can."""
        if variant not in self.refusals:
            self.refusals[variant] = refusal(variant, q, k_cache, v_cache)
        return self.refusals[variant]

    def choose(self, max_seqlen_q: int, max_seqlen_k: int, full_length_seqs: int | None, variant: str,
               q, k_cache, v_cache) -> KernelConfig:
        """The config for these lengths (checked here, once), remembered. Where ``auto``
        picked a kernel that refuses these tensors, the Triton Q-block step's config runs
        (the Gluon kernel's step, on K and V caches with different strides); a kernel named
        that refuses them is a ValueError naming it."""
        _check_lengths(max_seqlen_q, max_seqlen_k)
        config = _config_for(*self.sizes, max_seqlen_q, max_seqlen_k, full_length_seqs, variant)
        why = self.refusal(config.variant, q, k_cache, v_cache)
        if why is not None and variant != AUTO:
            raise ValueError(f"variant: {variant!r} cannot run this call: {why}")
        if why is not None:
            config = _config_for(*self.sizes, max_seqlen_q, max_seqlen_k, full_length_seqs, "qblock")
        if len(self.configs) >= self.MAX_CONFIGS:
            self.configs.clear()
        self.configs[(max_seqlen_q, max_seqlen_k, full_length_seqs, variant)] = config
        return config


_VALID_LAYOUTS: dict[tuple, _Layout] = {}
_MAX_VALID_LAYOUTS = 4096


def _checked_layout(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, out,
                    sliding_window, softcap, check_metadata, max_seqlen_q, max_seqlen_k) -> _Layout:
    """`validate_inputs`, skipped for a layout that passed before (unless values are
    checked: then nothing is remembered)."""
    key = None
    if not check_metadata:
        try:  # the metadata `validate_inputs` checks (no tensor values)
            key = (
                q.shape, q.stride(), q.dtype, q.device,
                k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device,
                v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device,
                block_table.shape, block_table.dtype, block_table.device,
                cu_seqlens_q.shape, cu_seqlens_q.dtype, cu_seqlens_q.device,
                seq_lens.shape, seq_lens.dtype, seq_lens.device,
                None if out is None else (out.shape, out.stride(), out.dtype, out.device),
                sliding_window, softcap,
            )
        except (AttributeError, TypeError):
            pass  # an argument that is not tensor-like: the full check names it
        else:
            layout = _VALID_LAYOUTS.get(key)
            if layout is not None:
                return layout
    validate_inputs(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, out,
                    max_seqlen_q, max_seqlen_k, sliding_window, softcap, check_metadata)
    num_tokens, num_q_heads, head_size = q.shape
    layout = _Layout(_Sizes(seq_lens.shape[0], num_tokens, num_q_heads, k_cache.shape[2], head_size,
                            sliding_window or 0, q.device))
    if key is not None:
        if len(_VALID_LAYOUTS) >= _MAX_VALID_LAYOUTS:
            _VALID_LAYOUTS.clear()
        _VALID_LAYOUTS[key] = layout
    return layout


@lru_cache(maxsize=4096)
def _config_for(num_seqs: int, num_tokens: int, num_q_heads: int, num_kv_heads: int, head_size: int,
                sliding_window: int, device: torch.device, max_seqlen_q: int, max_seqlen_k: int,
                full_length_seqs: int | None, variant: str) -> KernelConfig:
    """`choose_config` for a batch shape on a device, cached (the trees are pure functions).
    ``full_length_seqs``: the batch's keys in units of the longest sequence, rounded up
    (`_full_length_seqs`); None where unknown. The trees see the batch within its window
    (`BatchShape.in_window`; 0: none)."""
    sum_seqlen_k = None if full_length_seqs is None else full_length_seqs * max_seqlen_k
    shape = BatchShape(num_seqs, num_tokens, max_seqlen_q, max_seqlen_k, num_q_heads, num_kv_heads, head_size,
                       sum_seqlen_k).in_window(sliding_window)
    return choose_config(shape, Platform.detect(device), variant)


def _full_length_seqs(sum_seqlen_k: int | None, num_seqs: int, max_seqlen_k: int) -> int | None:
    """``sum_seqlen_k`` in units of the longest sequence, rounded up: how many sequences'
    worth of keys the batch holds (the heuristics read only that share, and configs are
    remembered per count rather than per key). None (unknown) stays None."""
    if sum_seqlen_k is None:
        return None
    if isinstance(sum_seqlen_k, bool) or not isinstance(sum_seqlen_k, int) \
            or not 0 < max_seqlen_k <= sum_seqlen_k <= num_seqs * max_seqlen_k:
        _fail("sum_seqlen_k", f"None or an int from max_seqlen_k={max_seqlen_k} to num_seqs x max_seqlen_k="
              f"{num_seqs * max_seqlen_k} (the batch's keys, summed over its sequences)", sum_seqlen_k)
    return -(-sum_seqlen_k // max_seqlen_k)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    sliding_window: int | None = None,
    softcap: float = 0.0,
    variant: str = "auto",
    config: KernelConfig | None = None,
    check_metadata: bool = False,
    sum_seqlen_k: int | None = None,
) -> torch.Tensor:
    """Paged attention over a ragged batch in vLLM's layout (see `bench/reference.py`).

    ``variant`` picks a registered kernel (`variants.VARIANTS`: the paper's steps "naive",
    "qblock", "parallel_tiled", "static_grid", and "qblock_ws" on Hopper) or lets the
    heuristics choose ("auto"). ``config`` overrides the
    heuristics' launch parameters (its ``variant`` then wins). ``scale`` (> 0) defaults
    to ``head_size ** -0.5``. ``sum_seqlen_k``: the batch's keys summed over its sequences,
    or an upper bound, where the caller knows it on the host (vLLM's
    ``seq_lens_cpu_upper_bound``); it lets ``auto`` see a ragged batch. None (default):
    the lengths are unknown up to ``max_seqlen_k``, as in a captured CUDA graph, which
    replays for any; ``auto`` then picks what holds for any lengths. Returns ``out``
    (allocated when None). Bad shapes, dtypes and layouts raise ValueError naming the
    argument; ``check_metadata=True`` also checks the metadata's values, which costs a
    host sync (module doc).
    """
    layout = _checked_layout(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, out,
                             sliding_window, softcap, check_metadata, max_seqlen_q, max_seqlen_k)
    if check_metadata and sum_seqlen_k is not None and sum_seqlen_k < (keys := int(seq_lens.sum())):
        _fail("sum_seqlen_k", f"at least the batch's keys, sum(seq_lens)={keys} (an upper bound will do)",
              sum_seqlen_k)
    if config is None:
        full_seqs = _full_length_seqs(sum_seqlen_k, layout.sizes.num_seqs, max_seqlen_k)
        config = layout.configs.get((max_seqlen_q, max_seqlen_k, full_seqs, variant)) \
            or layout.choose(max_seqlen_q, max_seqlen_k, full_seqs, variant, q, k_cache, v_cache)
    else:
        _check_lengths(max_seqlen_q, max_seqlen_k)
        if variant not in ("auto", config.variant):
            _fail("config", f"a KernelConfig for variant {variant!r}", config.variant)
        why = layout.refusal(config.variant, q, k_cache, v_cache)
        if why is not None:
            raise ValueError(f"config: variant {config.variant!r} cannot run this call: {why}")
    if out is None:
        out = torch.empty_like(q)
    scale = layout.default_scale if scale is None else float(scale)
    if not scale > 0:  # the kernels' mask-free tiles scale the row max, which needs scale > 0
        _fail("scale", "a positive softmax scale (default head_size ** -0.5)", scale)
    step(config.variant).launch(
        out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
        scale=scale, sliding_window=sliding_window, softcap=float(softcap),
        config=config, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
    )
    return out


def refusal(variant: str, q, k_cache, v_cache) -> str | None:
    """Why kernel ``variant`` cannot run a call with these tensors here (`config.Step.refuses`);
    None where it can."""
    refuses = step(variant).refuses
    return refuses(q, k_cache, v_cache) if refuses is not None else None


def _same_binary(config: KernelConfig) -> KernelConfig:
    """One representative of the configs that compile to the same binaries: static_grid's
    segment count is a run-time argument (only "split or not" adds the reduction kernel)."""
    if config.variant == "static_grid":
        return replace(config, num_segments=min(config.num_segments, 2))
    return config


def precompile(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, *,
    variant: str, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
    scale: float | None = None, sliding_window: int | None = None, softcap: float = 0.0,
) -> list[KernelConfig]:
    """Compile every kernel binary that ``variant`` can launch for batches within a
    server's limits, without launching anything; returns the configs compiled.

    The tensors are a real batch's (dtypes, strides and alignment are what Triton
    specializes on; the integers that vary from batch to batch are ``do_not_specialize``
    in every kernel), so later launches of any batch with these tensors' layout find their
    binary in Triton's cache. No host read of tensor values and no launch: safe inside
    CUDA-graph capture. A no-op under TRITON_INTERPRET=1 (nothing to compile).
    """
    platform = Platform.detect(q.device)
    limits = (platform, q.shape[1], k_cache.shape[2], q.shape[2], max_num_seqs, max_num_batched_tokens, max_model_len,
              sliding_window or 0)
    configs = reachable_configs(variant, *limits)
    refused = {c.variant: why for c in configs if (why := refusal(c.variant, q, k_cache, v_cache)) is not None}
    if refused and variant != AUTO:
        raise ValueError(f"variant: {variant!r} cannot run this call: {refused[variant]}")
    if refused:  # what `auto` runs instead (`_Layout.choose`)
        configs = tuple(c for c in configs if c.variant not in refused) + reachable_configs("qblock", *limits)
    binaries = list(dict.fromkeys(_same_binary(c) for c in configs))
    scale = q.shape[2] ** -0.5 if scale is None else float(scale)
    for config in binaries:
        step(config.variant).launch(
            out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens,
            scale=scale, sliding_window=sliding_window, softcap=float(softcap),
            config=config, max_seqlen_q=1, max_seqlen_k=1, compile_only=True,
        )
    return binaries
