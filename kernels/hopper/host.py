"""The host side of the Hopper kernels: which calls they can run, and their launch.

Both kernels (`qblock_wgmma`, `qblock_ws`) take the arguments of `steps/qblock.py`'s kernel
and a grid of Q-blocks of ``BLOCK_M`` rows (`q_blocks`); they differ in what runs inside a
program and in their launch options.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

from ..config import SHORT_QUERY, BatchShape, Platform, next_power_of_2

BLOCK_M = 128  # rows of a Q-block: two warpgroups of 64
HEAD_SIZES = (64, 128, 256)  # the widths the kernels compute in (powers of two: layouts, wgmma)
PIECEWISE_HEAD_SIZES = (64, 96, 128, 192, 256)  # the heads a kernel computing in pieces takes (`head_pieces`)
TILE_SIZES = (64, 128)
ARCH = "sm_90"


def head_pad(head_size: int) -> int:
    """The smallest of `HEAD_SIZES` that holds a head: the shared memory a head takes in a
    kernel's buffers, at most (`max_tile_size`)."""
    return next((w for w in HEAD_SIZES if w >= head_size), head_size)


def head_pieces(head_size: int) -> tuple[int, int]:
    """The column pieces a kernel that computes heads in pieces (`qblock_ws`) splits a head
    into: (first, rest), both powers of two (register tensors and wgmma tiles are), the rest
    0 where the head is one. 96 is 64 + 32 and 192 is 128 + 64: each product runs over the
    head's own columns, not a padded width. On the H100's held-out grid Phi-3's 4 x 2k
    prefill took 317 us in the Gluon kernel with its head padded to 128 (633d598), 306 us in
    pieces (FA3: 264): a third of the matrix work gone buys 3%, the softmax over each score
    tile, the same either way, being what bounds it."""
    first = 1 << (head_size.bit_length() - 1)
    rest = head_size - first
    if rest & (rest - 1):
        raise ValueError(f"head_size: expected a power of two or the sum of two, got {head_size}")
    return first, rest


def max_tile_size(head_size: int) -> int:
    """The largest KV tile that fits shared memory beside the Q-block: 128 keys up to a
    128-wide head; 64 for wider ones (192 and 256), whose K and V rings of 64-key tiles and
    128-row Q-block take 224 KiB of the H100's 227 at head 256 (128-key tiles would need 352;
    at head 192, 288)."""
    return 128 if head_pad(head_size) <= 128 else 64


PERSISTENT_MIN_ITEMS_PER_SM = 5  # work items per SM from which long queries' batches launch persistent
WIDE_HEADS_PERSISTENT_MAX_KEYS = 1024  # longest sequence up to which 64-key-only heads count `many_items`


def q_blocks(query_len: int, queries_per_kv: int) -> int:
    """Q-blocks of one sequence's query: its ``query_len * queries_per_kv`` rows (each
    token's query heads of one KV head, token-major: `blocks.qblock_rows`) in blocks of
    ``BLOCK_M``. Where the heads per KV head divide ``BLOCK_M`` that is whole tokens per
    Q-block, as the Triton steps pack them; elsewhere a token's heads may straddle two."""
    return -(-query_len * queries_per_kv // BLOCK_M)


def q_blocks_bound(num_tokens: int, num_seqs: int, queries_per_kv: int) -> int:
    """Q-blocks of a launch's grid (`blocks.locate_qblock`'s numbering): ``num_tokens *
    queries_per_kv // BLOCK_M + num_seqs`` bounds those of any batch with these token and
    sequence counts (each sequence's share rounds down, and its Q-blocks take at most one
    more), so that no host read of the lengths places them; the spares have no rows."""
    return num_tokens * queries_per_kv // BLOCK_M + num_seqs


def q_block_span(queries_per_kv: int) -> int:
    """Query tokens one Q-block's rows span at most: ``BLOCK_M // queries_per_kv`` where
    that divides, else one more than fit whole, or two for a token's heads that straddle
    its ends (Falcon-7B's 71 heads: three tokens, the middle one whole)."""
    g = math.gcd(BLOCK_M, queries_per_kv)  # a Q-block starts at a multiple of g within a token's heads
    return (queries_per_kv - g + BLOCK_M - 1) // queries_per_kv + 1


def work_items(num_tokens: int, num_seqs: int, max_seqlen_q: int, queries_per_kv: int, num_kv_heads: int) -> int:
    """A batch's work items (Q-blocks of ``BLOCK_M`` rows x KV heads: `q_blocks`), at
    least: the longest query's Q-blocks, and for the other sequences one Q-block each or
    their tokens' worth, whichever is more. (A launch's list, `listed_q_blocks`, holds
    these, or where it is the grid's bound a spare Q-block per sequence more.) Counting tokens alone would count a
    mixed batch's decodes as a few Q-blocks in all where each is one: Phi-3's 32 decodes
    beside two 1k prompts hold 1,312 items or more, not 544."""
    longest = q_blocks(max_seqlen_q, queries_per_kv)
    others = max(num_seqs - 1, q_blocks(num_tokens - max_seqlen_q, queries_per_kv))
    return (longest + others) * num_kv_heads


def shape_work_items(shape: BatchShape) -> int:
    """`work_items` of a batch shape."""
    return work_items(shape.num_tokens, shape.num_seqs, shape.max_seqlen_q, shape.queries_per_kv, shape.num_kv_heads)


def claims_items(max_seqlen_q: int, items: int, programs: int) -> bool:
    """Whether a batch of long queries (past `SHORT_QUERY`) gives each of ``programs``
    persistent programs at least `PERSISTENT_MIN_ITEMS_PER_SM` work items: where a
    persistent launch pays on prefills, each program claiming the list's next item whenever
    it is ready for one (`launch_qblock` launches it so), which saves a program's start and
    prologue per item and keeps KV tiles flowing from one item into the next. On the H100
    (docs/perf/h100/dynamic-2026-11-27.csv: llama3-8b-tune.yaml and rules.yaml's
    many-items group; dynamic-threshold-2026-11-27.csv: prefills of 4-16 items per SM)
    this took 0.87-0.93x one program per item's time from 15.5 items per SM on short
    prompts, 0.94-1.00x from 5.8 (Llama-8B 3 x 1k, 4 x 1k, 2 x 2k; Phi-3 2 x 2k; Qwen-7B
    1 x 4k 1.007x), 0.99-1.01x on 8k prefills, but 1.00-1.02x at 3.9 (Llama-8B's 2k prompt)
    and 1.07-1.49x with fewer, whose programs have too little to share. Decodes keep static
    shares: their items are short and even, and the claims' memset and atomics would be a
    real share of them."""
    return max_seqlen_q > SHORT_QUERY and items >= PERSISTENT_MIN_ITEMS_PER_SM * programs


def many_items(shape: BatchShape, num_sms: int) -> bool:
    """`claims_items` for a batch on a GPU of ``num_sms`` SMs: whether `auto` launches the
    Gluon kernel persistent for it whatever the key length. Heads that take only 64-key
    tiles (192, 256: `max_tile_size`) only up to `WIDE_HEADS_PERSISTENT_MAX_KEYS` keys:
    past them each item (a Q-block of 256-wide rows over its keys, 64 at a time) is long
    enough that a program's start is no share of it, and the persistent launch gained
    nothing on Gemma-2's 4k prefills from 5.8 to 15.5 items per SM (0.996-1.02x one program
    per item). Over at most 1k keys it did: on an H200 (rules.yaml head256-items;
    docs/perf/h200/rules-2026-11-29.csv) 0.94-0.99x at 7.8-8.7 items per SM
    (Gemma-2 64 x 128: 104 against 110 us), and 1.03-1.09x at 3.9, below
    `PERSISTENT_MIN_ITEMS_PER_SM`. (The burst's 32 x 256 prefill, held out, 1.00x: 118 us
    either way, and 108 in static shares; FA3 97.)"""
    items = shape_work_items(shape)
    short_items = (max_tile_size(shape.head_size) >= max(TILE_SIZES)
                   or shape.max_seqlen_k <= WIDE_HEADS_PERSISTENT_MAX_KEYS)
    return short_items and claims_items(shape.max_seqlen_q, items, num_sms)


SPLIT_MAX_ITEMS_SHARE = 0.75  # work items per SM up to which long queries split their tiles
SPLIT_MIN_SEGMENT_KEYS = 1024  # keys of the longest sequence per segment, at least
SPLIT_MAX_SEGMENTS = 8  # the most segments a (Q-block, KV head) pair's tiles are cut into
SPLIT_EVEN_MAX_QUERY_SHARE = 0.25  # a chunk's query over its keys up to which its items read about as many


def even_chunk_items(shape: BatchShape) -> bool:
    """Whether every work item of the batch reads about as many keys: sequences of one
    query length and one known key length, the query at most `SPLIT_EVEN_MAX_QUERY_SHARE`
    of the keys (chunks over a context, whose Q-blocks differ by the causal diagonal
    alone; a fresh prompt's run from one tile to all of them)."""
    return (shape.sum_seqlen_k is not None and shape.num_tokens == shape.num_seqs * shape.max_seqlen_q
            and shape.sum_seqlen_k == shape.num_seqs * shape.max_seqlen_k
            and shape.max_seqlen_q <= SPLIT_EVEN_MAX_QUERY_SHARE * shape.max_seqlen_k)


def split_rounds(items: int, segments: int, num_sms: int) -> float:
    """How long ``items`` equal work items take in ``segments`` segments each on ``num_sms``
    SMs, in units of one item: rounds of one segment per SM, each a ``1 / segments`` of an
    item (the wave model; a segment's partial store and the reduction not counted)."""
    return math.ceil(items * segments / num_sms) / segments


def split_segments(shape: BatchShape, num_sms: int) -> int:
    """Segments per (Q-block, KV head) pair in which the Gluon kernel runs a batch of long
    queries (past `SHORT_QUERY`; short ones split in the split-KV step): 1, or where its
    work items (`shape_work_items`) fill at most `SPLIT_MAX_ITEMS_SHARE` of the SMs, the
    most (a power of two, up to `SPLIT_MAX_SEGMENTS`) that keeps items x segments within
    two per SM and each segment at least `SPLIT_MIN_SEGMENT_KEYS` of the longest sequence's
    keys. Such a batch (a chunk over a long context at a few KV heads, a short prompt
    beside long decodes) otherwise runs its few long items on a fraction of the GPU;
    FlashAttention 3 splits it as well (its ``num_splits`` for a grid below a wave).

    On an H200 (recipes/microbench/rules.yaml, few-items; docs/perf/h200/rules-2026-11-29.csv,
    code 5c18104-share0.5) the split took 0.32-0.77x one program per item's time on the ten
    batches of 0.24-0.73 items per SM (Llama-8B's 128-token chunk over 32k keys, 32 items,
    in 8 segments: 139 against 442 us, FA3 126; a 256-token prompt beside 4 decodes over
    32k, 96 items, in 2: 188 against 356, FA3 224), and 1.09-1.17x in 2 segments on the
    three of 0.88-1.94 (Llama-8B's 512-token chunk over 16k keys, 128 items: 256 against
    234). Two segments rather than the rule's four took 0.96-0.97x the time on four
    batches of 60-64 items (0.87x on Gemma-2's 512-token chunk over 16k keys, whose 4k
    window leaves four segments about 1,150 keys each, 1.04x on a mixed batch of as many),
    and 1.29-1.66x rather than its four or eight on the four of 32-46 items.

    Where the items are equal (`even_chunk_items`) and more than a quarter of the SMs, the
    count is the fewest segments whose rounds end as soon (`split_rounds`): two where four
    make two rounds of quarter items (the four chunks above), none for 67-99 items, whose
    two segments would make two rounds of half items. Starcoder's 256-token chunk over 4.5k
    keys (12 query heads per KV head: 96 items) took 1.19x one program per item's time in 2
    segments (docs/perf/h200/short-queries-ab-2026-11-29.csv, 90 against 76 us). Batches of
    up to a quarter of the SMs keep the rule's count: 8 segments of Llama-8B's 32 items
    measured as above, 4 (one round as well) not."""
    if shape.max_seqlen_q <= SHORT_QUERY:
        return 1
    items = shape_work_items(shape)
    if items > SPLIT_MAX_ITEMS_SHARE * num_sms:
        return 1
    segments = 1
    while (segments < SPLIT_MAX_SEGMENTS and items * 2 * segments <= 2 * num_sms
           and shape.max_seqlen_k >= 2 * segments * SPLIT_MIN_SEGMENT_KEYS):
        segments *= 2
    if segments > 1 and 4 * items > num_sms and even_chunk_items(shape):
        counts = [1 << k for k in range(segments.bit_length())]  # 1, 2, ... segments
        segments = min(counts, key=lambda count: (split_rounds(items, count, num_sms), count))
    return segments


STATIC_ROUNDS_MIN_FILL = 0.8  # share of a persistent launch's static rounds its items must fill (`static_rounds_full`)


def even_static_shares(shape: BatchShape) -> bool:
    """Whether a persistent launch's static shares of this batch are equal work: every
    sequence has the same, known length (``sum_seqlen_k`` equal to ``num_seqs *
    max_seqlen_k``) and its query fits one Q-block, so that the list holds no spare items
    (`one_q_block_per_seq`)."""
    return (shape.sum_seqlen_k is not None and shape.sum_seqlen_k == shape.num_seqs * shape.max_seqlen_k
            and one_q_block_per_seq(shape.queries_per_kv, shape.max_seqlen_q))


def even_short_queries(shape: BatchShape) -> bool:
    """Whether the batch is short queries (decodes or speculative decodes, at most
    `SHORT_QUERY` tokens each) that a persistent launch deals in equal static shares
    (`even_static_shares`): the batches `qblock_ws.default_config` launches persistent at
    any length, in 128-key tiles from 256 keys."""
    return shape.max_seqlen_q <= SHORT_QUERY and even_static_shares(shape)


def static_rounds_full(shape: BatchShape, num_sms: int) -> bool:
    """Whether a persistent launch's static shares of this batch's work items (`work_items`:
    for short queries, one per sequence and KV head, `one_q_block_per_seq`) keep its programs
    busy: more than two rounds of ``num_sms`` items, or at least `STATIC_ROUNDS_MIN_FILL` of
    the rounds filled. A program's share is its rounds, so the last round's empty slots
    are idle SMs: 192 items for 132 programs take two rounds, 73% filled.

    On an H200 (recipes/microbench/rules.yaml, decode-rounds and many-decodes, uniform
    decodes of 160-2,048 items; docs/perf/h200/rules-decodes-2026-11-29.csv) the static
    shares of 128-key tiles took 0.79-0.97x the Triton step's time from 80% filled (240-
    2,048 items) and at three rounds or more (288 items, 73%: 0.87x); at two rounds 73%
    filled 1.01x (Llama-8B B24 over 1.5k keys), 61% filled (160 items) 1.00-1.09x."""
    items, rounds = static_rounds(shape, num_sms)
    return rounds > 2 or items >= STATIC_ROUNDS_MIN_FILL * rounds * num_sms


def static_rounds(shape: BatchShape, num_sms: int) -> tuple[int, int]:
    """(work items, rounds of ``num_sms``) of a persistent launch's static shares of this
    batch (`blocks.program_item`: every program takes one item per round)."""
    items = shape_work_items(shape)
    return items, -(-items // num_sms)


STATIC_DEAL_MAX_SPREAD = 1.05  # busiest program's share of a fresh prefill over the mean up to which it is dealt
SHORT_PROMPTS_STATIC_DEAL_MAX_SPREAD = 1.12  # ... for prompts of 128-key tiles up to SHORT_PROMPTS_MAX_KEYS
SHORT_PROMPTS_MAX_KEYS = 768


def fresh_uniform_prefill(num_seqs: int, num_tokens: int, max_seqlen_q: int, max_seqlen_k: int) -> bool:
    """Whether every sequence of the batch is a prompt of ``max_seqlen_q`` tokens with no
    context: its lengths are then known on the host without a read of ``seq_lens``
    (``num_seqs`` queries of the longest one's length, and no key beyond it)."""
    return max_seqlen_q > SHORT_QUERY and num_tokens == num_seqs * max_seqlen_q and max_seqlen_k == max_seqlen_q


@lru_cache(maxsize=1024)
def static_deal_spread(num_seqs: int, query_len: int, queries_per_kv: int, num_kv_heads: int, tile_size: int,
                       programs: int) -> float:
    """The busiest program's work over the mean when a persistent launch deals the items of
    ``num_seqs`` prompts of ``query_len`` tokens (no context) in static shares: the list of
    `launch_qblock` (each sequence's Q-blocks, `listed_q_blocks_per_seq`, last first, KV
    heads innermost), dealt in `blocks.program_item`'s snake order over ``programs``. An
    item's work is its key tiles (`blocks.tile_range`: up to its last query's position)
    plus one for its start. 1.0: every program has the same work."""
    rows = query_len * queries_per_kv  # of each sequence (`q_blocks`)
    local = np.tile(np.arange(q_blocks(query_len, queries_per_kv))[::-1], num_seqs)  # the list's order: last first
    keys = (np.minimum(rows, (local + 1) * BLOCK_M) - 1) // queries_per_kv + 1  # up to its last row's token
    work = -(-keys // tile_size) + 1
    items = np.repeat(work, num_kv_heads)  # KV heads innermost
    rounds = np.zeros(-(-items.size // programs) * programs, dtype=np.int64)
    rounds[:items.size] = items
    rounds = rounds.reshape(-1, programs)
    rounds[1::2] = rounds[1::2, ::-1]  # odd rounds deal backward
    shares = rounds.sum(axis=0)
    return float(shares.max() / shares.mean())


def deals_static_shares(num_seqs: int, num_tokens: int, max_seqlen_q: int, max_seqlen_k: int, queries_per_kv: int,
                        num_kv_heads: int, tile_size: int, programs: int) -> bool:
    """Whether a persistent launch deals a batch of long queries in static shares rather
    than letting its programs claim items: where the batch is prompts of one length
    (`fresh_uniform_prefill`) whose static shares are even, the busiest program's within
    `STATIC_DEAL_MAX_SPREAD` of the mean (`static_deal_spread`), or within
    `SHORT_PROMPTS_STATIC_DEAL_MAX_SPREAD` for prompts of up to `SHORT_PROMPTS_MAX_KEYS`
    tokens in 128-key tiles. A program then knows all its items up front and pays no claim
    (an atomic, and the wait for its answer before the next item's tiles can load), a
    larger share of a short prompt's items of a few tiles each.

    On an H200 (recipes/microbench/rules.yaml many-items and head256-items: 21 prompts of
    128-2k tokens, 4-50 items per SM; docs/perf/h200/rules-2026-11-29.csv, code 4462fa0)
    the static shares of 128-key tiles took 0.91-0.98x the time of claims on the five
    whose spread was 1.02-1.03, when the list still held a spare Q-block per sequence. With
    each sequence's Q-blocks listed (`listed_q_blocks_per_seq`; rules.yaml many-items,
    short-tiles and busy-tiles, code "e37ec32 + Q-blocks listed per sequence") they took
    0.91-0.97x the claims' time at spreads of 1.08-1.11 (Llama-1B 40 x 512: 223 against
    245 us; Llama-1B 48 x 512, Llama-8B 40 x 512 in 32-token pages, Llama-1B 8 x 768),
    0.96-1.01x at 1.18, and from 1.20 the claims won by up to 38% (Llama-8B 24 x 1k, 1.20:
    636 against 533 us; 8 x 1k, 1.50: 254 against 184). Longer prompts, and 64-key tiles,
    keep the bound measured before."""
    short_prompts = max_seqlen_q <= SHORT_PROMPTS_MAX_KEYS and tile_size >= max(TILE_SIZES)
    return (fresh_uniform_prefill(num_seqs, num_tokens, max_seqlen_q, max_seqlen_k)
            and static_deal_spread(num_seqs, max_seqlen_q, queries_per_kv, num_kv_heads, tile_size, programs)
            <= (SHORT_PROMPTS_STATIC_DEAL_MAX_SPREAD if short_prompts else STATIC_DEAL_MAX_SPREAD))


def prefill_deals_static_shares(shape: BatchShape, num_sms: int) -> bool:
    """Whether `auto`'s persistent launch of this batch (`many_items`) deals it static
    shares (`deals_static_shares`) in the largest tiles its head takes (`max_tile_size`),
    the tiles `qblock_ws.default_config` then gives it."""
    return many_items(shape, num_sms) and deals_static_shares(
        shape.num_seqs, shape.num_tokens, shape.max_seqlen_q, shape.max_seqlen_k, shape.queries_per_kv,
        shape.num_kv_heads, max_tile_size(shape.head_size), num_sms)


GLUON_ENV = "ATTNBENCH_GLUON"  # "0": `auto` keeps Triton's kernels on Hopper too (A/B runs)


def chosen_by_auto() -> bool:
    """Whether `auto` may pick these kernels: Gluon's Hopper API is there and ``ATTNBENCH_GLUON``
    is not "0" (read per call: a server's environment is fixed, a test's may change)."""
    return os.environ.get(GLUON_ENV, "1") != "0" and available()


@lru_cache(maxsize=None)
def available() -> bool:
    """Whether this Triton has the Gluon Hopper API these kernels are written in."""
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401  (optional: the probe itself)
    except Exception:  # noqa: BLE001 - any failure means "not usable here"
        return False
    return True


def shape_reason(head_size: int, queries_per_kv: int, head_sizes: tuple[int, ...] = HEAD_SIZES) -> str | None:
    """Why a kernel taking ``head_sizes`` cannot take heads of this shape, or None when it can."""
    if head_size not in head_sizes:
        return f"head size {head_size} (supported: {head_sizes})"
    if queries_per_kv > BLOCK_M:
        return f"{queries_per_kv} query heads per KV head (at most {BLOCK_M})"
    return None


def unsupported_reason(q, k_cache, head_sizes: tuple[int, ...] = HEAD_SIZES) -> str | None:
    """Why a kernel taking ``head_sizes`` cannot run a call with these tensors here, or None
    when it can (the caches' strides are `launch_qblock`'s check)."""
    if Platform.detect(q.device).arch != ARCH:  # cached: a lookup on the default call's path
        return "needs an sm_90 (Hopper) GPU"
    if not available():
        return "needs Triton's Gluon Hopper API (triton.experimental.gluon)"
    return shape_reason(q.shape[2], q.shape[1] // k_cache.shape[2], head_sizes)


def one_q_block_per_seq(queries_per_kv: int, max_seqlen_q: int | None) -> bool:
    """Whether every query of a batch whose longest is ``max_seqlen_q`` fits one Q-block
    (``max_seqlen_q * queries_per_kv <= BLOCK_M``: decodes and speculative decodes), so
    that a launch's list holds one per sequence (`listed_q_blocks_per_seq`)."""
    return max_seqlen_q is not None and max_seqlen_q * queries_per_kv <= BLOCK_M


def listed_q_blocks_per_seq(num_tokens: int, num_seqs: int, max_seqlen_q: int | None, queries_per_kv: int) -> int:
    """Q-blocks a launch's list of work items (`blocks.qblock_item`) holds per sequence:
    the longest query's (`q_blocks`) for every sequence, in order, where that list is no
    longer than the grid's bound (`q_blocks_bound`); 0, the bound's numbering, where it
    is longer (a prompt beside decodes) or the longest query is not known (compiling only).

    The bound has a spare Q-block without rows per sequence (and per ``BLOCK_M`` rows), so
    that no host read places them. One program per item, a spare ends at once; in a
    persistent launch's static shares it fills a slot, so programs get uneven numbers of
    real items. Every decode and speculative decode lists one Q-block per sequence
    (`one_q_block_per_seq`; Llama-70B's B48 decode: 384 items for 132 programs, three
    rounds, where the bound's 408 took four), and every batch of equal queries its Q-blocks
    and no spare (Qwen-7B's 40 x 512 prompts: 40 x 28, not 40 x 29)."""
    if max_seqlen_q is None:
        return 0
    per_seq = q_blocks(max_seqlen_q, queries_per_kv)
    return per_seq if num_seqs * per_seq <= q_blocks_bound(num_tokens, num_seqs, queries_per_kv) else 0


def listed_q_blocks(num_tokens: int, num_seqs: int, max_seqlen_q: int | None, queries_per_kv: int) -> int:
    """Q-blocks in a launch's list of work items: each sequence's (`listed_q_blocks_per_seq`)
    or the grid's bound (`q_blocks_bound`)."""
    per_seq = listed_q_blocks_per_seq(num_tokens, num_seqs, max_seqlen_q, queries_per_kv)
    return num_seqs * per_seq if per_seq else q_blocks_bound(num_tokens, num_seqs, queries_per_kv)


# how a kernel that walks a flat list of (Q-block, KV head) work items is launched
ONE_PER_ITEM = "one per item"
PERSISTENT = "one per SM"
REDUCE_NUM_WARPS = 1  # the split's reduction, one program per (token, query head): as the split-KV step's on sm_90


def launch_qblock(kernel, extra: dict, out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, *,
                  scale: float, sliding_window: int | None, softcap: float, tile_size: int,
                  compile_only: bool = False, items: str | None = None, max_seqlen_q: int | None = None,
                  max_seqlen_k: int | None = None, dynamic: bool | None = None, num_segments: int = 1) -> None:
    """Launch ``kernel`` with ``extra`` keywords (launch options: warps, register cap; and
    the kernel's own constexprs beyond the shared ones). Grid: (Q-blocks, KV
    heads), `q_blocks_bound` of them: surplus programs have no rows (they return, or run no
    tile). One Q-block is ``BLOCK_M = 128`` rows (`q_blocks`).

    A kernel that walks the (Q-block, KV head) pairs as a flat list of work items
    (`blocks.qblock_item`; it takes ``num_q_blocks`` and ``num_items``) gets a 1-D grid
    instead: ``items=ONE_PER_ITEM``, one program per item (the hardware hands them to SMs
    in list order as SMs free up); ``PERSISTENT``, at most one per SM, each program taking
    one item of every round of ``programs`` items (`blocks.program_item`), or, where
    `claims_items` holds (``max_seqlen_q``: the batch's longest query), claiming the next
    item of the list whenever it is ready for one (``dynamic``, as FlashAttention 3's
    persistent scheduler: static shares of items as uneven as a causal prefill's end
    unevenly), unless the batch is prompts whose static shares are even
    (`deals_static_shares`, ``max_seqlen_k``: the longest sequence); ``dynamic`` True or
    False forces it. Compiling only, a persistent launch
    compiles both binaries: the batches it will run decide between them.

    The list holds each sequence's Q-blocks in order where the longest query's Q-blocks
    for every sequence make a list no longer than the grid's bound
    (`listed_q_blocks_per_seq`: decodes, and batches of equal queries), else the bound.

    With ``num_segments`` > 1 (item kernels only) each (Q-block, KV head) pair is that many
    items, each a segment of its tiles (`blocks.segment_range`) that stores its rows
    unnormalized with their max and sum in fp32 scratch ``[tokens, query heads, segments,
    head]``; the split-KV step's reduction (`steps.parallel_tiled.reduce_segments_kernel`)
    then merges them into ``out``, one program per (token, query head). Segments are cut as
    the split-KV step's equal segments are (`steps.parallel_tiled.equal_segment_tiles`, from
    ``max_seqlen_k``; each range's own cut where the caller does not give it), so a short
    range of a ragged batch fills only its first few."""
    import torch  # lazy, as triton

    from ..steps.blocks import Geometry, launch_or_compile, per_token_args  # lazy: triton, only to launch
    from ..steps.parallel_tiled import equal_segment_tiles, reduce_segments_kernel

    if tile_size not in TILE_SIZES:
        raise ValueError(f"tile_size: expected one of {TILE_SIZES}, got {tile_size}")
    if tile_size > max_tile_size(q.shape[2]):
        raise ValueError(f"tile_size: at most {max_tile_size(q.shape[2])} with head size {q.shape[2]} "
                         f"(shared memory), got {tile_size}")
    if k_cache.stride() != v_cache.stride():  # the kernels address K and V with one set of offsets
        raise ValueError(f"v_cache: expected the strides of k_cache {tuple(k_cache.stride())}, "
                         f"got {tuple(v_cache.stride())}")
    if num_segments > 1 and items is None:
        raise ValueError("num_segments: a split needs a kernel that walks a list of work items (items=...)")
    g = Geometry.of(q, k_cache, seq_lens)
    grid = (q_blocks_bound(g.num_tokens, g.num_seqs, g.qpk), g.num_kv_heads)
    walks = [{}]
    if items is not None:
        longest_listed = None if compile_only else max_seqlen_q
        per_seq = listed_q_blocks_per_seq(g.num_tokens, g.num_seqs, longest_listed, g.qpk)
        num_q_blocks = listed_q_blocks(g.num_tokens, g.num_seqs, longest_listed, g.qpk)
        num_items = num_q_blocks * grid[1] * num_segments
        if num_segments > 1:  # the split's scratch (compiling needs its dtype, not its size)
            rows = 1 if compile_only else g.num_tokens
            segm_out = torch.empty(rows, g.num_q_heads, num_segments, g.head_pad, dtype=torch.float32,
                                   device=q.device)
            segm_max = torch.empty(rows, g.num_q_heads, num_segments, dtype=torch.float32, device=q.device)
            segm_sum = torch.empty_like(segm_max)
        else:  # never read: the kernel compiles its partial stores out
            segm_out = segm_max = segm_sum = seq_lens
        split = {"segm_out_ptr": segm_out, "segm_max_ptr": segm_max, "segm_sum_ptr": segm_sum,
                 "num_q_heads": g.num_q_heads, "NUM_SEGMENTS": num_segments, "HEAD_PAD": g.head_pad,
                 "min_segment_tiles": (1 if num_segments == 1 or max_seqlen_k is None else equal_segment_tiles(
                     num_segments, tile_size, max_seqlen_q or max_seqlen_k, max_seqlen_k, sliding_window))}
        programs = num_items if items == ONE_PER_ITEM else min(num_items, Platform.detect(q.device).num_sms)
        if items == ONE_PER_ITEM:
            claims = [False]
        elif dynamic is not None:
            claims = [dynamic]
        elif compile_only:  # the batches this binary will run decide
            claims = [False, True]
        else:
            longest_q = max_seqlen_q or 0
            claims = [claims_items(longest_q, work_items(g.num_tokens, g.num_seqs, longest_q, g.qpk, g.num_kv_heads),
                                   programs)
                      and not deals_static_shares(g.num_seqs, g.num_tokens, longest_q, max_seqlen_k or 0, g.qpk,
                                                  g.num_kv_heads, tile_size, programs)]
        # claimed items come from a counter that starts at 0 (a memset per launch); a launch
        # that does not claim, or only compiles, never reads it (the kernel does not
        # specialize on it, so any int32 tensor compiles the same binary)
        walks = [{"num_q_blocks": num_q_blocks, "num_items": num_items,
                  "q_blocks_per_seq": per_seq, "DYNAMIC": claim,
                  "item_counter_ptr": (torch.zeros(1, dtype=torch.int32, device=q.device)
                                       if claim and not compile_only else seq_lens), **split}
                 for claim in claims]
        grid = (programs,)
    for walk in walks:
        launch_or_compile(
            kernel, grid, compile_only,
            *per_token_args(g, out, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, softcap,
                            sliding_window),
            QPK=g.qpk, HEAD_SIZE=g.head_size, BLOCK_SIZE=g.block_size,
            TILE_SIZE=tile_size,
            BLOCK_M=BLOCK_M,
            USE_SOFTCAP=softcap > 0, USE_WINDOW=sliding_window is not None,
            **walk, **extra,
        )
    if num_segments > 1:
        launch_or_compile(
            reduce_segments_kernel, (g.num_tokens, g.num_q_heads), compile_only,
            out, segm_out, segm_max, segm_sum, g.num_q_heads, out.stride(0), out.stride(1),
            HEAD_SIZE=g.head_size, HEAD_PAD=g.head_pad, NUM_SEGMENTS=num_segments,
            SEGMENTS_PAD=next_power_of_2(num_segments), EQUAL_SEGMENTS=True, num_warps=REDUCE_NUM_WARPS,
        )
