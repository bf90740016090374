"""Column names of the microbenchmark CSV, and the names that select the kernels in vLLM:
the one place writers and readers agree on.

Importing this module loads neither torch nor triton, so the analysis layer reads it.
Times are microseconds, bandwidth GB/s (1e9 bytes/s), compute TFLOP/s (1e12 FLOP/s).
"""

from __future__ import annotations

# vLLM plugin (plugin/register, plugin/backend): `--attention-backend CUSTOM`, the step from
# this env var (set by the runner from a recipe's `serve.kernel_variant`)
VLLM_BACKEND_NAME = "CUSTOM"
VARIANT_ENV = "ATTNBENCH_VARIANT"

# the microbenchmark's implementations besides our own variants (bench/implementations.py):
# our Gluon kernels for one GPU generation (kernels/hopper; "_t64": 64-token KV tiles, else
# 128; "_pp": the consumers take turns; "_persistent": one program per SM, in static shares;
# "_lazy": lazy rescaling), then the comparators
HOPPER_KERNELS = ("qblock_wgmma", "qblock_wgmma_t64", "qblock_ws_t128", "qblock_ws_t64", "qblock_ws_pp",
                  "qblock_ws_t64_pp", "qblock_ws_t64_persistent", "qblock_ws_t64_lazy", "qblock_ws_t64_lazy_persistent",
                  "qblock_ws_persistent", "qblock_ws_pp_persistent")
COMPARATORS = ("fa3", "sdpa", "vllm_unified")

# how L2 is emptied before each timed call (bench/timing.py): do_bench's zeroing (dirty
# lines), reading the buffer (clean lines), or not at all (the call finds in L2 what the one
# before it left: its own data, where that fits); the first is the default
L2_FLUSHES = ("zero", "read", "none")

# (column, meaning)
MICROBENCH_COLUMNS: tuple[tuple[str, str], ...] = (
    ("suite", "name of the microbenchmark case list (YAML)"),
    ("case", "case name within the suite"),
    ("group", "sweep or figure a case belongs to ('' for hand-written cases)"),
    ("implementation", "what was timed: a kernel variant, 'auto', a Hopper kernel ('qblock_wgmma', ...), "
                       "or a comparator ('fa3', 'sdpa', 'vllm_unified')"),
    ("config", "launch parameters as JSON ('' when not ours)"),
    ("kernel", "what actually ran: attnbench's step, FlashAttention 3, SDPA and the backend it used, ..."),
    ("why", "'auto' only: the rule of the heuristics that chose the config, with its numbers (heuristics.decide)"),
    ("status", "ok | mismatch (wrong result, not timed) | error | unavailable | skipped"),
    ("message", "why a row is not ok"),
    ("num_seqs", "sequences in the batch"),
    ("num_tokens", "query tokens in the batch"),
    ("max_seqlen_q", "longest query"),
    ("max_seqlen_k", "longest sequence (context + query)"),
    ("sum_seq_lens", "batch size x sequence length, summed: the KV tokens of the batch"),
    ("decode_share", "fraction of sequences with query length 1"),
    ("num_q_heads", ""), ("num_kv_heads", ""), ("head_size", ""), ("block_size", "KV page size"),
    ("dtype", "bfloat16 | float16"),
    ("sliding_window", "0 when off"), ("softcap", "0 when off"),
    ("bytes", "fewest bytes the kernel must move (PagedBatch.bytes_moved)"),
    ("flops", "useful FLOPs (PagedBatch.flops)"),
    ("max_abs_err", "max |out - fp32 reference| of the checked run"),
    ("l2_flush", "how L2 was flushed before every timed call: zero (do_bench: dirty lines) | read (clean lines) | none (warm: calls back to back)"),
    ("timing_rounds", "interleaved rounds each implementation of the case was timed in (timing.rounds); "
                      "the times are its fastest round's (blank: one, before the column)"),
    ("median_us", "median of one call (do_bench's method; l2_flush says what preceded each call)"),
    ("p20_us", "20th percentile"), ("p80_us", "80th percentile"),
    ("graph_median_us", "median of CUDA/HIP-graph replays of the same call, per call (20 calls per graph with l2_flush none)"),
    ("graph_p20_us", ""), ("graph_p80_us", ""),
    ("floor_us", "roofline floor: max(bytes / copy bandwidth, FLOPs / matmul rate)"),
    ("bound", "memory | compute: which term sets the floor"),
    ("pct_roofline", "floor_us / median_us x 100"),
    ("pct_roofline_graph", "floor_us / graph_median_us x 100"),
    ("achieved_gbps", "bytes / median"),
    ("achieved_tflops", "FLOPs / median"),
    ("copy_gbps", "device-to-device copy bandwidth measured in the same run (read + write)"),
    ("matmul_tflops", "bf16 8192^3 matmul rate measured in the same run, after 1 s of matmuls (the sustained rate)"),
    ("device", "GPU name"), ("torch", "torch version"), ("triton", "triton version"),
    ("vllm", "vLLM distribution version ('' if none)"),
    ("timestamp", "UTC ISO time of the row"),
)

MICROBENCH_FIELDS: tuple[str, ...] = tuple(name for name, _ in MICROBENCH_COLUMNS)

# what a figure needs at least
MICROBENCH_REQUIRED = ("case", "group", "implementation", "status", "num_seqs", "max_seqlen_k",
                       "sum_seq_lens", "decode_share", "median_us", "floor_us")
