"""The Gluon Q-block kernels for Hopper (`kernels/hopper/`: `qblock_wgmma`, `qblock_ws`)
against the fp32 reference, on fresh random inputs.

Gluon has no interpreter: these checks run on an sm_90 GPU only (``make test-gpu``); on the
CPU machine the kernels are compiled for sm_90 instead (tests/test_kernels_api.py). Batches
are long enough for several KV tiles per Q-block, so the first tile, the overlapped steady
state, the switch from mask-free to masked tiles and the last tile's ``P V`` all run. The
cache slots past each sequence hold NaN: the kernel must zero-fill them, not read them.
"""

from __future__ import annotations

import random

import pytest
import torch

from attnbench.kernels import PagedBatch
from kernel_checks import DEVICE, build_head_case, fresh_seed, mismatch, poisoned_like


def _on_hopper() -> bool:
    return DEVICE == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


if DEVICE == "cuda" and not _on_hopper():
    pytest.skip("the Gluon kernels run on sm_90 (Hopper) GPUs only", allow_module_level=True)

# (q heads, kv heads, head size, KV block size, dtype, extras): the head sizes it supports
HEAD_CASES = {
    "gqa4-h128-bf16-bs16": (8, 2, 128, 16, torch.bfloat16, {}),
    "mha-h128-fp16-bs32": (4, 4, 128, 32, torch.float16, {}),
    "gqa8-h64-bf16-bs48": (16, 2, 64, 48, torch.bfloat16, {}),
    "mqa-h64-fp16-bs16": (8, 1, 64, 16, torch.float16, {}),
    # groups that do not divide a Q-block's 128 rows: a token's heads straddle two Q-blocks
    # (`blocks.qblock_rows`); Falcon-7B's 71 query heads per KV head fill one over 2-3 tokens
    "qpk5-h128-bf16-bs16": (10, 2, 128, 16, torch.bfloat16, {}),
    "qpk71-h64-bf16-bs32": (71, 1, 64, 32, torch.bfloat16, {}),
    "window-gqa4-h64-bf16-bs16": (8, 2, 64, 16, torch.bfloat16, {"sliding_window": "random"}),
    "softcap-gqa2-h128-fp16-bs32": (4, 2, 128, 32, torch.float16, {"softcap": 2.0}),
    "window-softcap-mqa-h128-bf16-bs48": (4, 1, 128, 48, torch.bfloat16,
                                          {"sliding_window": "random", "softcap": 1.5}),
    # queries x16: scores spread over hundreds (base 2), so row maxima jump by more than 2^8
    # from tile to tile and a lazily kept max must move
    "sharp-gqa4-h128-bf16-bs16": (8, 2, 128, 16, torch.bfloat16, {"q_scale": 16.0}),
    # head 256 (64-key tiles only: `host.max_tile_size`), as Gemma-2 has it: GQA 2:1, the
    # logit softcap and a sliding window
    "gqa2-h256-bf16-bs16": (8, 4, 256, 16, torch.bfloat16, {}),
    "window-softcap-gqa2-h256-fp16-bs32": (4, 2, 256, 32, torch.float16, {"sliding_window": "random", "softcap": 2.0}),
    # heads of two column pieces (`qblock_ws` only, `host.head_pieces`): Phi-3's 96 as 64 + 32,
    # 192 as 128 + 64; the 32-wide piece's copies per page (pages of 16 and 32 tokens) and
    # per row (48)
    "mha-h96-bf16-bs16": (4, 4, 96, 16, torch.bfloat16, {}),
    "gqa7-h96-bf16-bs32": (14, 2, 96, 32, torch.bfloat16, {}),
    "window-gqa4-h96-fp16-bs48": (8, 2, 96, 48, torch.float16, {"sliding_window": "random"}),
    "softcap-gqa2-h192-bf16-bs32": (4, 2, 192, 32, torch.bfloat16, {"softcap": 2.0}),
    "mqa-h192-fp16-bs16": (4, 1, 192, 16, torch.float16, {}),
    # large pages (vLLM's block_size 128 and 256): a page holds several tiles, copied per row
    "gqa4-h128-bf16-bs128": (8, 2, 128, 128, torch.bfloat16, {}),
    "window-softcap-gqa2-h256-bf16-bs256": (4, 2, 256, 256, torch.bfloat16,
                                            {"sliding_window": "random", "softcap": 50.0}),
}


def tiled_cases(head_cases, kernel: str = "qblock_ws") -> list[tuple[str, int]]:
    """(head case, tile size) for each case whose head ``kernel`` takes (`host.HEAD_SIZES`;
    `qblock_ws` also takes heads of two pieces: `host.PIECEWISE_HEAD_SIZES`) and each tile
    size that fits it."""
    from attnbench.kernels.hopper import host

    heads = host.PIECEWISE_HEAD_SIZES if kernel.startswith("qblock_ws") else host.HEAD_SIZES
    return [(case, tile) for case in sorted(head_cases) if HEAD_CASES[case][2] in heads
            for tile in host.TILE_SIZES if tile <= host.max_tile_size(HEAD_CASES[case][2])]


def prefill_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Long prefills and chunks with context: many tiles, partial last pages."""
    return [(rng.randint(300, 700), 0), (rng.randint(100, 300), rng.randint(200, 600)), (rng.randint(1, 40), 0)]


def mixed_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Decodes and speculative decodes beside a chunked prefill, shuffled: the short
    queries' Q-blocks fill at most 64 rows, so `qblock_ws`'s second consumer passes their
    tiles on (`qblock_ws._pass_item`) between items it computes."""
    seqs = [(1, rng.randint(300, 600)), (1, rng.randint(1, 20)), (rng.randint(2, 8), rng.randint(10, 300)),
            (rng.randint(60, 200), rng.randint(17, 400))]
    rng.shuffle(seqs)
    return seqs


def short_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Decodes and speculative decodes of up to 16 tokens only, more of them than an H100
    has SMs at two KV heads: every query fits one Q-block (16 tokens at most at 8 query
    heads per KV head), so told the longest query, `qblock_ws` lists one Q-block per
    sequence (`host.one_q_block_per_seq`) and a persistent program walks two or three."""
    return [(rng.choice([1, 1, 2, 4, rng.randint(1, 16)]), rng.randint(1, 900)) for _ in range(rng.randint(70, 140))]


def equal_query_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Queries of one length, prompts and chunks over contexts of their own: told the
    longest query, `qblock_ws` lists each sequence's Q-blocks in order, no spare among
    them (`host.listed_q_blocks_per_seq`)."""
    query_len = rng.randint(40, 400)
    return [(query_len, rng.choice([0, rng.randint(1, 500)])) for _ in range(rng.randint(2, 6))]


COMPOSITIONS = {"prefill": prefill_seqs, "mixed": mixed_seqs, "short": short_seqs, "equal": equal_query_seqs}

# test name -> (module of kernels/hopper, launch options); ``persistent``: one program per
# SM walks the work items, so a program's rings and barriers carry on from one Q-block to
# the next; ``lazy_rescale``: row maxima that move only by more than 2^8 (the sharp head
# case moves them often, the others rarely). The producer's two ways of addressing KV
# tiles are both covered: per page where tiles are whole pages (block sizes 16 and 32),
# per row where pages straddle tiles (48). ``dynamic``: the persistent programs claim items
# from a counter as they free up, the producer posting each to the consumers
# (`qblock_ws._post_item`), on any batch (`host.launch_qblock` chooses it only for many items).
# ``num_segments``: each Q-block's tiles in that many items whose partial rows the split-KV
# step's reduction merges (`host.launch_qblock`); short ranges leave segments empty
KERNEL_RUNS = {"qblock_wgmma": ("qblock_wgmma", {}), "qblock_ws": ("qblock_ws", {}),
               "qblock_ws_pp": ("qblock_ws", {"pingpong": True}),
               "qblock_ws_persistent": ("qblock_ws", {"persistent": True}),
               "qblock_ws_lazy": ("qblock_ws", {"lazy_rescale": True}),
               "qblock_ws_lazy_persistent": ("qblock_ws", {"lazy_rescale": True, "persistent": True}),
               "qblock_ws_pp_persistent": ("qblock_ws", {"pingpong": True, "persistent": True}),
               "qblock_ws_dynamic_persistent": ("qblock_ws", {"dynamic": True, "persistent": True}),
               "qblock_ws_split4": ("qblock_ws", {"num_segments": 4}),
               "qblock_ws_split2_dynamic_persistent": ("qblock_ws", {"num_segments": 2, "dynamic": True,
                                                                     "persistent": True})}


def build_case(head_case: str, composition: str, seed: int) -> PagedBatch:
    return build_head_case(HEAD_CASES[head_case], COMPOSITIONS[composition], seed, window_range=(20, 300))


def _launch_run(kernel: str, batch: PagedBatch, tile_size: int) -> torch.Tensor:
    """``batch`` through the module and launch options of ``KERNEL_RUNS[kernel]``, into a
    NaN-poisoned output; `qblock_ws` told the batch's longest query and sequence, as the API
    tells it."""
    import importlib

    name, options = KERNEL_RUNS[kernel]
    module = importlib.import_module(f"attnbench.kernels.hopper.{name}")
    if name == "qblock_ws":
        options = {"max_seqlen_q": batch.max_seqlen_q, "max_seqlen_k": batch.max_seqlen_k, **options}
    out = poisoned_like(batch.q)
    module.launch(out, batch.q, batch.k_cache, batch.v_cache, batch.block_table, batch.cu_seqlens_q,
                  batch.seq_lens, scale=batch.head_size ** -0.5, sliding_window=batch.sliding_window,
                  softcap=batch.softcap, tile_size=tile_size, **options)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
@pytest.mark.parametrize(("kernel", "head_case", "tile_size"),
                         [(kernel, *case) for kernel in sorted(KERNEL_RUNS) for case in tiled_cases(HEAD_CASES, kernel)])
def test_hopper_kernel_matches_reference(kernel, head_case, composition, tile_size):
    """Every Hopper kernel and launch mode (`KERNEL_RUNS`)."""
    seed = fresh_seed()
    batch = build_case(head_case, composition, seed)
    problem = mismatch(_launch_run(kernel, batch, tile_size), batch.reference(), batch.dtype)
    assert problem is None, (
        f"seed={seed} seqs={[(s.query_len, s.context_len) for s in batch.seqs]} "
        f"window={batch.sliding_window} softcap={batch.softcap} {kernel} tile={tile_size}: {problem}")


def test_reference_of_a_poisoned_batch_is_finite():
    """The NaN slots lie outside every sequence: the reference never reads them (runs on
    the CPU machine too)."""
    batch = build_case("gqa4-h128-bf16-bs16", "prefill", fresh_seed())
    assert torch.isnan(batch.k_cache).any() and torch.isfinite(batch.reference()).all()


def _auto_call(batch: PagedBatch, out: torch.Tensor, v_cache: torch.Tensor | None = None, config=None):
    from attnbench.kernels import paged_attention

    return paged_attention(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache if v_cache is None else v_cache,
                           block_table=batch.block_table, cu_seqlens_q=batch.cu_seqlens_q, seq_lens=batch.seq_lens,
                           out=out, max_seqlen_q=batch.max_seqlen_q, max_seqlen_k=batch.max_seqlen_k,
                           sliding_window=batch.sliding_window, softcap=batch.softcap, config=config)


def _check_call_and_replay(batch: PagedBatch, label: str, seed: int, config=None):
    """The default call (or one with ``config``) matches the reference; captured in a CUDA
    graph and replayed, it writes the same."""
    out = poisoned_like(batch.q)
    _auto_call(batch, out, config=config)
    problem = mismatch(out, batch.reference(), batch.dtype)
    assert problem is None, f"seed={seed} {label}: {problem}"
    eager = out.clone()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _auto_call(batch, out, config=config)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("composition", sorted(COMPOSITIONS))
@pytest.mark.parametrize("head_case", ["gqa4-h128-bf16-bs16", "window-softcap-mqa-h128-bf16-bs48",
                                       "window-softcap-gqa2-h256-fp16-bs32", "window-gqa4-h96-fp16-bs48"])
def test_auto_on_hopper_matches_and_replays(head_case, composition):
    """The default call picks `qblock_ws` for prefill batches on an H100 (mixed ones of a few
    tokens per sequence the tuned tree may give Triton), runs it through `paged_attention`,
    and the result matches the reference; captured in a CUDA graph and replayed, it writes
    the same."""
    from attnbench.kernels.config import Platform
    from attnbench.kernels.dispatch.heuristics import choose_config

    seed = fresh_seed()
    batch = build_case(head_case, composition, seed)
    if composition == "prefill":
        assert choose_config(batch.shape, Platform.detect(batch.q.device)).variant == "qblock_ws"
    _check_call_and_replay(batch, f"{head_case} {composition}", seed)


def _work_items(batch: PagedBatch) -> int:
    """The length of `host.launch_qblock`'s list of (Q-block, KV head) work items for ``batch``,
    told its longest query (as `_launch_run` tells `qblock_ws`)."""
    from attnbench.kernels.hopper import host
    from attnbench.kernels.steps.blocks import Geometry

    g = Geometry.of(batch.q, batch.k_cache, batch.seq_lens)
    return host.listed_q_blocks(g.num_tokens, g.num_seqs, batch.max_seqlen_q, g.qpk) * g.num_kv_heads


def many_items_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Enough Q-blocks (of 32 tokens at 4 query heads per KV head) that a persistent launch
    deals every SM of an H100 two or three work items: a prefill, a chunk and decodes."""
    decodes = [(1, rng.randint(1, 900)) for _ in range(40)]
    return [(rng.randint(3000, 4000), 0), (rng.randint(1000, 2000), rng.randint(100, 900)), *decodes]


def many_equal_prompts(rng: random.Random) -> list[tuple[int, int]]:
    """12-16 prompts of one length of 500-900 tokens: a list of each sequence's Q-blocks
    (`host.listed_q_blocks_per_seq`), 192 items or more at 2 or 4 query heads per KV head
    (one KV head included)."""
    return [(rng.randint(500, 900), 0)] * rng.randint(12, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("compose", [many_items_seqs, many_equal_prompts], ids=["mixed", "equal"])
@pytest.mark.parametrize(("head_case", "tile_size"), tiled_cases(["gqa4-h128-bf16-bs16",
                                                                 "window-softcap-mqa-h128-bf16-bs48",
                                                                 "gqa2-h256-bf16-bs16"]))
@pytest.mark.parametrize("kernel", sorted(k for k, (_, options) in KERNEL_RUNS.items() if options.get("persistent")))
def test_persistent_runs_walk_several_items_per_program(kernel, head_case, tile_size, compose):
    """Each persistent launch mode on a batch with more work items than SMs, so that every
    program runs two or three items back to back: what it carries from one item to the
    next (ring positions, barrier phases, the Q buffer that last held O) is checked too."""
    seed = fresh_seed()
    batch = build_head_case(HEAD_CASES[head_case], compose, seed, window_range=(20, 300))
    assert _work_items(batch) > torch.cuda.get_device_properties(0).multi_processor_count
    problem = mismatch(_launch_run(kernel, batch, tile_size), batch.reference(), batch.dtype)
    assert problem is None, f"seed={seed} {kernel} {head_case} tile={tile_size}: {problem}"


@pytest.mark.gpu
@pytest.mark.parametrize("tile_size", [64, 128])
@pytest.mark.parametrize("head_case", ["gqa4-h128-bf16-bs16", "window-softcap-mqa-h128-bf16-bs48"])
def test_a_persistent_gluon_config_runs_through_the_api(head_case, tile_size):
    """A tuned tree may pick the persistent launch (`KernelConfig.persistent`): through
    `paged_attention`, on a batch with more work items than SMs, it matches the reference
    and replays in a CUDA graph."""
    from attnbench.kernels import KernelConfig

    seed = fresh_seed()
    batch = build_head_case(HEAD_CASES[head_case], many_items_seqs, seed, window_range=(20, 300))
    assert _work_items(batch) > torch.cuda.get_device_properties(0).multi_processor_count
    config = KernelConfig("qblock_ws", tile_size=tile_size, block_m=128, num_warps=12, persistent=True)
    _check_call_and_replay(batch, f"persistent {head_case} tile {tile_size}", seed, config)


@pytest.mark.gpu
def test_auto_with_a_differently_strided_v_cache_runs_the_triton_kernel():
    """The Gluon kernel addresses K and V with one set of offsets; a V cache laid out
    otherwise (here a slice of a wider tensor) makes the default call fall back to the
    Triton kernel, and the result still matches."""
    seed = fresh_seed()
    batch = build_case("gqa4-h128-bf16-bs16", "prefill", seed)
    wide = torch.full((*batch.v_cache.shape[:3], batch.head_size * 2), float("nan"), dtype=batch.dtype,
                      device=batch.v_cache.device)
    wide[..., :batch.head_size] = batch.v_cache
    v_cache = wide[..., :batch.head_size]
    assert v_cache.stride() != batch.k_cache.stride()
    out = poisoned_like(batch.q)
    _auto_call(batch, out, v_cache=v_cache)
    problem = mismatch(out, batch.reference(), batch.dtype)
    assert problem is None, f"seed={seed}: {problem}"
