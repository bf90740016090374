"""Kernel configuration per batch and platform, as small readable decision trees.

The trees start from the paper's Listing 2 and the talk's platform table
(``TILE_SIZE_PREFILL``, ``NUM_STAGES_PREFILL``, ``NUM_WARPS_DECODE_3D`` for ROCm vs CUDA)
and were then tuned on an H100 (docs/perf/). `attnbench tune` measures a config sweep and
writes a fitted tree next to this file (``tuned_<device>.py``); when one exists for the
current device it takes precedence over the hand-written tree below.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace
from functools import lru_cache

VARIANTS = ("naive", "qblock", "parallel_tiled", "static_grid")


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of one kernel variant.

    tile_size        KV tokens per softmax tile (power of two, independent of the page size)
    block_m          rows of a Q-block (query tokens x query heads of one KV head); grows to
                     the next power of two of the group size when that is larger
    num_warps        warps per program
    num_stages       software-pipelining depth of the KV loop
    num_segments     parallel_tiled: segments per Q-block (third grid axis);
                     static_grid: segments per decode sequence (1 = no split)
    programs_per_sm  static_grid: programs per SM/CU in the fixed grid
    reduce_num_warps warps of the segment-reduction kernels
    """

    variant: str
    tile_size: int = 32
    block_m: int = 16
    num_warps: int = 4
    num_stages: int = 2
    num_segments: int = 1
    programs_per_sm: float = 1.0
    reduce_num_warps: int = 4

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"KernelConfig.variant: expected one of {VARIANTS}, got {self.variant!r}")
        for name in ("tile_size", "block_m"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"KernelConfig.{name}: expected a power of two, got {v}")
        if self.variant != "naive" and self.tile_size < 16:
            raise ValueError(f"KernelConfig.tile_size: expected >= 16 for tl.dot, got {self.tile_size}")
        if self.num_segments < 1:
            raise ValueError(f"KernelConfig.num_segments: expected >= 1, got {self.num_segments}")

    def block_m_for(self, queries_per_kv: int) -> int:
        """BLOCK_M for a GQA group of ``queries_per_kv`` heads (all heads fit one Q-block)."""
        return max(self.block_m, next_power_of_2(queries_per_kv))

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Platform:
    """What the heuristics may depend on besides the batch."""

    vendor: str  # "cuda", "hip" or "cpu" (CPU: Triton interpreter)
    num_sms: int
    device_name: str = ""

    @classmethod
    def detect(cls, device) -> "Platform":
        """The platform of a torch device (cached: called on every kernel launch)."""
        return _detect_platform(device.type, device.index)


@lru_cache(maxsize=None)
def _detect_platform(device_type: str, index: int | None) -> Platform:
    import torch

    if device_type != "cuda":
        return Platform("cpu", 4, "cpu")
    props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
    vendor = "hip" if torch.version.hip else "cuda"
    return Platform(vendor, props.multi_processor_count, props.name)


@dataclass(frozen=True)
class BatchShape:
    """The batch facts a config may depend on (all known on the host without a sync)."""

    num_seqs: int
    num_tokens: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int

    @property
    def queries_per_kv(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def avg_seqlen_q(self) -> float:
        return self.num_tokens / max(1, self.num_seqs)

    @property
    def decode_only(self) -> bool:
        return self.max_seqlen_q == 1


# ------------------------------------------------------------------ hand-written trees
# CUDA values were measured on an H100 80GB (docs/perf/kernels-h100.md); ROCm values are
# the paper's Listing 2 and the talk's platform table, not yet measured here.

def _naive(shape: BatchShape, p: Platform) -> KernelConfig:
    return KernelConfig("naive", tile_size=16, num_warps=4, num_stages=1)


def _qblock(shape: BatchShape, p: Platform) -> KernelConfig:
    if p.vendor == "hip":
        # Listing 2: BLOCK_M 16 and tile 32 on AMD; talk: TILE_SIZE_PREFILL 64, 1 stage
        tile = 64 if shape.max_seqlen_q > 1 else 32
        return KernelConfig("qblock", tile_size=tile, block_m=16, num_warps=4, num_stages=1)
    if shape.decode_only:
        # memory bound: large KV tiles keep enough bytes in flight (H100: 90-98% of copy BW)
        return KernelConfig("qblock", tile_size=128, block_m=16, num_warps=8, num_stages=2)
    if shape.max_seqlen_q <= 16:
        # speculative decodes and tiny chunks: a 16-row Q-block wastes no rows
        return KernelConfig("qblock", tile_size=64, block_m=16, num_warps=4, num_stages=3)
    # prefill and mixed batches: 128-row Q-blocks cut K/V re-reads 8x versus 16 rows and
    # feed the tensor cores (wgmma) with 8 warps
    return KernelConfig("qblock", tile_size=128, block_m=128, num_warps=8, num_stages=2)


def _parallel_tiled(shape: BatchShape, p: Platform) -> KernelConfig:
    if p.vendor == "hip":
        # talk appendix: NUM_WARPS_DECODE_3D 4 on ROCm; 16 segments as in vLLM
        return KernelConfig("parallel_tiled", tile_size=16, block_m=16, num_warps=4,
                            num_stages=1, num_segments=16)
    # H100: 32 segments when there are very few (sequence, KV head) pairs, else 16
    segments = 32 if shape.num_seqs * shape.num_kv_heads <= 8 else 16
    return KernelConfig("parallel_tiled", tile_size=64, block_m=16, num_warps=4,
                        num_stages=3, num_segments=segments)


def _static_grid(shape: BatchShape, p: Platform) -> KernelConfig:
    """Fixed grid of a few programs per SM; decode sequences split until ~2 items per program."""
    stages = 1 if p.vendor == "hip" else 2
    if not shape.decode_only and shape.max_seqlen_q > 16:
        return KernelConfig("static_grid", tile_size=64, block_m=128, num_warps=8,
                            num_stages=stages, programs_per_sm=2)
    programs_per_sm = 4
    items = shape.num_seqs * shape.num_kv_heads
    segments = min(32, max(1, -(-2 * programs_per_sm * p.num_sms // items)))
    return KernelConfig("static_grid", tile_size=64, block_m=16, num_warps=4,
                        num_stages=stages, num_segments=segments, programs_per_sm=programs_per_sm)


_TREES = {
    "naive": _naive,
    "qblock": _qblock,
    "parallel_tiled": _parallel_tiled,
    "static_grid": _static_grid,
}


def _auto(shape: BatchShape, p: Platform) -> KernelConfig:
    """2D vs 3D as in the paper, the split-k lesson and vLLM's backend.

    Split the tiles across programs only when the 2D grid cannot fill the GPU: a decode
    batch with at most one (sequence, KV head) pair per SM, long enough that 16 segments
    of 64-token tiles all have work.
    """
    few_programs = shape.num_seqs * shape.num_kv_heads <= p.num_sms
    if shape.decode_only and few_programs and shape.max_seqlen_k >= 1024:
        return _parallel_tiled(shape, p)
    return _qblock(shape, p)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@lru_cache(maxsize=None)
def _tuned_tree(device_name: str):
    """The tree `attnbench tune` fitted for this device, if one ships with the package."""
    if not device_name:
        return None
    try:
        module = importlib.import_module(f"{__package__}.tuned_{_slug(device_name)}")
    except ModuleNotFoundError:
        return None
    return module.choose


def choose_config(shape: BatchShape, platform: Platform, variant: str = "auto") -> KernelConfig:
    """Config for ``variant`` ("auto" picks the variant too) on this batch and platform."""
    if variant == "auto":
        tuned = _tuned_tree(platform.device_name)
        if tuned is not None:
            return KernelConfig(**tuned(shape, platform))
        return _auto(shape, platform)
    if variant not in _TREES:
        raise ValueError(f"variant: expected 'auto' or one of {VARIANTS}, got {variant!r}")
    return _TREES[variant](shape, platform)


def _probe_values(limit: int) -> list[int]:
    """1 .. ``limit``: every power of two, its neighbours and 1.5x, and the limit itself,
    so that a threshold anywhere in a tree sits between two probes."""
    values = {1, 2, 3, limit}
    p = 2
    while p <= limit:
        values.update({p - 1, p, p + 1, p + p // 2})
        p *= 2
    return sorted(v for v in values if 1 <= v <= limit)


@lru_cache(maxsize=None)
def reachable_configs(variant: str, platform: Platform, num_q_heads: int, num_kv_heads: int,
                      head_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                      max_model_len: int) -> tuple[KernelConfig, ...]:
    """Every config `choose_config` can return for ``variant`` on batches within a
    server's limits (sequences per batch, tokens per batch, tokens per sequence).

    Found by probing the trees on a grid of batch shapes dense around every power of two
    (decode-only batches, one long query among decodes, all queries equally long), so a
    server can compile them all before it serves (`api.precompile`). The trees are plain
    functions, so this is a search, not a proof; `tests/test_precompile.py` checks it
    against random batches.
    """
    seqs = _probe_values(max_num_seqs)
    query_lens = _probe_values(min(max_num_batched_tokens, max_model_len))
    kv_lens = _probe_values(max_model_len)
    found: dict[KernelConfig, None] = {}
    for n in seqs:
        for q_len in query_lens:
            if q_len == 1:
                token_counts = {n}
            else:  # one long query among decodes, or every query as long
                token_counts = {q_len + n - 1, n * q_len}
            for tokens in token_counts:
                if tokens > max_num_batched_tokens or tokens < n:
                    continue
                for kv_len in kv_lens:
                    if kv_len < q_len:
                        continue
                    shape = BatchShape(n, tokens, q_len, kv_len, num_q_heads, num_kv_heads, head_size)
                    found.setdefault(choose_config(shape, platform, variant))
    return tuple(found)


def with_overrides(config: KernelConfig, **overrides) -> KernelConfig:
    """``config`` with some fields replaced (used by the microbenchmark and the tuner)."""
    return replace(config, **overrides)
