"""What a kernel launch is configured by: `KernelConfig` (the launch parameters), `Platform`
(the device facts the choice may depend on), `BatchShape` (the batch facts known on the
host without a sync), and `Step`, the record each step of the paper declares beside its code.

The steps (`steps/`) import this module and the shared Triton blocks only. Importing it
loads neither torch nor triton: `Platform.detect` imports torch when it is called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable, NamedTuple

from .variants import VARIANTS

# log2(e): the kernels keep scores in base 2 (exp2), so the softmax scale is folded with it
LOG2E = 1.4426950408889634

# the platform of the CPU interpreter (TRITON_INTERPRET=1): a small SM count keeps a static
# grid's programs looping over several work items, as on a GPU
CPU_SMS = 4


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# the registered kernel with a persistent launch and a fixed 128-row Q-block
# (`hopper/qblock_ws.py`: the Q-block step in Gluon for Hopper, warp-specialized)
GLUON_QBLOCK = "qblock_ws"
SHORT_QUERY = 16  # query tokens per sequence up to which a batch counts as decodes (speculative ones too)
# KernelConfig fields of older tuned trees and sweeps: ``kernel: gluon_ws`` on the qblock
# step was the kernel registered since as ``qblock_ws`` (`KernelConfig.of`)
_LEGACY_KERNELS = {"triton": None, "gluon_ws": GLUON_QBLOCK}


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of one kernel variant.

    tile_size        KV tokens per softmax tile (power of two, independent of the page size)
    block_m          rows of a Q-block (query tokens x query heads of one KV head); grows to
                     the next power of two of the group size when that is larger
    num_warps        warps per program
    num_stages       software-pipelining depth of the KV loop
    num_segments     parallel_tiled: segments per Q-block (third grid axis);
                     static_grid: segments per decode sequence;
                     qblock_ws: work items per (Q-block, KV head), each a run of its KV
                     tiles, merged by parallel_tiled's reduction (1 = no split)
    programs_per_sm  static_grid: programs per SM/CU in the fixed grid
    reduce_num_warps warps of the segment-reduction kernels: 1 by default, since each program of
                     step 3's reduction merges one output row (<= 64 x head fp32); on an H100 one
                     warp beats 2-8 on every split decode case (docs/perf/kernels-h100.md)
    persistent       qblock_ws only: one program per SM walking the list of work items
                     (`hopper/blocks.program_item`) instead of one program per item; the
                     next item's KV tiles load while the last one finishes
    equal_segments   parallel_tiled only: every segment takes as many KV tiles as one of the
                     longest Q-block range's ``num_segments`` segments (that range read from the
                     call's ``max_seqlen_k``), so a shorter sequence takes fewer, full segments
                     instead of ``num_segments`` slivers (FA3 sizes its splits per sequence so
                     too). False: each Q-block's own range in ``num_segments`` parts. Only
                     for calls whose ``max_seqlen_k`` is the longest sequence's length, not a
                     bound that a captured CUDA graph replays under
    """

    variant: str  # the registered kernel that runs (`variants.KERNEL_MODULES`)
    tile_size: int = 32
    block_m: int = 16
    num_warps: int = 4
    num_stages: int = 2
    num_segments: int = 1
    programs_per_sm: float = 1.0
    reduce_num_warps: int = 1
    persistent: bool = False
    equal_segments: bool = False

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"KernelConfig.variant: expected one of {VARIANTS}, got {self.variant!r}")
        if self.variant == GLUON_QBLOCK and self.block_m != 128:
            raise ValueError(f"KernelConfig.block_m: {GLUON_QBLOCK!r} runs Q-blocks of 128 rows, got {self.block_m}")
        if self.persistent and self.variant != GLUON_QBLOCK:
            raise ValueError(f"KernelConfig.persistent: only {GLUON_QBLOCK!r} has a persistent launch, got "
                             f"variant {self.variant!r}")
        if self.equal_segments and self.variant != "parallel_tiled":
            raise ValueError(f"KernelConfig.equal_segments: only 'parallel_tiled' sizes its segments so, got "
                             f"variant {self.variant!r}")
        for name in ("tile_size", "block_m"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"KernelConfig.{name}: expected a power of two, got {v}")
        if self.variant != "naive" and self.tile_size < 16:
            raise ValueError(f"KernelConfig.tile_size: expected >= 16 for tl.dot, got {self.tile_size}")
        if self.num_segments < 1:
            raise ValueError(f"KernelConfig.num_segments: expected >= 1, got {self.num_segments}")

    @classmethod
    def of(cls, fields: dict) -> "KernelConfig":
        """The config a tuned tree returns or a sweep row names, as a dict of fields; older
        ones named the Gluon kernel in a ``kernel`` field beside ``variant: qblock``."""
        fields = dict(fields)
        legacy = fields.pop("kernel", "triton")
        if legacy not in _LEGACY_KERNELS:
            raise ValueError(f"KernelConfig.kernel: expected one of {list(_LEGACY_KERNELS)}, got {legacy!r}")
        if _LEGACY_KERNELS[legacy] is not None:
            fields["variant"] = _LEGACY_KERNELS[legacy]
        return cls(**fields)

    def block_m_for(self, queries_per_kv: int) -> int:
        """BLOCK_M for a GQA group of ``queries_per_kv`` heads (all heads fit one Q-block)."""
        return max(self.block_m, next_power_of_2(queries_per_kv))

    def block_q_for(self, queries_per_kv: int) -> int:
        """Query tokens of one sequence in a Q-block of BLOCK_M rows (all their heads)."""
        return max(1, self.block_m_for(queries_per_kv) // queries_per_kv)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Platform:
    """What the heuristics may depend on besides the batch."""

    vendor: str  # "cuda", "hip" or "cpu" (CPU: Triton interpreter)
    num_sms: int  # SMs (NVIDIA) or CUs (AMD)
    device_name: str = ""
    arch: str = ""  # "sm_90" (compute capability), "gfx942" (AMD); "" on the CPU or unknown

    @classmethod
    def detect(cls, device) -> "Platform":
        """The platform of a torch device (cached: called on every kernel launch)."""
        return _detect_platform(device.type, device.index)


@lru_cache(maxsize=None)
def _detect_platform(device_type: str, index: int | None) -> Platform:
    import torch  # lazy: config.py is imported by the torch-free runner (recipes, schema)

    if device_type != "cuda":
        return Platform("cpu", CPU_SMS, "cpu")
    props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
    if torch.version.hip:
        return Platform("hip", props.multi_processor_count, props.name, props.gcnArchName.split(":")[0])
    return Platform("cuda", props.multi_processor_count, props.name, f"sm_{props.major}{props.minor}")


def keys_in_window(max_seqlen_q: int, max_seqlen_k: int, sliding_window: int | None) -> int:
    """Keys a sequence's queries read at most: all ``max_seqlen_k``, or under a window of
    ``sliding_window`` keys per query (None or 0: none) the window and the queries it spans,
    ``sliding_window + max_seqlen_q - 1``, where that is fewer (every kernel skips the tiles
    before its rows' windows)."""
    if not sliding_window:
        return max_seqlen_k
    return min(max_seqlen_k, sliding_window + max_seqlen_q - 1)


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
    # keys summed over the batch's sequences; None where the caller does not know them, as
    # in a CUDA graph, which replays for any lengths up to max_seqlen_k: then the choice
    # must hold for any (`heuristics`: full-length programs, many decodes)
    sum_seqlen_k: int | None = None
    # keys before each query that it attends to, itself included (0: all); set by `in_window`
    sliding_window: int = 0

    @property
    def queries_per_kv(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def avg_seqlen_q(self) -> float:
        return self.num_tokens / max(1, self.num_seqs)

    @property
    def decode_only(self) -> bool:
        return self.max_seqlen_q == 1

    @property
    def full_length_share(self) -> float:
        """The batch's keys as a share of what it would hold if every sequence were as long
        as the longest (1.0 for a uniform batch or unknown lengths; 1/num_seqs at most
        ragged): how much of a one-program-per-sequence launch's time the longest
        sequences' programs alone take."""
        if self.sum_seqlen_k is None:
            return 1.0
        return min(1.0, self.sum_seqlen_k / (self.num_seqs * self.max_seqlen_k))

    def in_window(self, sliding_window: int | None) -> "BatchShape":
        """The batch as the kernels stream it under a sliding window of ``sliding_window``
        keys per query (None or 0: none): ``max_seqlen_k`` becomes the keys a sequence's
        queries read at most (`keys_in_window`), and ``sum_seqlen_k`` at most that many per
        sequence (an upper bound: the host knows the batch's sum, not how much of it lies
        outside the windows). A fresh prompt keeps its length (its queries span it). The
        trees then cost a 4k window over 40k-token contexts as the 4k contexts it reads.
        ``sliding_window`` is kept where it binds (`keys_in_window` of one query is fewer than
        ``max_seqlen_k``), for a tree that costs a block of queries (`q_block_keys`)."""
        if not sliding_window or sliding_window >= self.max_seqlen_k:
            return self
        max_keys = keys_in_window(self.max_seqlen_q, self.max_seqlen_k, sliding_window)
        sum_keys = None if self.sum_seqlen_k is None else min(self.sum_seqlen_k, self.num_seqs * max_keys)
        return replace(self, max_seqlen_k=max_keys, sum_seqlen_k=sum_keys, sliding_window=sliding_window)

    def q_block_keys(self, block_tokens: int) -> int:
        """Keys that ``block_tokens`` consecutive queries of a sequence read at most: all
        ``max_seqlen_k``, or within `sliding_window` its window and the block's span."""
        return keys_in_window(block_tokens, self.max_seqlen_k, self.sliding_window)

    def at_full_length(self, programs: int) -> int:
        """``programs`` of a one-program-per-(sequence, ...) launch counted in units of the
        longest sequence's (times `full_length_share`, rounded up): the GPU is full only
        while this is at least a program per SM. All of them for unknown lengths."""
        return math.ceil(programs * self.full_length_share)


@dataclass(frozen=True)
class Step:
    """One registered kernel, as its module declares it (``STEP = Step(...)``): a step of
    the paper (`steps/`) or a kernel written for one GPU generation (`hopper/`).

    launch          ``launch(out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
                    scale, sliding_window, softcap, config, max_seqlen_q, max_seqlen_k,
                    compile_only=False)``:
                    computes the batch's attention into ``out`` (or, with ``compile_only``,
                    compiles the binaries that launch would run and launches nothing)
    default_config  the hand-written decision tree: ``(BatchShape, Platform) -> KernelConfig``
    refuses         ``refuses(q, k_cache, v_cache) -> str | None``: why the kernel cannot
                    run a call with these tensors here (another GPU, heads it does not
                    take), None where it can; None for a kernel that runs everything the
                    entry point accepts. `dispatch.api` asks before it launches.
    """

    name: str
    paper: str  # where the paper describes it (or what it adds to the paper)
    launch: Callable[..., None]
    default_config: Callable[[BatchShape, Platform], KernelConfig]
    refuses: Callable[..., str | None] | None = None


class Decision(NamedTuple):
    """A config and why the trees chose it (one line: the rule that fired, with its numbers)."""

    config: KernelConfig
    why: str
