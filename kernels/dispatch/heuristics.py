"""Kernel configuration per batch and platform, as small readable decision trees.

Each registered kernel's own tree lives beside it (``default_config`` in `steps/<step>.py`,
`hopper/qblock_ws.py`); here is the ``auto`` tree that picks the kernel. The trees start
from the paper's Listing 2 and the talk's platform table (``TILE_SIZE_PREFILL``,
``NUM_STAGES_PREFILL``, ``NUM_WARPS_DECODE_3D`` for ROCm vs CUDA) and were then tuned on an
H100 (docs/perf/). `attnbench tune` measures a config sweep and writes a fitted tree next to
this file (``tuned_<device>.py``, reading the batch through `features`); when one exists for
the current device it takes precedence over the hand-written ``auto`` tree. One ships for
the H100 SXM (``tuned_nvidia_h100_80gb_hbm3``, fitted on
recipes/microbench/llama3-8b-tune.yaml: roofline cases and serving steps); every other
device runs the hand-written tree below. ``ATTNBENCH_TUNED_TREE`` overrides that
choice: ``off`` runs the hand-written tree on every device (what a GPU without a fitted
tree gets), a path runs the tree in that file (one `attnbench tune --emit` just wrote).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from ..config import GLUON_QBLOCK, SHORT_QUERY, BatchShape, KernelConfig, Platform, next_power_of_2
from ..hopper import host as hopper
from ..variants import AUTO, check_variant, step


class Decision(NamedTuple):
    """A config and why the trees chose it (one line: the rule that fired, with its numbers)."""

    config: KernelConfig
    why: str


def _auto(shape: BatchShape, p: Platform) -> Decision:
    """2D vs 3D as in the paper, the split-k lesson and vLLM's backend; on Hopper, every
    batch the 2D grid fills goes to the warp-specialized Gluon kernel.

    Split the tiles across programs only when the 2D grid cannot fill the GPU: a batch of
    short queries (decodes, and speculative decodes of up to 16 tokens, as FA3 splits them)
    whose Q-block step would launch at most one program per SM, counted at the longest
    sequence's length where the caller knows the batch's keys (a ragged batch counts
    fewer), over at least 512 keys (`_split_kv`), or long ones whose Gluon work items would
    leave its static rounds less than three quarters full (`_split_for_waves`). (On the
    H100 a speculative batch of 8 sequences x 4 queries over 16k tokens with 4 KV heads:
    133 us split, 405 us not.)
    Otherwise, on an sm_90 GPU with Gluon's Hopper API and heads the Gluon kernel takes, it
    runs that kernel, ``qblock_ws`` (unless ``ATTNBENCH_GLUON=0``; not many short queries
    over short contexts, `_many_short_queries`). On the H100's training
    set (docs/perf/h100/tune-2026-11-25-reduce1.csv), best config against best config, it
    takes 0.56-0.79x the Triton step's time on prefills and chunks, 0.65-1.01x on mixed
    batches, and 0.96-1.02x on the decodes the 2D grid runs (16 to 256 sequences, 512 to
    4k keys). The held-out grid's decodes, which that set lacks, range wider: 0.51-0.71x
    the Triton step's time on ragged batches and on 4-8 query speculative decodes over
    4k-8k keys, 1.04-1.08x on uniform batches of short sequences (docs/perf/kernels-h100.md).
    The paper's steps themselves (``variant="qblock"``, Fig. 7-8) stay Triton.
    """
    if _split_kv(shape, p):
        return _split_decision(shape, p)
    triton_short = _triton_for_many_short_queries(shape, p)
    if triton_short is not None:
        return triton_short
    if _gluon_runs(shape, p):
        config = step(GLUON_QBLOCK).default_config(shape, p)
        return Decision(config, f"{shape.max_seqlen_q}-token queries that fill the 2D grid, on sm_90 with Gluon: "
                                f"{GLUON_QBLOCK}'s own tree" + _split_why(config, shape, p))
    return Decision(step("qblock").default_config(shape, p), "the qblock step's own tree")


def _split_why(config: KernelConfig, shape: BatchShape, p: Platform) -> str:
    """The Gluon kernel's split, where it splits (`hopper.split_segments`): its work items
    for the SMs."""
    if config.num_segments == 1:
        return ""
    return (f", {config.num_segments} segments per Q-block: {hopper.shape_work_items(shape)} work items "
            f"for {p.num_sms} SMs")


MANY_SHORT_QUERIES_MAX_KEYS = 4096  # longest sequence up to which many short queries keep the Triton step
WIDE_HEAD_DECODES_MAX_KEYS = 2048  # the same for decodes at a head over 128 the Triton step takes unpadded (256)
WIDE_HEAD_DECODES_MIN_PROGRAMS_PER_SM = 5  # and from as many programs per SM as its decode config keeps resident


def _many_short_queries(shape: BatchShape, p: Platform) -> bool:
    """Short queries over at most `MANY_SHORT_QUERIES_MAX_KEYS` keys whose Q-block step
    launches more programs than there are SMs, speculative ones only where each sequence's
    query rows fill one of its Q-blocks: where `auto` keeps the Triton step on Hopper, with
    or without a fitted tree.
    Such a batch fills 1-16 of the Gluon kernel's 128 Q-block rows per program, and its one
    program per SM streams few tiles; the Triton step's 16-row Q-blocks, several programs
    per SM, do better once there are programs enough, where their rows are not wasted too:
    a sequence in two Q-blocks reads its keys twice.

    * Decodes: on the H100's training set, best config against best config, the Triton step
      took 0.98-1.00x the Gluon kernel's time on every such batch (B32-B256 over 512-4k
      keys), and 0.95-1.01x the time of the config the shipped tree fitted there picks
      (docs/perf/h100/tune-2026-11-25-reduce1.csv). With at most one program per SM, or past
      4k keys, the Gluon kernel wins: 0.87-0.96x the Triton step's time (B16-B32 decodes over
      512-8k keys in 128 programs, B48-B64 over 8k).
    * Speculative decodes (recipes/microbench/rules.yaml, spec-many; docs/perf/h100/
      rules-spec-2026-11-27.csv), where a sequence's rows fill one 16-row Q-block
      (`_fills_one_triton_q_block`: 4 queries at 4 query heads per KV head), 0.86-1.01x the
      time of the shipped tree's pick (Llama-1B 128 x 4 over 1k: 0.86x; Llama-8B over
      512-2k: 0.95-0.97x; over 4k: 1.01x); where they fill part of one (2 queries at 4
      heads per KV head, 2 at 1), 0.99x, no gain (1.02x the best config at Phi-3's head
      96); where they take two (8 queries at 4 heads per KV head, 4 at 7 or 8), 1.01-1.46x.

    Where the caller does not know the lengths (``sum_seqlen_k`` None: a captured CUDA
    graph, which replays for any lengths up to ``max_seqlen_k``, vLLM's max_model_len),
    many decodes keep the Triton step whatever ``max_seqlen_k``: its small Q-blocks, several
    per SM, balance whatever lengths come. On the decode steps of the talk's burst (H100,
    recipes/microbench/burst-steps.yaml: B48-B500 over 300-1,500 keys, ragged or not) the
    Triton step took 0.94-1.04x FA3's time, and the Gluon kernel that such a graph replayed
    before 1.06-1.21x; past 4k keys on uniform lengths the Triton step takes at most 1.10x
    the Gluon kernel's time (the held-out grid's B48-B64 decodes over 8k keys). Speculative
    decodes over unknown lengths keep the Gluon kernel: nothing measured them.

    At Gemma-2's head of 256 the Triton step runs such decodes in 32-key tiles and 4 warps
    (`qblock.TRITON_DECODE_WIDE_HEADS`): 0.80-0.98x the Gluon kernel's time on rules.yaml's
    head256-tiles decodes on an H200 (B96-B320 over 200-2k keys).

    All of this was measured before the Gluon kernel's second consumer passed on the rows
    such a batch lacks (`qblock_ws._pass_item`) and before its list held one Q-block per
    sequence (`host.one_q_block_per_seq`). Since, batches of equal, known lengths whose
    queries fit one Q-block each (`host.even_short_queries`), at heads the Gluon kernel runs
    in 128-key tiles (up to 128) and at 192, keep the Triton step only where they are
    decodes whose items would leave its static rounds idle (`host.static_rounds_full`); the
    rest run the Gluon kernel persistent (`qblock_ws.default_config`). On an H200 (rules.yaml
    many-decodes, spec-many and decode-rounds; docs/perf/h200/rules-decodes-2026-11-29.csv)
    that took 0.79-0.97x the Triton step's time on the 17 uniform decodes with full rounds,
    and 0.77-1.00x `auto`'s time before on every uniform speculative decode (Llama-8B 64 x 4
    over 512 keys: 49 against 63 us, FA3 54). At head 192, which the Triton step computes
    in 256 columns, 0.62-0.66x (rules.yaml head192-decodes, B32 over 2k keys: 206 against
    333 us; docs/perf/h200/rules-2026-11-29.csv); at head 256 the Triton step
    still won with programs enough to fill its SMs (its decode config keeps five per SM
    resident: 42 KB of shared memory each), 0.80-0.91x the persistent Gluon kernel's time
    from 5.8 programs per SM (B96 over 1.2k keys 243 against 268 us, B128 over 600, B320
    ragged up to 1k), level at 2k keys (B192 ragged, 0.99x), but it lost with fewer: at
    1.9 programs per SM 1.29x over 2k keys (Gemma-2-9B's B32: 187 against 146 us, FA3
    147) and 1.25x within a 4k window, at 1.5-1.9 per SM 1.34x over 3k, at 2.9-3.9 per SM
    1.20-1.43x within a 4k window (Gemma-2-2B's ragged B96, Gemma-2-9B's ragged B64;
    rules.yaml wide-decodes and windows, heldout-random;
    docs/perf/h200/rules-2026-11-29.csv). So at head 256
    decodes keep it from `WIDE_HEAD_DECODES_MIN_PROGRAMS_PER_SM` programs per SM, up to
    `WIDE_HEAD_DECODES_MAX_KEYS` keys where the lengths are known."""
    if shape.max_seqlen_q > SHORT_QUERY or _programs_2d(shape, p) <= p.num_sms:
        return False
    if (hopper.even_short_queries(shape) and not _wide_unpadded_head(shape)
            and shape.max_seqlen_k <= MANY_SHORT_QUERIES_MAX_KEYS):
        return shape.max_seqlen_q == 1 and not hopper.static_rounds_full(shape, p.num_sms)
    if shape.max_seqlen_q == 1:
        if _wide_unpadded_head(shape) and _programs_2d(shape, p) < WIDE_HEAD_DECODES_MIN_PROGRAMS_PER_SM * p.num_sms:
            return False
        return shape.max_seqlen_k <= _triton_short_max_keys(shape) or shape.sum_seqlen_k is None
    return (_fills_one_triton_q_block(shape, p) and shape.sum_seqlen_k is not None
            and shape.max_seqlen_k <= MANY_SHORT_QUERIES_MAX_KEYS)


def _wide_unpadded_head(shape: BatchShape) -> bool:
    """A head over 128 that the Triton step computes without padding (256): its 32-key
    decode tiles keep winning there over short contexts; at 192 they compute 256 columns
    and lose."""
    return hopper.max_tile_size(shape.head_size) < 128 and next_power_of_2(shape.head_size) == shape.head_size


def _triton_short_max_keys(shape: BatchShape) -> int:
    """Longest sequence up to which many short queries of this batch's kind may keep the
    Triton step (`_many_short_queries`)."""
    if shape.max_seqlen_q == 1 and _wide_unpadded_head(shape):
        return WIDE_HEAD_DECODES_MAX_KEYS
    return MANY_SHORT_QUERIES_MAX_KEYS


def _fills_one_triton_q_block(shape: BatchShape, p: Platform) -> bool:
    """Whether each sequence's query rows (query tokens times query heads per KV head) fill
    exactly one of the Triton step's Q-blocks: 4 tokens at 4 heads per KV head, 2 at 8."""
    qpk = shape.queries_per_kv
    return shape.max_seqlen_q * qpk == step("qblock").default_config(shape, p).block_m_for(qpk)


def _triton_for_many_short_queries(shape: BatchShape, p: Platform) -> Decision | None:
    """The Triton step's own config where the Gluon kernel would run `_many_short_queries`,
    with why; None elsewhere. Holds with or without a fitted tree."""
    if not (_gluon_runs(shape, p) and _many_short_queries(shape, p)):
        return None
    rows = shape.max_seqlen_q * shape.queries_per_kv
    what = "decodes" if shape.max_seqlen_q == 1 else f"{shape.max_seqlen_q}-token queries filling one {rows}-row Q-block each"
    max_keys = _triton_short_max_keys(shape)
    over = (f"over at most {max_keys} keys" if shape.max_seqlen_k <= max_keys
            else f"over unknown lengths up to {shape.max_seqlen_k} keys")
    rounds = ""
    if hopper.even_short_queries(shape):
        items, n = hopper.static_rounds(shape, p.num_sms)
        rounds = f" (equal lengths: {items} items would fill {items / (n * p.num_sms):.0%} of {n} static rounds)"
    return Decision(step("qblock").default_config(shape, p),
                    f"the qblock step's own tree: {what} {over} in {_programs_2d(shape, p)} programs "
                    f"for {p.num_sms} SMs{rounds}")


PERSISTENT_MAX_KEYS = 1024  # longest sequence up to which a persistent launch may pay on any batch


def _persistent_pays(shape: BatchShape, p: Platform) -> bool:
    """Whether the Gluon kernel's persistent launch (one program per SM walking the list of
    work items) may beat one program per item:

    * on any batch whose sequences have at most `PERSISTENT_MAX_KEYS` keys: its items are
      short, so what it saves per item (a program's start and its prologue) is a real share
      of the item's time. On the H100's training set it saves 3-16% there. Its static shares
      (decodes') cannot follow ragged lengths past that;
    * on batches of long queries with many items per SM (`hopper.many_items`), which it
      walks claiming the next item whenever a program is ready for one, so no share is
      fixed (`hopper.launch_qblock`): 0.87-1.01x one program per item's time on the
      training set's prefills from 15.5 items per SM, at any length (8k prefills 0.99-1.01x),
      0.94-1.01x from 5.8 (heads of 192 and 256 only up to 1k keys: `hopper.many_items`).
      A 512-token chunk over 30k keys, with one item per SM, took 814 us in fixed shares and
      445 one per item on the held-out grid;
    * on short queries of equal, known lengths (`hopper.even_short_queries`), at any length:
      their static shares are equal work (0.94-0.99x one program per item's time past 1k
      keys on an H200, `qblock_ws.default_config`)."""
    return (shape.max_seqlen_k <= PERSISTENT_MAX_KEYS or hopper.many_items(shape, p.num_sms)
            or hopper.even_short_queries(shape))


def _split_decision(shape: BatchShape, p: Platform) -> Decision:
    """The split-KV step's config (`_split_config`) and why: the programs the Q-block step
    would launch for the SMs, and how the keys are cut."""
    config = _split_config(shape, p)
    gluon = ""
    if _gluon_runs(shape, p) and _split_for_waves(shape, p):
        items, rounds = hopper.static_rounds(shape, p.num_sms)
        gluon = f" (the Gluon kernel's {items} items would fill {items / (rounds * p.num_sms):.0%} of {rounds} static rounds)"
    elif _gluon_runs(shape, p):
        wave = ", the batch being ragged over more than a wave" if _ragged_over_a_wave(shape, p) else ""
        gluon = f" (at most {_split_max_programs(shape, p)} split where the Gluon kernel runs{wave})"
    ragged = ""
    if shape.full_length_share < 1:
        ragged = (f", {_full_length_programs(shape, p)} at the longest sequence's length "
                  f"({shape.sum_seqlen_k} keys in {shape.num_seqs} sequences)")
    cut = ("; segments as long as the longest sequence's" if config.equal_segments
           else f"; {config.num_segments} segments per Q-block")
    return Decision(config, f"split-KV: {shape.max_seqlen_q}-token queries over {shape.max_seqlen_k} keys; the "
                            f"Q-block step would launch {_programs_2d(shape, p)} programs{ragged} for {p.num_sms} "
                            f"SMs{gluon}{cut}")


SPLIT_MIN_KEYS = 512  # longest sequence from which a batch of short queries may split its keys


def _split_kv(shape: BatchShape, p: Platform) -> bool:
    """Short queries (at most `SHORT_QUERY`) over at least `SPLIT_MIN_KEYS` keys whose 2D
    grid would leave SMs idle, counted at the longest sequence's length
    (`_full_length_programs` at most `_split_max_programs`): the split-KV step fills the GPU
    instead. From 512 keys: on the H100 (recipes/microbench/rules.yaml, split-min-keys) every
    decode of 1-4 sequences from 384 keys took less time split than in the Gluon kernel or
    the Triton step, and at 256 keys the Triton step won."""
    return (shape.max_seqlen_q <= SHORT_QUERY and shape.max_seqlen_k >= SPLIT_MIN_KEYS
            and (_full_length_programs(shape, p) <= _split_max_programs(shape, p) or _split_for_waves(shape, p)))


WAVE_SPLIT_MAX_FILL = 0.75  # share of its static rounds the Gluon kernel's items fill below which long decodes split


def _split_for_waves(shape: BatchShape, p: Platform) -> bool:
    """Short queries of equal, known lengths over more than `MANY_SHORT_QUERIES_MAX_KEYS`
    keys, at a head the split computes in at most 128 columns, whose Gluon work items take
    more than one static round of the SMs and fill less than `WAVE_SPLIT_MAX_FILL` of
    their rounds (`hopper.static_rounds`; from four rounds they fill more): the last
    round's few items, each the full context long, then run on a few SMs while the rest
    idle, and the split's segments keep every SM streaming. (Fewer keys keep the Triton
    step where rounds are idle, `_many_short_queries`; a single round splits only up to
    half the SMs, `_split_max_programs`: its items have the GPU's bandwidth to themselves.)

    On an H200 (132 SMs; recipes/microbench/rules.yaml, waves and wave-bounds; docs/perf/
    h200/rules-2026-11-29.csv), uniform decodes and 2-4-token speculative
    decodes over 5-32k keys at heads 64 and 128, the split in 8 segments against the Gluon
    kernel: 0.69-0.80x its time at 52-61% of two rounds (136-160 items; Llama-8B B17 over
    16k: 321 against 424 us, FA3 401), 0.97x at 73% (192 items over 8k), 0.86x at 73% of
    three rounds (288 items over 16k: 591 against 685, FA3 646), 1.03x at 79% and 82%
    (208 and 216 items over 16k) and 1.00-1.03x at 97% (256 over 32k). Wider heads, whose
    split computes 256 columns in 64-key tiles, were not measured and keep the Gluon kernel."""
    if not (_gluon_runs(shape, p) and hopper.even_short_queries(shape) and hopper.head_pad(shape.head_size) <= 128
            and shape.max_seqlen_k > MANY_SHORT_QUERIES_MAX_KEYS):
        return False
    items, rounds = hopper.static_rounds(shape, p.num_sms)
    return rounds > 1 and items < WAVE_SPLIT_MAX_FILL * rounds * p.num_sms


def _split_for_raggedness(shape: BatchShape, p: Platform) -> bool:
    """Of a batch `_split_kv` splits: whether it would not split were it uniform, i.e. it
    is ragged enough that its longest sequences' programs alone outlast the rest."""
    return not _split_kv(replace(shape, sum_seqlen_k=None), p)


def _full_length_programs(shape: BatchShape, p: Platform) -> int:
    """The 2D grid's programs counted in units of the longest sequence's (`_programs_2d`
    times `BatchShape.full_length_share`, rounded up). One program per (sequence, Q-block,
    KV head) ends with its longest program; the GPU is full only while the batch's work,
    in such units, is at least a program per SM. A uniform batch counts every program; a
    ragged decode counts few: 4 of 24 Gemma-2 sequences over 12k keys and 20 over 1k (192
    programs) count 46. There, on the H100's held-out grid, one program per item took
    372 us (the Gluon kernel) and 428 us (the Triton step), the split-KV step 253 us."""
    return shape.at_full_length(_programs_2d(shape, p))


SPLIT_SHORT_KEYS = 2560  # longest sequence up to which a split takes 32-key tiles (Hopper)
SPLIT_MAX_BLOCK_M = 64  # the largest Q-block a split widens to, to hold a sequence's speculative tokens
SPLIT_PROGRAMS_PER_SM = 2  # (sequence, KV head) pairs x segments per SM a split aims at (Hopper)
SPLIT_MAX_SEGMENTS = 32  # the most segments a split cuts a (sequence, KV head) pair's keys into
WAVE_SPLIT_SEGMENTS = 8  # segments per pair of a split past a pair per SM (`_split_for_waves`)
SPLIT_NARROW_SEGMENTS = 16  # segments per pair of a split in 64-key tiles (`_narrow_split_tiles`)
SPLIT_NARROW_MAX_PROGRAMS_PER_SM = 3.2  # the most programs per SM of those (`_narrow_split_tiles`)


def _split_config(shape: BatchShape, p: Platform) -> KernelConfig:
    """The split-KV step's config where `auto` splits (the step's own tree where a fitted
    tree does not decide), with segments that follow each sequence's length where the
    lengths are known (`_segments_for_lengths`).

    On sm_90, the tiles the H100 measured (recipes/microbench/rules.yaml,
    docs/perf/h100/rules-2026-11-27.csv): up to `SPLIT_SHORT_KEYS` keys, 32-key tiles in 32
    segments, what the shipped tree fitted for the training set's decodes over 1k keys (on
    the rules' 256-768-key decodes, 0.79-0.89x the step's own config's time); past them,
    128-key tiles up to a 128-wide head (the rules' speculative decodes over 8-32k keys:
    0.84-0.91x in the step's 16-row Q-blocks; its ragged decodes, in equal segments,
    0.81-0.93x), in as many segments as `_split_segments` gives a batch of known, equal or
    unknown lengths (a ragged batch keeps the step's own count, measured so), and a Q-block
    holds all of a sequence's query rows, up to `SPLIT_MAX_BLOCK_M` (`_split_block_m`).
    Heads computed as 256 keep the step's own 64-key tiles (128-key tiles took 1.15x there)
    and take `_split_segments`' count too where the lengths are equal or unknown. Every head
    takes 2 stages, as fitted at 64 and 128 (3 took the same time there; on an H200,
    rules.yaml split-stages, segments-17-31 and split-tiles-17-26, 3 stages of 128-key tiles
    took 0.95-1.03x the time of 2 on 20 uniform decodes, 1.005-1.02x on the ragged group's
    8). Where 8 segments of 128-key tiles would fill 1.2-1.6 rounds of the SMs, 64-key
    tiles in 16 (`_narrow_split_tiles`).

    At head 256 the step's 64-key tiles in 2 stages rather than 3 took 0.84-0.94x the time
    on an H200 (recipes/microbench/rules.yaml, head256-tiles; docs/perf/h200/head256-stages-
    2026-11-28.csv: Gemma-2's B4 decode over 8k keys 92 against 110 us, its B8 over a 4k
    window 104 against 110, two ragged decodes in equal segments 212 / 207 against 225 /
    221; 32-key tiles 100-121 / 243-245 us). Both take 76 KB of shared memory (Triton 3.6,
    sm_90), the same programs per SM. Their segments, on the same H200 (head256-tiles;
    docs/perf/h200/head256-tiles-2026-11-28.csv, run "segments"): the step's own cut (32
    segments up to 8 pairs, else 16) was the fastest up to 16 pairs, and past them `_split_segments`' count
    was: 32 pairs over 2k and 8k keys in 8 segments 37.5 / 87.5 against 42.6 / 92.7 us, 48
    pairs over 3k and 64 over 1k in 4 63.0 / 37.0 against 66.2 / 49.7, 64 over a 4k window
    in 4 89.8 against 103.4 (0.84-1.05x FA3's time on these five, was 0.88-1.35x)."""
    config = step("parallel_tiled").default_config(shape, p)
    if p.arch != hopper.ARCH:
        return _segments_for_lengths(config, shape)
    config = replace(config, num_stages=2)
    if hopper.head_pad(shape.head_size) <= 128:
        config = replace(config, block_m=_split_block_m(shape, config.block_m))
        if shape.max_seqlen_k <= SPLIT_SHORT_KEYS:
            return _segments_for_lengths(replace(config, tile_size=32, num_segments=32), shape)
        config = replace(config, tile_size=128)
    if shape.full_length_share < 1:  # ragged: the step's own count, in equal segments
        return _segments_for_lengths(config, shape)
    if config.tile_size == 128 and _narrow_split_tiles(shape, p, config.block_m):
        return replace(config, tile_size=64, num_segments=SPLIT_NARROW_SEGMENTS)
    return replace(config, num_segments=_split_segments(shape, p))


def _narrow_split_tiles(shape: BatchShape, p: Platform, block_m: int) -> bool:
    """Whether a split of equal or unknown lengths at head 128, one 16-row Q-block per
    (sequence, KV head) pair, cuts 64-key tiles in `SPLIT_NARROW_SEGMENTS` rather than
    128-key tiles in `_split_segments`' count: where 16 segments of the pairs are more than
    `SPLIT_PROGRAMS_PER_SM` programs per SM (so `_split_segments` halves them to 8: 17 pairs
    and more on 132 SMs) but at most `SPLIT_NARROW_MAX_PROGRAMS_PER_SM` (26 pairs). The
    128-key programs then take 1.2-1.6 rounds of the SMs, the narrower ones' work spreads
    over all of them.

    On an H200 (rules.yaml split-stages, segments-17-31, split-tiles-17-26;
    docs/perf/h200/rules-2026-11-29.csv: uniform decodes over 4.6-48k keys) 64-key tiles in
    16 segments and 2 stages took 0.88-0.98x the time of 128-key tiles in 8 on all 14 cases
    of 17-26 pairs (Phi-3-medium's 20 pairs over 24k keys 82.5 against 94.2 us; Llama-8B's 24
    over 48k 160 against 176), 0.98x at 28 pairs (3.4 per SM), but 1.22-1.25x at 30 and 32,
    and 1.08-1.11x at 16 pairs (against 16 segments of 128-key tiles)."""
    programs = shape.num_seqs * shape.num_kv_heads * SPLIT_NARROW_SEGMENTS
    return (shape.head_size == 128 and block_m == 16
            and SPLIT_PROGRAMS_PER_SM * p.num_sms < programs <= SPLIT_NARROW_MAX_PROGRAMS_PER_SM * p.num_sms)


def _split_segments(shape: BatchShape, p: Platform) -> int:
    """Segments per (sequence, KV head) pair of a split over 128-key tiles: the most, as a
    power of two up to `SPLIT_MAX_SEGMENTS`, for which pairs x segments stay within
    `SPLIT_PROGRAMS_PER_SM` programs per SM, at least 2. Up to 16 pairs this is the step's
    own rule on the H100 (32 segments up to 8 pairs, else 16); past it, fewer: each segment
    writes a partial output and its softmax statistics for the reduction, and more than
    about two waves of segments add that traffic without hiding any more memory latency.

    On the H100 (recipes/microbench/rules.yaml, split-segments, 128-key tiles; best of 3
    rounds): 32 pairs (Llama-8B 4 x 16k, Qwen-7B 8 x 32k, Llama-1B 4 x 32k, MQA 32 x 8k) in 8
    segments 0.92-0.99x the time of 16 (4 segments: 1.05-1.18x); 48 and 64 pairs (MQA 48 x
    16k and 64 x 4k, Llama-8B and 70B 8 x 8k, Qwen-7B 16 x 8k) in 4 segments 0.87-0.96x
    (2 segments: 0.99-1.35x). The Q-blocks of a pair read the same keys and count once: an
    MQA decode's 32 query rows in two 16-row Q-blocks or one 32-row Q-block took the same
    time at the same segments. Past 66 pairs (split only where the Gluon kernel does not run
    short queries: heads of 96 and 192, up to a program per SM) 2 segments: Phi-3 (head 96)
    at 128 pairs 0.96x the time of 16, at 96 pairs 1.03x (139 against 135 us; 8 segments
    133, 4 segments 143); at 64 pairs 4 segments 0.99x. On an H200 (132 SMs too, no fitted
    tree; docs/perf/h200/rules-segs-2026-11-28.csv) the rule's pick took 0.80-1.01x the
    time of 16 segments on the nine head-128 cases, 0.83x on Phi-3's 128 pairs and 1.06x
    on its 96 (8 segments 0.94x): the one case both GPUs place elsewhere.

    Past a pair per SM (where `_split_for_waves` splits a batch of two or three static rounds),
    `WAVE_SPLIT_SEGMENTS`: on the H200's waves group (136-256 pairs over 8-32k keys) 8
    segments took 1.00-1.05x the time of the best of 4, 8 and 16 on every case, 4 up to
    1.15x, 16 up to 1.10x."""
    pairs = shape.num_seqs * shape.num_kv_heads
    if pairs > p.num_sms:
        return WAVE_SPLIT_SEGMENTS
    budget = SPLIT_PROGRAMS_PER_SM * p.num_sms
    segments = 2
    while segments < SPLIT_MAX_SEGMENTS and pairs * (2 * segments) <= budget:  # twice as many still fit
        segments *= 2
    return segments


def _split_block_m(shape: BatchShape, block_m: int) -> int:
    """Rows of the split's Q-block: enough for every query row of a sequence (its tokens
    times the query heads of a KV head), up to `SPLIT_MAX_BLOCK_M`. A speculative decode of
    4 tokens with 7 query heads per KV head has 28 rows: in the step's own 16-row Q-blocks
    (2 tokens each) every KV tile is read twice, once per Q-block; in one 32-row Q-block
    once. The batch is memory bound, so its time follows the tiles read: on the rules'
    speculative decodes, Llama-70B's 4 tokens x 8 heads over 32k keys 127 -> 114 us (FA3
    113), Qwen-7B's 8 x 7 over 8k 47 -> 39 us (FA3 31)."""
    rows = shape.max_seqlen_q * shape.queries_per_kv
    return max(block_m, min(SPLIT_MAX_BLOCK_M, next_power_of_2(rows)))


def _segments_for_lengths(config: KernelConfig, shape: BatchShape) -> KernelConfig:
    """``config`` with ``equal_segments`` where the split-KV step runs a ragged batch whose
    keys the caller gives: a short sequence then fills a few segments as long as the
    longest sequence's, instead of ``num_segments`` slivers of one tile or less (the rules'
    ragged decodes, at 128-key tiles: 0.98-1.21x FA3's time in equal segments, 1.03-1.57x
    in 16 segments per sequence; 4 x 16k + 60 x 1k keys, 224 against 269 us, FA3 196).
    A uniform batch's segments are equal already and keep the plain binary; unknown
    lengths (a captured graph, whose ``max_seqlen_k`` is only a bound) keep each range's
    own cut."""
    if config.variant != "parallel_tiled" or shape.full_length_share == 1:
        return config
    return replace(config, equal_segments=True)


def _split_max_programs(shape: BatchShape, p: Platform) -> int:
    """The most programs of the 2D grid at which splitting the KV range pays, counted at the
    longest sequence's length (`_full_length_programs`): one per SM for the Triton step;
    half as many where the Gluon kernel runs the batch, whose one wave over every SM beats
    the split's extra reduction. With about one program per SM (128 on the H100's 132), the
    Gluon kernel took 0.88-0.95x the split-KV step's time (the training set's B16 decode
    over 8k keys, the held-out grid's Qwen B32 over 4k and Llama B16 over 32k keys); with
    half (64), the two were level (0.98-1.06x); with at most a quarter (8-32), the split
    took 0.12-0.79x the Gluon kernel's time (decodes and 4-query speculative decodes of
    both sets).

    A ragged batch whose 2D grid takes more than one wave splits further where the Gluon
    kernel runs: its long items then run beside short ones, not in one even wave, while the
    split's equal segments balance them. How much further depends on the Gluon kernel's
    work per key it reads: each KV tile costs it a softmax over its whole 128-row Q-block,
    however few of those rows are queries, against matrix products and bytes that grow
    with the rows and the head. Up to `RAGGED_SPLIT_ROW_COLUMNS` query rows x head columns
    (4 rows of head 128: Llama-8B's decodes), it splits up to one full-length program per
    SM; with more, proportionally fewer, never fewer than half the SMs (`_ragged_split_share`).
    On the H100 (recipes/microbench/rules.yaml, ragged, docs/perf/h100/rules-2026-11-27.csv;
    split in equal segments against the Gluon kernel's one program per item):

    * Llama-8B (4 x 128): 79 and 89 full-length programs 260 / 279 us split against 286 /
      287; 109 level (272 against 271); 149 the Gluon kernel (254 against 245).
    * Llama-1B (4 x 64): 101 and 131, split 103 / 131 against 125 / 146.
    * Qwen-7B (7 x 128: split up to 75): 95 and 120, the Gluon kernel 197 / 167 against
      205 / 180 split."""
    if not _gluon_runs(shape, p):
        return p.num_sms
    if _ragged_over_a_wave(shape, p):
        return max(p.num_sms // 2, int(p.num_sms * _ragged_split_share(shape)))
    return p.num_sms // 2


def _ragged_over_a_wave(shape: BatchShape, p: Platform) -> bool:
    """Whether a batch of known, unequal lengths has more 2D-grid programs than SMs: its
    long programs then run beside short ones rather than in one even wave."""
    return shape.full_length_share < 1 and _programs_2d(shape, p) > p.num_sms


RAGGED_SPLIT_ROW_COLUMNS = 512  # query rows x head columns up to which a ragged wave splits at one program per SM


def _ragged_split_share(shape: BatchShape) -> float:
    """The share of the SMs up to which a ragged batch over a wave splits where the Gluon
    kernel runs (`_split_max_programs`): 1 up to `RAGGED_SPLIT_ROW_COLUMNS` query rows (a
    sequence's queries x query heads per KV head, at most the Gluon kernel's 128) times
    head columns, less in proportion past it."""
    rows = min(hopper.BLOCK_M, shape.max_seqlen_q * shape.queries_per_kv)
    return min(1.0, RAGGED_SPLIT_ROW_COLUMNS / (rows * shape.head_size))


def _programs_2d(shape: BatchShape, p: Platform) -> int:
    """Programs the Q-block step would launch for this batch: (sequence, Q-block, KV head)."""
    block_q = step("qblock").default_config(shape, p).block_q_for(shape.queries_per_kv)
    return shape.num_seqs * -(-shape.max_seqlen_q // block_q) * shape.num_kv_heads


def _gluon_runs(shape: BatchShape, p: Platform) -> bool:
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


def _tuned_module(device_name: str) -> str:
    """Module name of a device's fitted tree: "NVIDIA H100 80GB HBM3" -> tuned_nvidia_h100_80gb_hbm3."""
    return "tuned_" + re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def tuned_tree_path(device_name: str) -> Path:
    """Where the package looks for the tree fitted for ``device_name`` (it may not exist)."""
    return Path(__file__).with_name(_tuned_module(device_name) + ".py")


TREE_ENV = "ATTNBENCH_TUNED_TREE"  # "off" | a fitted tree's .py file | unset: the device's own (module doc)


class TreeError(ValueError):
    """A file that is not a tree `attnbench tune --emit` wrote."""


def load_tree(path: str | Path):
    """The ``choose(shape, platform)`` of a fitted tree's file (`attnbench tune --emit`)."""
    path = Path(path)
    expected = "expected a tree written by `attnbench tune --emit` (a .py file with choose(shape, platform))"
    if not path.is_file():
        raise TreeError(f"{path}: no such file; {expected}")
    spec = importlib.util.spec_from_file_location(f"attnbench_tree_{path.stem}", path) if path.suffix == ".py" else None
    if spec is None:
        raise TreeError(f"{path}: not a Python file; {expected}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "choose", None)):
        raise TreeError(f"{path}: has no choose(shape, platform); {expected}")
    return module.choose


def _tuned_tree(device_name: str):
    """The fitted tree ``auto`` follows here: ``ATTNBENCH_TUNED_TREE``'s, else the one that
    ships for this device, if any."""
    chosen = os.environ.get(TREE_ENV, "")
    if chosen == "off":
        return None
    return _tree_file(chosen) if chosen else _device_tree(device_name)


@lru_cache(maxsize=None)
def _tree_file(path: str):
    return load_tree(path)


@lru_cache(maxsize=None)
def _device_tree(device_name: str):
    """The tree `attnbench tune` fitted for this device, if one ships with the package."""
    if not device_name:
        return None
    try:
        module = importlib.import_module(f"{__package__}.{_tuned_module(device_name)}")
    except ModuleNotFoundError:
        return None
    return module.choose


def choose_config(shape: BatchShape, platform: Platform, variant: str = AUTO) -> KernelConfig:
    """Config for ``variant`` ("auto" picks the variant too) on this batch and platform."""
    return decide(shape, platform, variant).config


def decide(shape: BatchShape, platform: Platform, variant: str = AUTO) -> Decision:
    """`choose_config`'s config and why it was chosen (the microbenchmark's ``why`` column)."""
    if check_variant(variant) != AUTO:
        return Decision(step(variant).default_config(shape, platform), f"{variant} named: its own tree")
    tuned = _tuned_tree(platform.device_name)
    if tuned is None:
        return _auto(shape, platform)
    if _split_kv(shape, platform) and (shape.max_seqlen_q > 1 or _split_for_raggedness(shape, platform)
                                       or shape.max_seqlen_k > SPLIT_SHORT_KEYS):
        # speculative decodes that cannot fill the GPU: no fitted tree has seen one (the
        # shipped tree's training set has none), and a tree extrapolates from prefills;
        # ragged decodes: a tree reads no sum of keys (its training batches are uniform);
        # decodes past 2.5k keys: a tree's splits keep 16 or 32 segments, the tune space's,
        # and on 64 pairs it ran the Gluon kernel, where `_split_segments`' 4 segments took
        # 0.86-0.96x its time (rules.yaml, split-segments). The occupancy rule holds whatever
        # the tree (uniform decodes over fewer keys keep the tree's pick)
        split = _split_decision(shape, platform)
        return split._replace(why=split.why + ", whatever the fitted tree")
    triton_short = _triton_for_many_short_queries(shape, platform)
    if triton_short is not None:
        return triton_short._replace(why=triton_short.why + ", whatever the fitted tree")
    config = _segments_for_lengths(KernelConfig.of(tuned(shape, platform)), shape)
    fitted = f"the fitted tree ({os.environ.get(TREE_ENV) or _tuned_module(platform.device_name)})"
    if config.persistent and not _persistent_pays(shape, platform):
        config = replace(config, persistent=False)
        fitted += (f", one program per item: the longest sequence has {shape.max_seqlen_k} keys "
                   f"(persistent only up to {PERSISTENT_MAX_KEYS}, with at least "
                   f"{hopper.PERSISTENT_MIN_ITEMS_PER_SM} work items per SM of a head that takes 128-key tiles, "
                   f"or on short queries of equal, known lengths)")
    elif config.variant == GLUON_QBLOCK and not config.persistent and hopper.many_items(shape, platform.num_sms):
        # fitted before the persistent launch claimed its items dynamically
        config = replace(config, persistent=True)
        fitted += (f", persistent: at least {hopper.PERSISTENT_MIN_ITEMS_PER_SM} work items per SM, "
                   + ("in even static shares" if hopper.prefill_deals_static_shares(shape, platform.num_sms)
                      else "claimed as programs free up"))
    elif config.variant == GLUON_QBLOCK and not config.persistent and hopper.even_short_queries(shape):
        # fitted before the list held one Q-block per sequence (1040415), when a spare
        # Q-block took a static share's slot
        config = replace(config, persistent=True)
        fitted += ", persistent: equal short queries, in equal static shares"
    own_tiles = step(GLUON_QBLOCK).default_config(shape, platform).tile_size if config.variant == GLUON_QBLOCK else 0
    if config.variant == GLUON_QBLOCK and config.tile_size < own_tiles:
        # fitted before ded4027 made a masked 128-key tile cheaper: past `qblock_ws.LONG_KEYS_FROM`
        # keys its own 128-key tiles took 0.94-1.00x the 64-key time on every rules.yaml case
        # (short-tiles and page-tiles groups; docs/perf/h100/page-tiles-2026-11-28.csv, H100 and H200)
        config = replace(config, tile_size=own_tiles)
        fitted += (f", {own_tiles}-key tiles: " + ("prompts in even static shares"
                                                    if hopper.prefill_deals_static_shares(shape, platform.num_sms)
                                                    else f"the longest sequence has {shape.max_seqlen_k} keys"))
    elif (config.variant == GLUON_QBLOCK and config.tile_size > own_tiles
          and shape.sliding_window and shape.max_seqlen_q > SHORT_QUERY):
        # fitted on prompts without a window, whose Q-blocks read their whole context; a short
        # window leaves each a few tiles (`qblock_ws.short_window_q_blocks`)
        config = replace(config, tile_size=own_tiles)
        fitted += (f", {own_tiles}-key tiles: a Q-block reads at most "
                   f"{shape.q_block_keys(hopper.q_block_tokens(shape.queries_per_kv))} keys "
                   f"within the {shape.sliding_window}-key window")
    if config.variant == GLUON_QBLOCK and (segments := hopper.split_segments(shape, platform.num_sms)) > 1:
        # fitted on batches that fill the GPU: too few work items split each Q-block's tiles
        config = replace(config, num_segments=segments, persistent=False)
        fitted += _split_why(config, shape, platform)
    if config.variant == GLUON_QBLOCK and config.tile_size > hopper.max_tile_size(shape.head_size):
        # fitted on head 128: a head the tree never saw may not fit its tiles in shared memory
        config = replace(config, tile_size=hopper.max_tile_size(shape.head_size))
        fitted += f", {config.tile_size}-key tiles: the largest that fit head size {shape.head_size}"
    if config.variant != GLUON_QBLOCK or _gluon_runs(shape, platform):
        return Decision(config, fitted)
    # fitted where Gluon ran on head 128; here it cannot (ATTNBENCH_GLUON=0, no Gluon, heads
    # the Gluon kernel does not take): the Triton step it implements, with its own tree
    return Decision(step("qblock").default_config(shape, platform),
                    f"the fitted tree picked {GLUON_QBLOCK}, which does not run here: the qblock step's own tree")


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
                      max_model_len: int, sliding_window: int = 0) -> tuple[KernelConfig, ...]:
    """Every config `choose_config` can return for ``variant`` on batches within a
    server's limits (sequences per batch, tokens per batch, tokens per sequence) in a
    layer of ``sliding_window`` keys per query (0: none).

    Found by probing the trees on a grid of batch shapes dense around every power of two
    (decode-only batches, one long query among decodes, all queries equally long; each with
    lengths unknown and at its most ragged), so a
    server can compile them all before it serves (`api.precompile`). Under a window the
    shapes are the trees' (`BatchShape.in_window`), whose keys move with the window: the
    grid then holds every short query length and the lengths around the window too. The
    trees are plain functions, so this is a search, not a proof;
    `tests/test_precompile.py` checks it against random batches.
    """
    seqs = _probe_values(max_num_seqs)
    query_lens = _probe_values(min(max_num_batched_tokens, max_model_len))
    kv_lens = _probe_values(max_model_len)
    if sliding_window:
        query_lens = sorted({*query_lens, *range(1, min(SHORT_QUERY + 1, max_num_batched_tokens, max_model_len) + 1)})
        kv_lens = sorted({*kv_lens, *(k for k in (sliding_window - 1, sliding_window, sliding_window + 1)
                                      if 1 <= k <= max_model_len)})
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
                    # unknown lengths (every sequence as long as the longest), and the most
                    # ragged batch: one sequence that long, the others no longer than their queries
                    for sum_k in {None, kv_len + (n - 1) * q_len}:
                        shape = BatchShape(n, tokens, q_len, kv_len, num_q_heads, num_kv_heads, head_size,
                                           sum_k).in_window(sliding_window)
                        found.setdefault(choose_config(shape, platform, variant))
    return tuple(found)


def with_overrides(config: KernelConfig, **overrides) -> KernelConfig:
    """``config`` with some fields replaced (used by the microbenchmark and the tuner)."""
    return replace(config, **overrides)
