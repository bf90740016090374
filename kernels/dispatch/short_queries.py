"""Many short queries on Hopper: where `auto` keeps the Triton Q-block step rather than
the Gluon kernel (decodes and speculative decodes whose 2D grid has more programs than
SMs, over short contexts), with or without a fitted tree."""

from __future__ import annotations

from ..config import SHORT_QUERY, BatchShape, Decision, Platform, next_power_of_2
from ..hopper import host as hopper
from ..variants import step
from .grid import gluon_runs, programs_2d


MANY_SHORT_QUERIES_MAX_KEYS = 4096  # longest sequence up to which many short queries keep the Triton step
WIDE_HEAD_DECODES_MAX_KEYS = 2048  # the same for decodes at a head over 128 the Triton step takes unpadded (256)
WIDE_HEAD_DECODES_MIN_PROGRAMS_PER_SM = 5  # and from as many programs per SM as its decode config keeps resident


def many_short_queries(shape: BatchShape, p: Platform) -> bool:
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
    if shape.max_seqlen_q > SHORT_QUERY or programs_2d(shape, p) <= p.num_sms:
        return False
    if (hopper.even_short_queries(shape) and not _wide_unpadded_head(shape)
            and shape.max_seqlen_k <= MANY_SHORT_QUERIES_MAX_KEYS):
        return shape.max_seqlen_q == 1 and not hopper.static_rounds_full(shape, p.num_sms)
    if shape.max_seqlen_q == 1:
        if _wide_unpadded_head(shape) and programs_2d(shape, p) < WIDE_HEAD_DECODES_MIN_PROGRAMS_PER_SM * p.num_sms:
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
    Triton step (`many_short_queries`)."""
    if shape.max_seqlen_q == 1 and _wide_unpadded_head(shape):
        return WIDE_HEAD_DECODES_MAX_KEYS
    return MANY_SHORT_QUERIES_MAX_KEYS


def _fills_one_triton_q_block(shape: BatchShape, p: Platform) -> bool:
    """Whether each sequence's query rows (query tokens times query heads per KV head) fill
    exactly one of the Triton step's Q-blocks: 4 tokens at 4 heads per KV head, 2 at 8."""
    qpk = shape.queries_per_kv
    return shape.max_seqlen_q * qpk == step("qblock").default_config(shape, p).block_m_for(qpk)


def triton_for_many_short_queries(shape: BatchShape, p: Platform) -> Decision | None:
    """The Triton step's own config where the Gluon kernel would run `many_short_queries`,
    with why; None elsewhere. Holds with or without a fitted tree."""
    if not (gluon_runs(shape, p) and many_short_queries(shape, p)):
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
                    f"the qblock step's own tree: {what} {over} in {programs_2d(shape, p)} programs "
                    f"for {p.num_sms} SMs{rounds}")
