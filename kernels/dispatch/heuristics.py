"""Kernel configuration per batch and platform, as small readable decision trees.

Each registered kernel's own tree lives beside it (``default_config`` in `steps/<step>.py`,
`hopper/qblock_ws.py`); here is the ``auto`` tree that picks the kernel. The trees start
from the paper's Listing 2 and the talk's platform table (``TILE_SIZE_PREFILL``,
``NUM_STAGES_PREFILL``, ``NUM_WARPS_DECODE_3D`` for ROCm vs CUDA) and were then tuned on an
H100 (docs/perf/). Its rules for short queries live beside it: where the KV range splits
(`split_kv`) and where many short queries keep the Triton step (`short_queries`). A tree
fitted for the current device (`trees`; one ships for the H100 SXM,
``tuned_nvidia_h100_80gb_hbm3``, fitted on recipes/microbench/llama3-8b-tune.yaml:
roofline cases and serving steps) takes precedence over the hand-written tree, corrected
where it extrapolates (`decide`); every other device runs the hand-written tree.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..config import GLUON_QBLOCK, SHORT_QUERY, BatchShape, Decision, KernelConfig, Platform
from ..hopper import host as hopper
from ..variants import AUTO, check_variant, step
from . import grid, short_queries, split_kv, trees


def _auto(shape: BatchShape, p: Platform) -> Decision:
    """2D vs 3D as in the paper, the split-k lesson and vLLM's backend; on Hopper, every
    batch the 2D grid fills goes to the warp-specialized Gluon kernel.

    Split the tiles across programs only when the 2D grid cannot fill the GPU: a batch of
    short queries (decodes, and speculative decodes of up to 16 tokens, as FA3 splits them)
    whose Q-block step would launch at most one program per SM, counted at the longest
    sequence's length where the caller knows the batch's keys (a ragged batch counts
    fewer), over at least 512 keys (`split_kv.splits`), or long ones whose Gluon work items
    would leave its static rounds less than three quarters full
    (`split_kv._split_for_waves`). (On the H100 a speculative batch of 8 sequences x 4
    queries over 16k tokens with 4 KV heads: 133 us split, 405 us not.)
    Otherwise, on an sm_90 GPU with Gluon's Hopper API and heads the Gluon kernel takes, it
    runs that kernel, ``qblock_ws`` (unless ``ATTNBENCH_GLUON=0``; not many short queries
    over short contexts, `short_queries.many_short_queries`). On the H100's training
    set (docs/perf/h100/tune-2026-11-25-reduce1.csv), best config against best config, it
    takes 0.56-0.79x the Triton step's time on prefills and chunks, 0.65-1.01x on mixed
    batches, and 0.96-1.02x on the decodes the 2D grid runs (16 to 256 sequences, 512 to
    4k keys). The held-out grid's decodes, which that set lacks, range wider: 0.51-0.71x
    the Triton step's time on ragged batches and on 4-8 query speculative decodes over
    4k-8k keys, 1.04-1.08x on uniform batches of short sequences (docs/perf/kernels-h100.md).
    The paper's steps themselves (``variant="qblock"``, Fig. 7-8) stay Triton.
    """
    if split_kv.splits(shape, p):
        return split_kv.split_decision(shape, p)
    triton_short = short_queries.triton_for_many_short_queries(shape, p)
    if triton_short is not None:
        return triton_short
    if grid.gluon_runs(shape, p):
        config = step(GLUON_QBLOCK).default_config(shape, p)
        return Decision(config, f"{shape.max_seqlen_q}-token queries that fill the 2D grid, on sm_90 with Gluon: "
                                f"{GLUON_QBLOCK}'s own tree" + _gluon_split_why(config, shape, p))
    return Decision(step("qblock").default_config(shape, p), "the qblock step's own tree")


def _gluon_split_why(config: KernelConfig, shape: BatchShape, p: Platform) -> str:
    """The Gluon kernel's split, where it splits (`hopper.split_segments`): its work items
    for the SMs."""
    if config.num_segments == 1:
        return ""
    return (f", {config.num_segments} segments per Q-block: {hopper.shape_work_items(shape)} work items "
            f"for {p.num_sms} SMs")


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


def choose_config(shape: BatchShape, platform: Platform, variant: str = AUTO) -> KernelConfig:
    """Config for ``variant`` ("auto" picks the variant too) on this batch and platform."""
    return decide(shape, platform, variant).config


def decide(shape: BatchShape, platform: Platform, variant: str = AUTO) -> Decision:
    """`choose_config`'s config and why it was chosen (the microbenchmark's ``why`` column)."""
    if check_variant(variant) != AUTO:
        return Decision(step(variant).default_config(shape, platform), f"{variant} named: its own tree")
    tuned = trees.tuned_tree(platform.device_name)
    if tuned is None:
        return _auto(shape, platform)
    if split_kv.splits(shape, platform) and (shape.max_seqlen_q > 1
                                            or split_kv.split_for_raggedness(shape, platform)
                                            or shape.max_seqlen_k > split_kv.SPLIT_SHORT_KEYS):
        # speculative decodes that cannot fill the GPU: no fitted tree has seen one (the
        # shipped tree's training set has none), and a tree extrapolates from prefills;
        # ragged decodes: a tree reads no sum of keys (its training batches are uniform);
        # decodes past 2.5k keys: a tree's splits keep 16 or 32 segments, the tune space's,
        # and on 64 pairs it ran the Gluon kernel, where `split_kv._split_segments`' 4
        # segments took 0.86-0.96x its time (rules.yaml, split-segments). The occupancy
        # rule holds whatever the tree (uniform decodes over fewer keys keep the tree's pick)
        split = split_kv.split_decision(shape, platform)
        return split._replace(why=split.why + ", whatever the fitted tree")
    triton_short = short_queries.triton_for_many_short_queries(shape, platform)
    if triton_short is not None:
        return triton_short._replace(why=triton_short.why + ", whatever the fitted tree")
    config = split_kv.segments_for_lengths(KernelConfig.of(tuned(shape, platform)), shape)
    fitted = f"the fitted tree ({trees.tree_name(platform.device_name)})"
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
        from ..hopper.qblock_ws import LONG_KEYS_FROM  # lazy: Gluon (the step has loaded it already)

        config = replace(config, tile_size=own_tiles)
        fitted += (f", {own_tiles}-key tiles: " + (f"the longest sequence has {shape.max_seqlen_k} keys"
                                                    if shape.max_seqlen_k > LONG_KEYS_FROM
                                                    else "prompts in even static shares"))
    elif (config.variant == GLUON_QBLOCK and config.tile_size > own_tiles
          and shape.sliding_window and shape.max_seqlen_q > SHORT_QUERY):
        # fitted on prompts without a window, whose Q-blocks read their whole context; a short
        # window leaves each a few tiles (`qblock_ws.short_window_q_blocks`)
        config = replace(config, tile_size=own_tiles)
        fitted += (f", {own_tiles}-key tiles: a Q-block reads at most "
                   f"{shape.q_block_keys(hopper.q_block_span(shape.queries_per_kv))} keys "
                   f"within the {shape.sliding_window}-key window")
    if config.variant == GLUON_QBLOCK and (segments := hopper.split_segments(shape, platform.num_sms)) > 1:
        # fitted on batches that fill the GPU: too few work items split each Q-block's tiles
        config = replace(config, num_segments=segments, persistent=False)
        fitted += _gluon_split_why(config, shape, platform)
    if config.variant == GLUON_QBLOCK and config.tile_size > hopper.max_tile_size(shape.head_size):
        # fitted on head 128: a head the tree never saw may not fit its tiles in shared memory
        config = replace(config, tile_size=hopper.max_tile_size(shape.head_size))
        fitted += f", {config.tile_size}-key tiles: the largest that fit head size {shape.head_size}"
    if config.variant != GLUON_QBLOCK or grid.gluon_runs(shape, platform):
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
