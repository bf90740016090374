"""attnbench's kernels inside vLLM: `register` (the ``vllm.general_plugins`` entry point;
imports nothing heavy) and `backend` (the CUSTOM attention backend)."""
