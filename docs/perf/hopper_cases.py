"""What docs/perf's GPU scripts share: cases of llama3-8b-hopper.yaml as batches, and a
`qblock_ws`-like module's persistent launch with 128-key tiles on one of them."""
from __future__ import annotations

import click

SUITE = "recipes/microbench/llama3-8b-hopper.yaml"


def hopper_cases(names, param_hint: str) -> tuple:
    """(the suite, {name: case} for the cases named in ``names``); an unknown name is an
    error naming ``param_hint`` and the suite's cases."""
    from attnbench.kernels.bench.spec import load_microbench_spec

    suite = load_microbench_spec(SUITE)
    by_name = {c.name: c for c in suite.all_cases()}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise click.BadParameter(f"{unknown}; expected some of {sorted(by_name)}", param_hint=param_hint)
    return suite, {n: by_name[n] for n in names}


def persistent_launch(module, batch, out):
    """A no-argument call that runs ``module.launch`` on ``batch`` into ``out``: one
    program per SM, 128-key tiles."""
    def run():
        module.launch(out, batch.q, batch.k_cache, batch.v_cache, batch.block_table, batch.cu_seqlens_q,
                      batch.seq_lens, scale=batch.head_size ** -0.5, sliding_window=batch.sliding_window,
                      softcap=batch.softcap, tile_size=128, persistent=True)
    return run
