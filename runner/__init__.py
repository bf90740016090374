"""attnbench.runner: recipes, vLLM server lifecycle, load generation, metrics, results.

Never imports torch, triton or vllm: the load generator runs on any client host.
"""
