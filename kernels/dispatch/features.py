"""The host-side batch facts a fitted tree splits on: what `attnbench tune` fits on
(`bench/tune.py`) and what a fitted ``tuned_<device>.py`` reads at every call."""

from __future__ import annotations

FEATURES = ("decode_only", "max_seqlen_q", "avg_seqlen_q", "max_seqlen_k", "num_seqs",
            "queries_per_kv", "kv_programs")


def features(shape) -> dict:
    """`FEATURES` of a `config.BatchShape`; ``kv_programs``: sequences x KV heads."""
    return {
        "decode_only": int(shape.max_seqlen_q == 1),
        "max_seqlen_q": shape.max_seqlen_q,
        "avg_seqlen_q": shape.avg_seqlen_q,
        "max_seqlen_k": shape.max_seqlen_k,
        "num_seqs": shape.num_seqs,
        "queries_per_kv": shape.queries_per_kv,
        "kv_programs": shape.num_seqs * shape.num_kv_heads,
    }
