"""vLLM general plugin: registers attnbench's kernels as the ``CUSTOM`` attention backend.

vLLM calls `register` in every process it starts (entry point group
``vllm.general_plugins`` in pyproject.toml), so it only records a class path; the kernels
and torch load when a server picks ``--attention-backend CUSTOM`` (see `vllm_backend`).
"""

BACKEND_CLASS = "attnbench.kernels.vllm_backend.AttnbenchBackend"


def register() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
