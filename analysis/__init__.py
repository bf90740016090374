"""attnbench.analysis: results tree and microbenchmark CSV -> tidy tables -> figures and a report.

Never imports torch, triton or vllm.
"""
