"""attnbench's kernels inside vLLM: `register` (the ``vllm.general_plugins`` entry point;
imports nothing heavy), `backend` (the CUSTOM attention backend) and `vllm_cli` (`vllm
serve` in this Python, the runner's server entry)."""
