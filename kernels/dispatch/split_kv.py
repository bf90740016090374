"""When and how `auto` splits the KV range of short queries across programs (the split-KV
step, ``parallel_tiled``): where the 2D grid would leave SMs idle, counted at the longest
sequence's length (`splits`), and the split's tiles, segments and Q-block (`split_config`),
each rule with the measurements that set it."""

from __future__ import annotations

from dataclasses import replace

from ..config import SHORT_QUERY, BatchShape, Decision, KernelConfig, Platform, next_power_of_2
from ..hopper import host as hopper
from ..variants import step
from .grid import gluon_runs, programs_2d
from .short_queries import MANY_SHORT_QUERIES_MAX_KEYS


def split_decision(shape: BatchShape, p: Platform) -> Decision:
    """The split-KV step's config (`split_config`) and why: the programs the Q-block step
    would launch for the SMs, and how the keys are cut."""
    config = split_config(shape, p)
    gluon = ""
    if gluon_runs(shape, p):
        if _split_for_waves(shape, p):
            items, rounds = hopper.static_rounds(shape, p.num_sms)
            gluon = (f" (the Gluon kernel's {items} items would fill {items / (rounds * p.num_sms):.0%} "
                     f"of {rounds} static rounds)")
        else:
            wave = ", the batch being ragged over more than a wave" if _ragged_over_a_wave(shape, p) else ""
            gluon = f" (at most {_split_max_programs(shape, p)} split where the Gluon kernel runs{wave})"
    ragged = ""
    if shape.full_length_share < 1:
        ragged = (f", {_full_length_programs(shape, p)} at the longest sequence's length "
                  f"({shape.sum_seqlen_k} keys in {shape.num_seqs} sequences)")
    cut = ("; segments as long as the longest sequence's" if config.equal_segments
           else f"; {config.num_segments} segments per Q-block")
    if p.arch == hopper.ARCH and hopper.head_pad(shape.head_size) <= 128 and config.tile_size == 64:
        # on sm_90 such heads split in 32- or 128-key tiles, but for `_narrow_split_tiles`
        programs = shape.num_seqs * shape.num_kv_heads * config.num_segments
        cut += f" of 64-key tiles ({programs} programs, {programs / p.num_sms:.1f} per SM)"
    return Decision(config, f"split-KV: {shape.max_seqlen_q}-token queries over {shape.max_seqlen_k} keys; the "
                            f"Q-block step would launch {programs_2d(shape, p)} programs{ragged} for {p.num_sms} "
                            f"SMs{gluon}{cut}")


SPLIT_MIN_KEYS = 512  # longest sequence from which a batch of short queries may split its keys


def splits(shape: BatchShape, p: Platform) -> bool:
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
    step where rounds are idle, `short_queries.many_short_queries`; a single round splits only up to
    half the SMs, `_split_max_programs`: its items have the GPU's bandwidth to themselves.)

    On an H200 (132 SMs; recipes/microbench/rules.yaml, waves and wave-bounds; docs/perf/
    h200/rules-2026-11-29.csv), uniform decodes and 2-4-token speculative
    decodes over 5-32k keys at heads 64 and 128, the split in 8 segments against the Gluon
    kernel: 0.69-0.80x its time at 52-61% of two rounds (136-160 items; Llama-8B B17 over
    16k: 321 against 424 us, FA3 401), 0.97x at 73% (192 items over 8k), 0.86x at 73% of
    three rounds (288 items over 16k: 591 against 685, FA3 646), 1.03x at 79% and 82%
    (208 and 216 items over 16k) and 1.00-1.03x at 97% (256 over 32k). Wider heads, whose
    split computes 256 columns in 64-key tiles, were not measured and keep the Gluon kernel."""
    if not (gluon_runs(shape, p) and hopper.even_short_queries(shape) and hopper.head_pad(shape.head_size) <= 128
            and shape.max_seqlen_k > MANY_SHORT_QUERIES_MAX_KEYS):
        return False
    items, rounds = hopper.static_rounds(shape, p.num_sms)
    return rounds > 1 and items < WAVE_SPLIT_MAX_FILL * rounds * p.num_sms


def split_for_raggedness(shape: BatchShape, p: Platform) -> bool:
    """Of a batch `splits` splits: whether it would not split were it uniform, i.e. it
    is ragged enough that its longest sequences' programs alone outlast the rest."""
    return not splits(replace(shape, sum_seqlen_k=None), p)


def _full_length_programs(shape: BatchShape, p: Platform) -> int:
    """The 2D grid's programs counted in units of the longest sequence's (`programs_2d`
    times `BatchShape.full_length_share`, rounded up). One program per (sequence, Q-block,
    KV head) ends with its longest program; the GPU is full only while the batch's work,
    in such units, is at least a program per SM. A uniform batch counts every program; a
    ragged decode counts few: 4 of 24 Gemma-2 sequences over 12k keys and 20 over 1k (192
    programs) count 46. There, on the H100's held-out grid, one program per item took
    372 us (the Gluon kernel) and 428 us (the Triton step), the split-KV step 253 us."""
    return shape.at_full_length(programs_2d(shape, p))


SPLIT_SHORT_KEYS = 2560  # longest sequence up to which a split takes 32-key tiles (Hopper)
SPLIT_MAX_BLOCK_M = 64  # the largest Q-block a split widens to, to hold a sequence's speculative tokens
SPLIT_PROGRAMS_PER_SM = 2  # (sequence, KV head) pairs x segments per SM a split aims at (Hopper)
SPLIT_MAX_SEGMENTS = 32  # the most segments a split cuts a (sequence, KV head) pair's keys into
WAVE_SPLIT_SEGMENTS = 8  # segments per pair of a split past a pair per SM (`_split_for_waves`)
SPLIT_NARROW_SEGMENTS = 16  # segments per pair of a split in 64-key tiles (`_narrow_split_tiles`)
SPLIT_NARROW_MAX_PROGRAMS_PER_SM = 3.2  # the most programs per SM of those (`_narrow_split_tiles`)


def split_config(shape: BatchShape, p: Platform) -> KernelConfig:
    """The split-KV step's config where `auto` splits (the step's own tree where a fitted
    tree does not decide), with segments that follow each sequence's length where the
    lengths are known (`segments_for_lengths`).

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
        return segments_for_lengths(config, shape)
    config = replace(config, num_stages=2)
    if hopper.head_pad(shape.head_size) <= 128:
        config = replace(config, block_m=_split_block_m(shape, config.block_m))
        if shape.max_seqlen_k <= SPLIT_SHORT_KEYS:
            return segments_for_lengths(replace(config, tile_size=32, num_segments=32), shape)
        config = replace(config, tile_size=128)
    if shape.full_length_share < 1:  # ragged: the step's own count, in equal segments
        return segments_for_lengths(config, shape)
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
    16 segments and 2 stages took 0.88-0.98x the time of 128-key tiles in 8 (in 2 or 3
    stages, which took the same time there) on all 14 cases of 17-26 pairs (Phi-3-medium's
    20 pairs over 24k keys 82.5 against 94.2 us; Llama-8B's 24 over 48k 160 against 176),
    0.98x at 28 pairs (3.4 per SM), but 1.22-1.25x at 30 and 32, and 1.08-1.11x at 16 pairs
    (against 16 segments of 128-key tiles)."""
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


def segments_for_lengths(config: KernelConfig, shape: BatchShape) -> KernelConfig:
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
    if not gluon_runs(shape, p):
        return p.num_sms
    if _ragged_over_a_wave(shape, p):
        return max(p.num_sms // 2, int(p.num_sms * _ragged_split_share(shape)))
    return p.num_sms // 2


def _ragged_over_a_wave(shape: BatchShape, p: Platform) -> bool:
    """Whether a batch of known, unequal lengths has more 2D-grid programs than SMs: its
    long programs then run beside short ones rather than in one even wave."""
    return shape.full_length_share < 1 and programs_2d(shape, p) > p.num_sms


RAGGED_SPLIT_ROW_COLUMNS = 512  # query rows x head columns up to which a ragged wave splits at one program per SM


def _ragged_split_share(shape: BatchShape) -> float:
    """The share of the SMs up to which a ragged batch over a wave splits where the Gluon
    kernel runs (`_split_max_programs`): 1 up to `RAGGED_SPLIT_ROW_COLUMNS` query rows (a
    sequence's queries x query heads per KV head, at most the Gluon kernel's 128) times
    head columns, less in proportion past it."""
    rows = min(hopper.BLOCK_M, shape.max_seqlen_q * shape.queries_per_kv)
    return min(1.0, RAGGED_SPLIT_ROW_COLUMNS / (rows * shape.head_size))
