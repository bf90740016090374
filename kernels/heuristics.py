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
def _naive(shape: BatchShape, p: Platform) -> KernelConfig:
    return KernelConfig("naive", tile_size=16, num_warps=4, num_stages=1)


def _qblock(shape: BatchShape, p: Platform) -> KernelConfig:
    """Paper Listing 2 for BLOCK_M / tile, talk appendix for stages."""
    nvidia = p.vendor == "cuda"
    if shape.max_seqlen_q > 1 and shape.avg_seqlen_q >= 4096 and nvidia:
        block_m = 64
    else:
        block_m = 16
    if shape.max_seqlen_k <= 64 or shape.avg_seqlen_q <= 4096 or p.vendor == "hip":
        tile = 32
    else:
        tile = 64
    stages = 1 if p.vendor == "hip" else 4 if shape.max_seqlen_q > 1 else 2
    return KernelConfig("qblock", tile_size=tile, block_m=block_m, num_warps=4, num_stages=stages)


def _parallel_tiled(shape: BatchShape, p: Platform) -> KernelConfig:
    """Talk appendix: NUM_WARPS_DECODE_3D 2 on CUDA, 4 on ROCm; 16 segments as in vLLM."""
    warps = 4 if p.vendor == "hip" else 2
    return KernelConfig("parallel_tiled", tile_size=16, block_m=16, num_warps=warps,
                        num_stages=1 if p.vendor == "hip" else 2, num_segments=16)


def _static_grid(shape: BatchShape, p: Platform) -> KernelConfig:
    """Fixed grid of one program per SM; split decode sequences until ~2 items per program."""
    items = shape.num_seqs * shape.num_kv_heads
    segments = min(16, max(1, -(-2 * p.num_sms // items)))
    return KernelConfig("static_grid", tile_size=32, block_m=16, num_warps=4,
                        num_stages=1 if p.vendor == "hip" else 2, num_segments=segments,
                        programs_per_sm=1.0)


_TREES = {
    "naive": _naive,
    "qblock": _qblock,
    "parallel_tiled": _parallel_tiled,
    "static_grid": _static_grid,
}


def _auto(shape: BatchShape, p: Platform) -> KernelConfig:
    """2D vs 3D as in the paper and the split-k lesson.

    Split the tiles across programs only when the 2D grid cannot fill the GPU: a decode
    batch with fewer (sequence, KV head) pairs than half the SMs, long enough that each of
    at least 4 segments has work.
    """
    few_programs = shape.num_seqs * shape.num_kv_heads < 0.5 * p.num_sms
    long_enough = shape.max_seqlen_k >= 4 * 16 * 16
    if shape.decode_only and few_programs and long_enough:
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


def with_overrides(config: KernelConfig, **overrides) -> KernelConfig:
    """``config`` with some fields replaced (used by the microbenchmark and the tuner)."""
    return replace(config, **overrides)
