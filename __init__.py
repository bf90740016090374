"""attnbench: reproduce "The Anatomy of a Triton Attention Kernel" and vLLM's Triton-backend
results on your own GPUs.

One import namespace, three towers (folders of this repository, mapped in pyproject.toml):

    attnbench.kernels   kernels/    Triton paged-attention kernels, one per step of the paper;
                                    heuristics, microbenchmark, tuner, vLLM plugin (torch, triton)
    attnbench.runner    runner/     recipes, vLLM server lifecycle, load generator, metrics,
                                    results store, clusters (no torch, triton or vllm)
    attnbench.analysis  analysis/   results -> tables -> the paper's figures and a report
                                    (no torch, triton or vllm)

and at this root: `cli` (the ``attnbench`` command) and `validation` (how every tower
reports bad input).
"""
