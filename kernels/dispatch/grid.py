"""What the kernels would launch for a batch here: the Q-block step's 2D grid of programs,
and whether `auto` runs the warp-specialized Gluon kernel (``qblock_ws``) on it. The
dispatch rules (`heuristics`, `short_queries`, `split_kv`) weigh both against the SMs."""

from __future__ import annotations

from ..config import BatchShape, Platform
from ..hopper import host as hopper
from ..variants import step


def programs_2d(shape: BatchShape, p: Platform) -> int:
    """Programs the Q-block step would launch for this batch: (sequence, Q-block, KV head)."""
    block_q = step("qblock").default_config(shape, p).block_q_for(shape.queries_per_kv)
    return shape.num_seqs * -(-shape.max_seqlen_q // block_q) * shape.num_kv_heads


def gluon_runs(shape: BatchShape, p: Platform) -> bool:
    """Whether `auto` runs the Gluon kernel for this batch here: an sm_90 GPU, Gluon's
    Hopper API, not switched off (``ATTNBENCH_GLUON=0``), heads it takes (head size, query
    heads per KV head). Short queries too at heads of two column pieces (96, 192:
    `hopper.head_pieces`): on an H200 (rules.yaml head96-decodes and head192-decodes;
    docs/perf/h200/rules-2026-11-29.csv) it took 0.87-1.01x the Triton step's
    time on Phi-3's decodes and 2-token speculative decodes (B96 over 512 keys: 185 against
    212 us; B24 over 8k 680 against 675) and 0.60-0.88x at head 192, since its second
    consumer skips a decode's missing rows. (On the H100 it took 1.03x on Phi-3's held-out
    decodes at cf9ab91, before that pass.) At head 256 it took 0.87-1.01x on Gemma-2's
    decodes, ragged decodes and 2-query speculative decodes."""
    return (p.arch == hopper.ARCH and hopper.chosen_by_auto()
            and hopper.shape_reason(shape.head_size, shape.queries_per_kv, hopper.PIECEWISE_HEAD_SIZES) is None)
